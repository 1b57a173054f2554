"""`python -m benchmarks --config=configs/base.py --suite=train_step`.

Suites: train_step (jitted train step: time, tokens/s, MFU; `--profile_dir` for a trace),
input (pipeline throughput), decoding (greedy/beam speed), time_to_bleu (a real training run
to test BLEU, its wall time split into data, compilation, training and evaluation). Each
prints a table naming the device and writes its figures as JSON (`--output`, default
`benchmark_<suite>.json` in `--workdir`).
"""

from __future__ import annotations

import importlib
import json
import os

from absl import flags
from ml_collections import config_flags

from transformer import cli
from benchmarks import common

SUITES = ("train_step", "input", "decoding", "time_to_bleu")

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config (configs/*.py).")
_SUITE = flags.DEFINE_enum("suite", "train_step", SUITES, "Which benchmark to run.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/benchmark", "Folder for outputs and caches.")
_OUTPUT = flags.DEFINE_string("output", None, "JSON path (default: <workdir>/benchmark_<suite>.json).")
flags.mark_flags_as_required(["config"])


def main(argv):
  del argv
  cli.check_backend()
  suite = importlib.import_module(f"benchmarks.{_SUITE.value}")
  os.makedirs(_WORKDIR.value, exist_ok=True)
  figures = suite.run(_CONFIG.value, _WORKDIR.value)
  figures = {"suite": _SUITE.value, "device": common.device_name(), **figures}
  output = _OUTPUT.value or os.path.join(_WORKDIR.value, f"benchmark_{_SUITE.value}.json")
  with open(output, "w") as f:
    json.dump(figures, f, indent=2)
  print(f"wrote {output}")


if __name__ == "__main__":
  # Suites define their own flags at import; import them all before flags are parsed.
  for name in SUITES:
    importlib.import_module(f"benchmarks.{name}")
  cli.run(main)
