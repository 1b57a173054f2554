"""A suite run on this checkout and on another commit, taking turns: `--against=REV`.

  python -m benchmarks --config=configs/base.py --suite=train_step --against=HEAD~1
  python -m benchmarks --config=configs/tatoeba_small.py --suite=time_to_bleu \\
      --ttb_steps=300 --against=5b1d442 --against_rounds=2

The other commit is checked out into a temporary git worktree (`git worktree add --detach`;
removed at the end). Each round runs the suite once in each tree, as its own process
(`python -m benchmarks`, or `python -m transformer.benchmark` in a tree from before the
benchmarks left the package), with the same arguments, each tree importing its own code
(PYTHONPATH); the order flips every round, so both see the machine alike. Every figure the
two trees' JSON share is compared: the median over rounds of each, and this tree's over the
other's. Data that the other commit's configs look for beside their own checkout (Tatoeba in
../shared/data) is reached with `--config.data.files_dir=...`, which both trees take.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Iterator

from absl import logging

from transformer.errors import ConfigError

# The figures compared, by how their names end (anything the suites write that measures).
_MEASURES = ("seconds", "_s", "per_sec", "per_second", "mfu", "sacrebleu", "perplexity",
             "share", "gib", "ms_per_step", "ms_per_token")
_RUN_FLAGS = ("--against", "--against_rounds", "--output", "--workdir")
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout


def _git(repo: str, *args: str) -> str:
  done = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
  if done.returncode:
    raise ConfigError(f"git {' '.join(args)}: {done.stderr.strip().splitlines()[-1]}")
  return done.stdout.strip()


def _entry_point(tree: str) -> list[str]:
  """How `tree` runs its benchmarks."""
  if os.path.isfile(os.path.join(tree, "benchmarks", "__main__.py")):
    return ["-m", "benchmarks"]
  if os.path.isfile(os.path.join(tree, "transformer", "benchmark", "__main__.py")):
    return ["-m", "transformer.benchmark"]
  raise ConfigError(f"{tree} has no benchmarks (benchmarks/ or transformer/benchmark/)")


def flatten(figures, prefix: str = "") -> dict[str, float]:
  """`path -> number` of the measures in a suite's JSON (lists by index, or by their rows'
  identifying fields where they have them)."""
  out = {}
  if isinstance(figures, dict):
    for key, value in figures.items():
      out.update(flatten(value, f"{prefix}{key}/"))
  elif isinstance(figures, list):
    for i, value in enumerate(figures):
      name = str(i)
      if isinstance(value, dict):
        ident = [str(value[k]) for k in ("model", "dtype", "loss_chunk_tokens", "run",
                                         "batch_size", "output_length") if k in value]
        name = ",".join(ident) or name
      out.update(flatten(value, f"{prefix}{name}/"))
  elif isinstance(figures, (int, float)) and not isinstance(figures, bool):
    key = prefix.rstrip("/")
    if key.split("/")[-1].endswith(_MEASURES):
      out[key] = float(figures)
  return out


def _run(tree: str, argv: list[str], output: str, workdir: str) -> dict:
  args = [a for a in argv[1:] if not a.startswith(_RUN_FLAGS)]
  command = [sys.executable, *_entry_point(tree), *args, f"--output={output}",
             f"--workdir={workdir}"]
  env = dict(os.environ, PYTHONPATH=tree)
  logging.info("running in %s: %s", tree, " ".join(command[1:]))
  done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
  if done.returncode:
    raise RuntimeError(f"the suite failed in {tree} (exit {done.returncode}):\n"
                       f"{done.stderr[-3000:]}")
  with open(output) as f:
    return json.load(f)


@contextlib.contextmanager
def checked_out(rev: str, folder: str) -> Iterator[tuple[str, str]]:
  """`(tree, short commit)`: commit `rev` of this checkout in a temporary git worktree under
  `folder`, removed on leaving."""
  short = _git(HERE, "rev-parse", "--short", f"{rev}^{{commit}}")
  tree = os.path.join(folder, f"tree-{short}")
  _git(HERE, "worktree", "add", "--detach", tree, short)
  try:
    yield tree, short
  finally:
    _git(HERE, "worktree", "remove", "--force", tree)


def compare(argv: list[str], against: str, rounds: int, workdir: str) -> dict:
  """Runs the suite of `argv` (this process's command line) here and at `against`, `rounds`
  times each, taking turns; prints the figures side by side and returns them."""
  this_rev = _git(HERE, "rev-parse", "--short", "HEAD")
  dirty = bool(_git(HERE, "status", "--porcelain", "--untracked-files=no"))
  scratch = tempfile.mkdtemp(prefix="against-", dir=os.path.abspath(workdir))
  results: dict[str, list[dict]] = {"this": [], "other": []}
  with checked_out(against, scratch) as (other, other_rev):
    for r in range(rounds):
      order = [("this", HERE), ("other", other)]
      for name, tree in order if r % 2 == 0 else order[::-1]:
        out = os.path.join(scratch, f"{name}-{r}.json")
        results[name].append(_run(tree, argv, out, os.path.join(scratch, f"work-{name}")))
  this = [flatten(f) for f in results["this"]]
  them = [flatten(f) for f in results["other"]]
  shared = [k for k in this[0] if all(k in f for f in this + them)]
  rows = []
  for key in shared:
    a = statistics.median(f[key] for f in this)
    b = statistics.median(f[key] for f in them)
    rows.append({"figure": key, "this": a, "other": b, "ratio": a / b if b else None,
                 "this_runs": [f[key] for f in this], "other_runs": [f[key] for f in them]})
  device = results["this"][0].get("device", "?")
  label = f"{this_rev}{' + changes' if dirty else ''}"
  print(f"\n{device}: {label} against {other_rev}, median of {rounds} turns each")
  print(f"{'figure':<60}{label:>16}{other_rev:>12}{'ratio':>8}")
  for row in rows:
    ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "-"
    print(f"{row['figure'][:60]:<60}{row['this']:>16.4g}{row['other']:>12.4g}{ratio:>8}")
  return {"against": other_rev, "this": label, "device": device, "rounds": rounds,
          "figures": rows}
