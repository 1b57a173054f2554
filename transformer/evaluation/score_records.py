"""evaluate.py's scores of a split as records (`--record=NAME`), for the docs' tables.

  python evaluate.py --workdir=runs/seeds/base/seed0 --ensemble=runs/seeds/base/seed1 \\
      --record=tatoeba_small.400.ensemble01

appends to `results/evaluate.jsonl` one record per score, named
`evaluate.<NAME>.<device tag>.<split>.<score>` (`sacrebleu`, `chrf`, `tokenized_bleu`, and
`comet` with `--comet_model`), with
the command line, commit, date and device (`transformer.records`), the seeds of the models
that translated (the workdir's, then each ensemble member's), and in `extra` the workdirs,
the checkpoint steps and the number of sentences. A figure the docs quote from an evaluation
(an ensemble beside its members, a model before and after fine-tuning) is such a record.
"""

from __future__ import annotations

from typing import Sequence

from transformer import records
from transformer.errors import ConfigError

TOPIC = "evaluate"
SCORES = ("sacrebleu", "chrf", "tokenized_bleu", "comet")


def check_name(name: str) -> None:
  """Raises a one-line `ConfigError` for a `--record` name that would not make a record name
  (empty, or with characters other than letters, digits, `_`, `-` and `.`)."""
  allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
  if not name or set(name) - allowed or name.startswith(".") or name.endswith("."):
    raise ConfigError(f"--record={name!r}: name the figures with letters, digits, '_', '-' "
                      "and '.' (e.g. tatoeba_small.seed0)")


def _seed_of(spec: str) -> int:
  """The training seed of an ensemble member `WORKDIR` or `WORKDIR:STEP`."""
  from transformer.run import averaging
  from transformer.run import workdir as workdir_lib

  return int(workdir_lib.load_config(averaging.parse_spec(spec)[0]).seed)


def make(name: str, result: dict, config, workdir: str, ensemble: Sequence[str] = (),
         device: str | None = None) -> list[records.Record]:
  """The records of one evaluation's `result` (`evaluate_lib.evaluate_split`'s)."""
  device = device or records.device_name()
  prefix = f"{TOPIC}.{name}.{records.device_tag(device)}.{result['split']}"
  seeds = [int(config.seed), *map(_seed_of, ensemble)]
  extra = {"workdir": workdir, "ensemble": list(ensemble), "steps": result["steps"],
           "num_sentences": result["num_sentences"]}
  return [records.make(f"{prefix}.{score}", result[score]["score"], records.unit_of(score),
                       device=device, config=f"{workdir}/config.json", seeds=seeds, **extra)
          for score in SCORES if score in result]


def append(made: list[records.Record]) -> str:
  """Appends `made` to the results folder; returns the file's path."""
  return str(records.append(TOPIC, made))
