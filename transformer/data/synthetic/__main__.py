"""`python -m transformer.data.synthetic`: the grammar, the lexicon's size and example pairs."""

from transformer.data.synthetic.corpus import describe

print(describe())
