"""One training process of the start-up suite (`benchmarks/startup.py`), run as a script:

  PYTHONPATH=<checkout> python benchmarks/first_step.py SPEC.json

SPEC.json names a pickled config, a workdir, the batch shape and the JSON file to write. The
process trains that config in that workdir with `train_lib.train_and_evaluate` (a fresh
start in an empty workdir, a resume in one with a checkpoint), on random token batches, and
stops when the loop asks for the batch after its first step. It writes how long after the
call the train state was ready (the first batch asked for) and the first step done, and the
process's peak resident memory (VmHWM: on the CPU, the device memory) at both points.

It imports nothing but the standard library, NumPy and the `transformer` package found on
PYTHONPATH, so it measures the training code of any checkout, one from before this suite
included. Like the entry points, it sets glibc to keep freed memory before JAX starts
(`cli.keep_freed_host_memory`); the process then holds its peak.
"""

from __future__ import annotations

import json
import pickle
import sys
import time
import types

import numpy as np


class FirstStepDone(Exception):
  """Raised by `Batches` when the loop asks for the batch after its first step."""


def peak_rss_bytes() -> int:
  """The peak resident memory of this process so far (VmHWM of /proc/self/status)."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) * 1024
  raise RuntimeError("/proc/self/status has no VmHWM line: the suite needs Linux")


class Batches:
  """Random `[rows, length]` token batches, the same for the same step; a checkpoint keeps
  the position. The first request of a process marks its state ready, the second its first
  step done (the loop has read that step's loss: `log_every_steps` is 1) and ends the run."""

  def __init__(self, rows: int, length: int, vocab_size: int):
    self.rows, self.length, self.vocab_size = rows, length, vocab_size
    self.step = 0
    self.marks: list[tuple[float, int]] = []  # (perf_counter, peak RSS) at each request

  def __next__(self) -> dict[str, np.ndarray]:
    self.marks.append((time.perf_counter(), peak_rss_bytes()))
    if len(self.marks) == 2:
      raise FirstStepDone
    rng = np.random.default_rng(self.step)
    tokens = rng.integers(3, self.vocab_size, (2, self.rows, self.length)).astype(np.int32)
    tokens[:, :, -1] = 1  # EOS
    self.step += 1
    return {"inputs": tokens[0], "targets": tokens[1]}

  def get_state(self) -> dict:
    return {"next_index": self.step}

  def set_state(self, state: dict) -> None:
    self.step = int(state["next_index"])


def train_to_first_step(spec: dict) -> dict:
  """Trains `spec['config']` (a pickled config) in `spec['workdir']` until its first step is
  done; returns the seconds and peak memory at the state ready and at the first step done."""
  from transformer.training import train_lib

  with open(spec["config"], "rb") as f:
    config = pickle.load(f)
  batches = Batches(spec["rows"], spec["length"], config.model.vocab_size)
  data = types.SimpleNamespace(tokenizer=None, train=batches, eval_batches=None, splits={})
  start = time.perf_counter()
  try:
    train_lib.train_and_evaluate(config, spec["workdir"], data=data,
                                 allow_config_changes=True)
  except FirstStepDone:
    pass
  else:
    raise RuntimeError(f"training in {spec['workdir']} ended before its second batch was "
                       "asked for; give the config more num_train_steps")
  (ready, ready_peak), (done, peak) = batches.marks
  return {"ready_s": ready - start, "first_step_s": done - start,
          "peak_ready_bytes": ready_peak, "peak_bytes": peak, "step": batches.step}


def main(spec_path: str) -> None:
  with open(spec_path) as f:
    spec = json.load(f)
  from transformer import cli

  cli.keep_freed_host_memory()  # before JAX starts its CPU backend, as the entry points do
  figures = train_to_first_step(spec)
  with open(spec["output"], "w") as f:
    json.dump(figures, f)


if __name__ == "__main__":
  main(sys.argv[1])
