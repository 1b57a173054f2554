"""Sweep suite: a row's seeds side by side, compiled once against each compiling its own.

  python -m benchmarks --config=configs/tatoeba_small.py --suite=sweep

Runs `python -m transformer.research.sweep` on the config's file with `--seeds` set to
`--sweep_seeds` and `--parallel` to their number: once with `--compile_once` (the sweep's
default: the other seeds wait for the first run to compile, then read its programs from the
compilation cache) and once with `--nocompile_once` (every run compiles beside the others),
taking turns for `--sweep_rounds` rounds. Each sweep trains `--sweep_steps` steps a run with
no test BLEU at the end, in a sweep root and an empty compilation cache of its own. Per sweep:
its wall time, the CPU seconds of all its processes, and each run's compile of its training
and dev programs as train.py logs it. Printed: the medians of each mode and their ratios.

Measured on the CPU only. On a GPU the runs share it, each held to its part of the memory by
the sweep, while this process's device check has started JAX there too: set
XLA_PYTHON_CLIENT_PREALLOCATE=false so that it holds no memory beside them (not run so).
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time

from absl import flags
from ml_collections import config_flags

from transformer.errors import ConfigError
from transformer.run import compilation

_SEEDS = flags.DEFINE_string("sweep_seeds", "0,1", "The seeds of the row, all at once.")
_STEPS = flags.DEFINE_integer("sweep_steps", 100, "Training steps of each run.")
_ROUNDS = flags.DEFINE_integer("sweep_rounds", 1, "Turns each mode takes.")
_VARIANTS = flags.DEFINE_string("sweep_variants", "all", "The sweep's --variants.")

MODES = ("compile_once", "nocompile_once")
_COMPILED = re.compile(rf"compiled (\d+) {re.escape(compilation.COMPILED_AHEAD)} in ([\d.]+) s")


def _cpu_seconds_of_children() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def compiles(root: str) -> list[tuple[int, float]]:
  """(programs, seconds) of each run's compile of its training and dev programs, from the
  train.log files below a sweep root, in folder order."""
  found = []
  for folder, _, files in sorted(os.walk(root)):
    if "train.log" in files:
      with open(os.path.join(folder, "train.log"), encoding="utf-8", errors="replace") as f:
        found += [(int(m[1]), float(m[2])) for m in _COMPILED.finditer(f.read())]
  return found


def sweep_once(config_file: str, root: str, mode: str) -> dict:
  """One sweep in `root` (emptied first) with an empty compilation cache; its figures.

  Raises:
    ConfigError: the sweep failed (the end of its output in the message).
  """
  shutil.rmtree(root, ignore_errors=True)
  seeds = _SEEDS.value.split(",")
  argv = [sys.executable, "-m", "transformer.research.sweep", f"--config={config_file}",
          f"--variants={_VARIANTS.value}", f"--workdir={root}", f"--seeds={_SEEDS.value}",
          f"--parallel={len(seeds)}", f"--{mode}", f"--set=num_train_steps={_STEPS.value}",
          "--set=bleu_at_end=False",
          f"--set=compilation_cache_dir={os.path.join(root, 'compilation_cache')}"]
  cpu, start = _cpu_seconds_of_children(), time.monotonic()
  done = subprocess.run(argv, capture_output=True, text=True)
  wall, cpu = time.monotonic() - start, _cpu_seconds_of_children() - cpu
  if done.returncode:
    raise ConfigError(f"{' '.join(argv)} failed (exit {done.returncode}):\n"
                      f"{done.stderr[-3000:]}")
  return {"mode": mode, "wall_s": wall, "cpu_s": cpu,
          "compile_s": [seconds for _, seconds in compiles(root)]}


def summary(sweeps: list[dict]) -> dict:
  """Each mode's medians (wall, CPU, summed compile seconds) and compile_once's ratios to
  nocompile_once."""
  out = {}
  for mode in MODES:
    mine = [s for s in sweeps if s["mode"] == mode]
    out[mode] = {"wall_s": statistics.median(s["wall_s"] for s in mine),
                 "cpu_s": statistics.median(s["cpu_s"] for s in mine),
                 "compile_s": statistics.median(sum(s["compile_s"]) for s in mine)}
  for key in ("wall_s", "cpu_s", "compile_s"):
    out[f"ratio_{key}"] = out["compile_once"][key] / out["nocompile_once"][key]
  return out


def run(config, workdir: str) -> dict:
  del config  # the sweep reads the file
  config_file = config_flags.get_config_filename(flags.FLAGS["config"])
  sweeps = []
  for r in range(_ROUNDS.value):
    for mode in MODES if r % 2 == 0 else MODES[::-1]:
      sweeps.append(sweep_once(config_file, os.path.join(workdir, f"sweep_{mode}"), mode))
      s = sweeps[-1]
      print(f"round {r + 1} {mode}: {s['wall_s']:.1f} s, {s['cpu_s']:.1f} CPU s, compiles "
            f"{', '.join(f'{c:.1f}' for c in s['compile_s'])} s", flush=True)
  figures = summary(sweeps)
  print(f"\n{'mode':<16}{'wall s':>10}{'CPU s':>10}{'compile s':>11}")
  for mode in MODES:
    m = figures[mode]
    print(f"{mode:<16}{m['wall_s']:>10.1f}{m['cpu_s']:>10.1f}{m['compile_s']:>11.1f}")
  print(f"{'ratio':<16}{figures['ratio_wall_s']:>10.2f}{figures['ratio_cpu_s']:>10.2f}"
        f"{figures['ratio_compile_s']:>11.2f}")
  return {"config": config_file, "seeds": _SEEDS.value, "steps": _STEPS.value,
          "sweeps": sweeps, **figures}
