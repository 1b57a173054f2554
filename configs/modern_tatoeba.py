"""The rows of configs/modern.py at the shape of configs/tatoeba_small.py: a CPU-sized sweep.

Each row is configs/tatoeba_small.py (2+2 layers, d_model 256, 4 heads, the Tatoeba
German-English pairs, English→German) with the row's change; `gqa` keeps 2 key/value heads
of 4. docs/research.md has every row measured on 2 CPU cores, 3 seeds each, against `base`
with paired significance tests:

  python -m transformer.research.sweep --config=configs/modern_tatoeba.py --variants=all \\
      --seeds=0,1,2 --workdir=runs/modern_tatoeba
  python -m transformer.research.report --workdir=runs/modern_tatoeba --baseline=base
"""

import ml_collections

from configs import modern, tatoeba_small

NAMES = modern.NAMES


# Henry et al.'s L for qk_norm_l2: the 97.5th percentile of the training sentences' lengths,
# English and German, in tokens of an 8k BPE vocabulary trained on them, EOS included.
TATOEBA_QK_NORM_LENGTH = 27


def get_config(variant: str = "base") -> ml_collections.ConfigDict:
  config = modern.get_config(variant, start=tatoeba_small.get_config)
  if config.model.qk_norm == "l2":
    config.model.qk_norm_length = TATOEBA_QK_NORM_LENGTH
  return config
