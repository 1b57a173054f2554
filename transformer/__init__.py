"""The 2017 Transformer (Vaswani et al., "Attention Is All You Need") in JAX/Flax.

Folders by role, each importing only from those listed before it (tests/test_layers.py):

  errors.py, tokens.py, cli.py   errors, reserved token ids, what entry points share
  model/                         the Transformer and its attention
  data/                          corpora, vocabulary, batches
  decoding/                      greedy and beam search, translation of text
  run/                           config checks, the workdir's config, checkpoints, compile cache
  evaluation/                    BLEU, chrF; a trained workdir translated and scored
  export/                        a trained workdir as a CTranslate2 or Hugging Face model
  training/                      the loop, steps, loss, optimizer, parallelism, preemption
  research/                      sweeps, reports, inspection, parameter counts
"""
