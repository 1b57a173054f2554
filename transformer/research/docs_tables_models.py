"""The tables of docs/evaluation.md and docs/training.md that start from trained models: a sweep
row's seeds beside their ensemble, and a model before and after fine-tuning on another domain.

Drawn from the records `evaluate.py --record=NAME` appends (`evaluate.<NAME>.<device>.test.*`,
`transformer.evaluation.score_records`).
"""

from __future__ import annotations

from transformer.research.doc_blocks import Table, device, fig, text

_SEEDS = "evaluate.tatoeba_small.400.seed{seed}.cpu.test"
_ENSEMBLE = "evaluate.tatoeba_small.400.ensemble012.cpu.test"
_SOURCE_NEWS = "evaluate.tatoeba_small.400.seed0.news500.cpu.test"
_TUNED_NEWS = "evaluate.finetune.news100.seed{seed}.news500.cpu.test"
_TUNED_TATOEBA = "evaluate.finetune.news100.seed{seed}.tatoeba.cpu.test"


def _ensemble() -> Table:
  rows = [(f"seed {seed}", "1", fig(f"{_SEEDS.format(seed=seed)}.sacrebleu", unit=False),
           fig(f"{_SEEDS.format(seed=seed)}.chrf", unit=False)) for seed in (0, 1, 2)]
  rows.append(("ensemble of seeds 0, 1, 2", "3", fig(f"{_ENSEMBLE}.sacrebleu", unit=False),
               fig(f"{_ENSEMBLE}.chrf", unit=False)))
  return Table(("models", "n", "test sacreBLEU", "test chrF"), rows)


def _bleu_chrf(name: str):
  """`BLEU / chrF` of the evaluation records under `name`."""
  return text("{b} / {c}", b=fig(f"{name}.sacrebleu", unit=False),
              c=fig(f"{name}.chrf", unit=False))


def _finetune() -> Table:
  source = _SEEDS.format(seed=0)
  rows = [("Tatoeba model (seed 0, 400 steps)", "–", _bleu_chrf(source),
           _bleu_chrf(_SOURCE_NEWS), device(f"{source}.sacrebleu"))]
  for seed in (0, 1, 2):
    rows.append(("fine-tuned on newstest2013, 100 steps", str(seed),
                 _bleu_chrf(_TUNED_TATOEBA.format(seed=seed)),
                 _bleu_chrf(_TUNED_NEWS.format(seed=seed)),
                 device(f"{_TUNED_NEWS.format(seed=seed)}.sacrebleu")))
  return Table(("model", "fine-tuning seed", "Tatoeba test: sacreBLEU / chrF",
                "newstest2014, first 500: sacreBLEU / chrF", "device"), rows)


MODEL_TABLES = {"ensemble_tatoeba": _ensemble(), "finetune_news": _finetune()}
