"""`python -m benchmarks --config=configs/base.py --suite=train_step`.

Suites: train_step (jitted train step: time, tokens/s, MFU; `--profile_dir` for a trace),
input (pipeline throughput), decoding (greedy/beam speed), time_to_bleu (a real training run
to test BLEU, its wall time split into data, compilation, training and evaluation), startup
(time to the first step and peak memory of a resume against a fresh start), record (a config
raced to a test BLEU against the record it means to beat, seeds taking turns), sweep (a row's
seeds side by side, compiled once against each compiling its own). Each
prints a table naming the device, writes its figures as JSON (`--output`, default
`benchmark_<suite>.json` in `--workdir`) and appends a record of each figure to
`results/<suite>.jsonl` (`transformer.records`; $TRANSFORMER_RESULTS_DIR for another
folder, `--norecords` for none), named `<suite>.<config>.<device>.<row>.<figure>`, from which
the docs' tables are generated. `--against=REV` runs the suite on this checkout and on
commit REV, taking turns, and prints every figure side by side (`benchmarks/against.py`).
"""

from __future__ import annotations

import importlib
import json
import os
import sys

from absl import flags
from ml_collections import config_flags

from transformer import cli
from transformer import records
from benchmarks import common
from benchmarks.record import config_name

SUITES = ("train_step", "input", "decoding", "time_to_bleu", "startup", "record", "sweep")

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config (configs/*.py).")
_SUITE = flags.DEFINE_enum("suite", "train_step", SUITES, "Which benchmark to run.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/benchmark", "Folder for outputs and caches.")
_OUTPUT = flags.DEFINE_string("output", None, "JSON path (default: <workdir>/benchmark_<suite>.json).")
_AGAINST = flags.DEFINE_string(
    "against", "", "A git revision (commit, tag, HEAD~1): run the suite there too, taking turns "
    "with this checkout, and print the figures side by side.")
_AGAINST_ROUNDS = flags.DEFINE_integer("against_rounds", 3, "Turns each tree takes.")
_RECORDS = flags.DEFINE_bool("records", True, "Append a record of every figure to the results "
                             "folder (results/, or $TRANSFORMER_RESULTS_DIR).")
flags.mark_flags_as_required(["config"])


def main(argv):
  del argv
  cli.check_backend()
  os.makedirs(_WORKDIR.value, exist_ok=True)
  if _AGAINST.value:
    from benchmarks import against

    # The trees' own runs are turns of a comparison, not figures of either checkout.
    os.environ[records.ENV] = os.path.abspath(os.path.join(_WORKDIR.value, "against-records"))
    figures = against.compare(sys.argv, _AGAINST.value, _AGAINST_ROUNDS.value, _WORKDIR.value)
    output = _OUTPUT.value or os.path.join(
        _WORKDIR.value, f"benchmark_{_SUITE.value}_against_{figures['against']}.json")
    with open(output, "w") as f:
      json.dump({"suite": _SUITE.value, **figures}, f, indent=2)
    print(f"wrote {output}")
    return
  suite = importlib.import_module(f"benchmarks.{_SUITE.value}")
  figures = suite.run(_CONFIG.value, _WORKDIR.value)
  figures = {"suite": _SUITE.value, "device": common.device_name(), **figures}
  output = _OUTPUT.value or os.path.join(_WORKDIR.value, f"benchmark_{_SUITE.value}.json")
  with open(output, "w") as f:
    json.dump(figures, f, indent=2)
  print(f"wrote {output}")
  if _RECORDS.value:
    suite_records = getattr(suite, "records", None)
    named = suite_records(figures) if suite_records else records.flatten(figures)
    config_file = config_flags.get_config_filename(flags.FLAGS["config"])
    written = append_records(_SUITE.value, config_file, named, figures["device"],
                             _CONFIG.value.get("seed", 0))
    print(f"appended {len(named)} records to {written}")


def append_records(suite: str, config_file: str, named: list[tuple], device: str,
                   seed: int) -> str:
  """Appends a record per `(name, figure, unit[, extra])` of `named` to the results folder's
  `<suite>.jsonl`, each named `<suite>.<config>.<device tag>.<name>`, over `extra["seeds"]`
  or the config's `seed`; returns the file."""
  prefix = f"{suite}.{config_name(config_file)}.{records.device_tag(device)}"
  command = records.command_line()
  if os.environ.get("XLA_FLAGS"):  # they change what is measured: name and command carry them
    flags_tag = os.environ["XLA_FLAGS"].strip("-").replace("=", "-").replace(" --", ".")
    prefix += f".{flags_tag}"
    command = f"XLA_FLAGS={os.environ['XLA_FLAGS']} {command}"
  made = []
  for name, figure, unit, *extra in named:
    extra = dict(extra[0]) if extra else {}
    made.append(records.make(f"{prefix}.{name}", figure, unit, device=device,
                             config=config_file, seeds=extra.pop("seeds", (seed,)),
                             command=command, **extra))
  return str(records.append(suite, made))


if __name__ == "__main__":
  # Suites define their own flags at import; import them all before flags are parsed.
  for name in SUITES:
    importlib.import_module(f"benchmarks.{name}")
  cli.run(main)
