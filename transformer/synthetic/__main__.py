"""`python -m transformer.synthetic`: the grammar, the lexicon's size and example pairs."""

from transformer.synthetic.corpus import describe

print(describe())
