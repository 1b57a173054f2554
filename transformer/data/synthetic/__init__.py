"""The built-in synthetic language pair, so the whole pipeline runs offline in minutes.

`language.py` defines the two invented languages (lexicon, grammar, the reference
translation); `corpus.py` draws sentence pairs and writes the demo corpus that
`config.data.dataset='synthetic'` trains on. `python -m transformer.data.synthetic` prints the
grammar and a few example pairs.
"""

from transformer.data.synthetic.corpus import (MANIFEST, MAX_WORDS, MIN_WORDS, SPLITS, corpus_files,
                                          describe, generate_pairs, write_corpus)
from transformer.data.synthetic.language import LEXICON, translate

__all__ = ["LEXICON", "MANIFEST", "MAX_WORDS", "MIN_WORDS", "SPLITS", "corpus_files",
           "describe", "generate_pairs", "translate", "write_corpus"]
