"""Start-up suite: time to the first step, and peak memory, of a resume against a fresh start.

  python -m benchmarks --config=configs/base.py --suite=startup
  # and the training code of another commit beside this checkout's, taking turns
  ... --startup_against=HEAD~1

Each run is its own process (`benchmarks/first_step.py`) that calls
`train_lib.train_and_evaluate` on random batches of `--startup_rows` × `--startup_length`
tokens and stops after its first step: a fresh start in an empty workdir, or a resume from
the checkpoint of step 1 that a first, untimed fresh run saved (it also fills the compilation
cache, so every timed run reads its programs from there). Fresh and resume take turns for
`--startup_rounds` rounds. Per run: the seconds from the call to the train state being ready
and to the first step done, and the process's peak resident memory at both points (VmHWM; on
the CPU the device memory is the host's). The batch is small so that the step's activations
do not hide the train state's share of the peak (base: 63M parameters, 0.70 GiB with Adam's
moments). Printed: the medians per kind of run and a resume's over a fresh start's.

`--startup_against=REV` runs the same processes with the `transformer` package of commit REV
(a temporary git worktree, `against.checked_out`) beside this checkout's, in the same rounds
and from the same checkpoint: the child script comes from this checkout, so REV may predate
this suite, but its code is handed this checkout's config and checkpoint and must read both.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
from typing import Callable

import jax
from absl import flags

from transformer.model import transformer as model_lib
from transformer.training import optimizer
from transformer.training import parallel
from transformer.training import steps as steps_lib
from transformer.training import train_lib
from benchmarks import against
from benchmarks import common

_ROUNDS = flags.DEFINE_integer("startup_rounds", 3, "Turns of fresh start and resume each.")
_ROWS = flags.DEFINE_integer("startup_rows", 8, "Rows of each batch (rounded up to what the "
                             "devices split).")
_LENGTH = flags.DEFINE_integer("startup_length", 32, "Source and target tokens per row.")
_AGAINST = flags.DEFINE_string(
    "startup_against", "", "A git revision whose training code runs too, taking turns with "
    "this checkout's.")

_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "first_step.py")
_GIB = 2 ** 30


def run_process(tree: str, spec: dict) -> dict:
  """Runs `first_step.py` on `spec` in a process of its own with `tree`'s training code;
  returns the figures it wrote."""
  spec_path = spec["output"] + ".spec.json"
  with open(spec_path, "w") as f:
    json.dump(spec, f)
  done = subprocess.run([sys.executable, _CHILD, spec_path], cwd=tree, capture_output=True,
                        text=True, env=dict(os.environ, PYTHONPATH=tree))
  if done.returncode:
    raise RuntimeError(f"the start-up run in {spec['workdir']} with the code of {tree} failed "
                       f"(exit {done.returncode}):\n{done.stderr[-3000:]}")
  with open(spec["output"]) as f:
    return json.load(f)


def _state_size(config) -> tuple[int, int]:
  """(parameters, bytes of the train state) of `config`, from shapes alone."""
  model, tx = model_lib.build_model(config), optimizer.create_optimizer(config)
  state = jax.eval_shape(lambda: steps_lib.create_train_state(model, tx, jax.random.key(0)))
  nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
  return model_lib.count_params(state.params), nbytes


def measure(config, workdir: str, trees: dict[str, str], rounds: int, rows: int,
            length: int, run_child: Callable[[str, dict], dict] = run_process) -> list[dict]:
  """Fresh starts and resumes with the training code of each of `trees` (name -> checkout),
  `rounds` turns each, on batches of `rows` × `length` tokens; returns one row per run.

  `run_child(tree, spec)` trains as `first_step.train_to_first_step(spec)` does, with the code
  of `tree`; by default in a process of its own.
  """
  multiple = parallel.create(config).rows_multiple
  rows = -(-rows // multiple) * multiple
  config = config.copy_and_resolve_references()
  # Far more steps than run: no run ends, saves, evaluates or translates before it stops.
  config.update(num_train_steps=1_000_000, checkpoint_every_steps=1_000_000,
                eval_every_steps=1_000_000, log_every_steps=1, bleu_every_steps=0,
                bleu_at_end=False)
  config.data.update(eval_split="", test_split="")
  saving = config.copy_and_resolve_references()
  saving.checkpoint_every_steps = 1
  paths = {}
  for name, c in (("config", config), ("saving", saving)):
    paths[name] = os.path.join(workdir, f"{name}.pkl")
    with open(paths[name], "wb") as f:
      pickle.dump(c, f)

  def spec(config_path: str, run_dir: str, output: str) -> dict:
    return {"config": config_path, "workdir": run_dir, "rows": rows, "length": length,
            "output": os.path.join(workdir, output)}

  # The checkpoint every resume starts from: step 1 of a fresh start that saves it.
  resume_dir, fresh_dir = os.path.join(workdir, "resume"), os.path.join(workdir, "fresh")
  run_child(against.HERE, spec(paths["saving"], resume_dir, "prepare.json"))
  turn = [(name, start) for name in trees for start in ("fresh", "resume")]
  runs = []
  for r in range(rounds):
    for name, start in turn if r % 2 == 0 else turn[::-1]:  # both see the machine alike
      if start == "fresh":
        shutil.rmtree(fresh_dir, ignore_errors=True)
      figures = run_child(trees[name], spec(paths["config"], fresh_dir if start == "fresh"
                                            else resume_dir, f"{name}-{start}-{r + 1}.json"))
      runs.append({"code": name, "start": start, "round": r + 1, "rows": rows,
                   "step": figures["step"], "ready_s": figures["ready_s"],
                   "first_step_s": figures["first_step_s"],
                   "peak_ready_gib": figures["peak_ready_bytes"] / _GIB,
                   "peak_gib": figures["peak_bytes"] / _GIB})
  return runs


_MEDIANS = ("ready_s", "first_step_s", "peak_ready_gib", "peak_gib")


def summarize(runs: list[dict]) -> tuple[list[dict], list[dict]]:
  """`(medians, ratios)`: the median of each figure per code and kind of start, and per code
  a resume's median over a fresh start's."""
  medians, ratios = [], []
  for code in dict.fromkeys(r["code"] for r in runs):
    by_start = {}
    for start in ("fresh", "resume"):
      mine = [r for r in runs if r["code"] == code and r["start"] == start]
      by_start[start] = {k: statistics.median(r[k] for r in mine) for k in _MEDIANS}
      medians.append({"code": code, "start": start, **by_start[start]})
    ratios.append({"code": code, **{k.rsplit("_", 1)[0]: by_start["resume"][k] /
                                    by_start["fresh"][k] for k in _MEDIANS}})
  return medians, ratios


def run(config, workdir: str) -> dict:
  """Runs the suite (see the module docstring); prints a table and returns the figures."""
  num_params, state_bytes = _state_size(config)
  root = os.path.join(workdir, "startup")
  shutil.rmtree(root, ignore_errors=True)
  os.makedirs(root)
  trees = {"this": against.HERE}
  with contextlib.ExitStack() as stack:
    if _AGAINST.value:
      tree, rev = stack.enter_context(against.checked_out(_AGAINST.value, root))
      trees[rev] = tree
    runs = measure(config, root, trees, _ROUNDS.value, _ROWS.value, _LENGTH.value)
  medians, ratios = summarize(runs)

  print(f"\nstart-up to the first step — {common.device_name()}; {num_params:,} parameters, "
        f"train state {state_bytes / _GIB:.2f} GiB; batch {runs[0]['rows']} × "
        f"{_LENGTH.value} tokens; median of {_ROUNDS.value} turns")
  print(f"{'code':<10}{'start':<16}{'state ready s':>14}{'step 1 done s':>15}"
        f"{'peak at ready GiB':>19}{'peak GiB':>10}")
  for row in medians:
    print(f"{row['code']:<10}{row['start']:<16}{row['ready_s']:>14.2f}"
          f"{row['first_step_s']:>15.2f}{row['peak_ready_gib']:>19.2f}{row['peak_gib']:>10.2f}")
  for row in ratios:
    print(f"{row['code']:<10}{'resume / fresh':<16}{row['ready']:>13.2f}×"
          f"{row['first_step']:>14.2f}×{row['peak_ready']:>18.2f}×{row['peak']:>9.2f}×")
  return {"num_params": num_params, "state_bytes": state_bytes, "rows": runs[0]["rows"],
          "length": _LENGTH.value, "rounds": _ROUNDS.value, "medians": medians,
          "resume_over_fresh": ratios, "runs": runs}
