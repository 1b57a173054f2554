"""Every row of the paper's Table 3 (model variations, EN→DE) as a named variant.

Reproduces: Vaswani et al. 2017, Table 3. Each variant is `configs/base.py` (or, for `big`,
`configs/big.py`) with the row's change, and carries the paper's figures as metadata:
`config.variant` (the name) and `config.paper` (the row's description and its position in
the table, dev perplexity, dev BLEU, parameters in millions where the paper gives them).
Table 3 is measured on newstest2013 (the TFDS validation split) with beam search and no
checkpoint averaging, so every variant evaluates its latest checkpoint alone
(`num_average = 1`).

Names, in the paper's row order: base, A1–A4 (heads, d_k = d_v), B1–B2 (d_k alone), C1–C7
(layers, width, feed-forward), D1–D4 (dropout, label smoothing), E (learned positions), big.

  python train.py --config=configs/table3.py:A1 --workdir=runs/table3/A1
  python -m transformer.research.sweep --config=configs/table3.py --variants=all --workdir=runs/table3
  python -m transformer.research.report --workdir=runs/table3

Hardware and time: the paper trained each base-sized row for 100k steps on 8 P100 GPUs
(12 hours for base) and big for 300k steps (3.5 days). This project has not measured a
Table 3 row on an accelerator yet (docs/performance.md).

To add a variant: add a `Variant` to `VARIANTS` (its name, the paper's figures if any, and
the change as a function of the config); the sweep, the report and tests/research/test_params.py
pick it up.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import ml_collections

from configs import base, big
from transformer.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Variant:
  name: str
  change: str  # the row's description, as in the paper
  ppl_dev: float | None  # the paper's figures (None where the paper gives none)
  bleu_dev: float | None
  params_m: float | None
  apply: Callable[[ml_collections.ConfigDict], None] = lambda config: None
  start: Callable[[], ml_collections.ConfigDict] = base.get_config


def _model(**changes):
  return lambda config: config.model.update(changes)


def _set(**changes):
  return lambda config: config.update(changes)


VARIANTS = (
    Variant("base", "N=6, d_model=512, d_ff=2048, h=8, d_k=d_v=64, P_drop=0.1, eps_ls=0.1, "
            "100K steps", 4.92, 25.8, 65),
    Variant("A1", "(A) h=1, d_k=d_v=512", 5.29, 24.9, None, _model(num_heads=1, d_k=512, d_v=512)),
    Variant("A2", "(A) h=4, d_k=d_v=128", 5.00, 25.5, None, _model(num_heads=4, d_k=128, d_v=128)),
    Variant("A3", "(A) h=16, d_k=d_v=32", 4.91, 25.8, None, _model(num_heads=16, d_k=32, d_v=32)),
    Variant("A4", "(A) h=32, d_k=d_v=16", 5.01, 25.4, None, _model(num_heads=32, d_k=16, d_v=16)),
    Variant("B1", "(B) d_k=16", 5.16, 25.1, 58, _model(d_k=16)),
    Variant("B2", "(B) d_k=32", 5.01, 25.4, 60, _model(d_k=32)),
    Variant("C1", "(C) N=2", 6.11, 23.7, 36, _model(num_layers=2)),
    Variant("C2", "(C) N=4", 5.19, 25.3, 50, _model(num_layers=4)),
    Variant("C3", "(C) N=8", 4.88, 25.5, 80, _model(num_layers=8)),
    Variant("C4", "(C) d_model=256, d_k=d_v=32", 5.75, 24.5, 28,
            _model(d_model=256, d_k=32, d_v=32)),
    Variant("C5", "(C) d_model=1024, d_k=d_v=128", 4.66, 26.0, 168,
            _model(d_model=1024, d_k=128, d_v=128)),
    Variant("C6", "(C) d_ff=1024", 5.12, 25.4, 53, _model(d_ff=1024)),
    Variant("C7", "(C) d_ff=4096", 4.75, 26.2, 90, _model(d_ff=4096)),
    Variant("D1", "(D) P_drop=0.0", 5.77, 24.6, None, _model(dropout_rate=0.0)),
    Variant("D2", "(D) P_drop=0.2", 4.95, 25.5, None, _model(dropout_rate=0.2)),
    Variant("D3", "(D) eps_ls=0.0", 4.67, 25.3, None, _set(label_smoothing=0.0)),
    Variant("D4", "(D) eps_ls=0.2", 5.47, 25.7, None, _set(label_smoothing=0.2)),
    Variant("E", "(E) positional embedding instead of sinusoids", 4.92, 25.7, None,
            _model(positional="learned")),
    Variant("big", "big: N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3, 300K steps", 4.33,
            26.4, 213, start=big.get_config),
)
NAMES = tuple(v.name for v in VARIANTS)


def get_config(variant: str = "base") -> ml_collections.ConfigDict:
  by_name = {v.name: v for v in VARIANTS}
  if variant not in by_name:
    raise ConfigError(f"unknown Table 3 variant {variant!r}; the variants are "
                      f"{', '.join(NAMES)}")
  row = by_name[variant]
  config = row.start()
  row.apply(config)
  config.num_average = 1  # Table 3 evaluates without checkpoint averaging
  config.variant = row.name
  config.paper = ml_collections.ConfigDict(dict(
      table="Table 3", row=NAMES.index(row.name) + 1, change=row.change,
      ppl_dev=row.ppl_dev, bleu_dev=row.bleu_dev, params_m=row.params_m))
  return config
