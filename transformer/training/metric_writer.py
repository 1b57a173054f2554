"""Where training metrics go: TensorBoard event files, a JSON-lines file, console progress.

Event files are written by tensorboardX, which needs no TensorFlow (`tensorboard --logdir`
reads them). Only process 0 writes; the others are silent. `metrics.jsonl` in the workdir
holds one JSON object per logged step, with `time`: seconds since training started, summed
over resumes; on resume, lines past the restored step (from the interrupted run) are dropped
so the file reads as one uninterrupted run. Running out of disk space or quota while writing
either is `errors.DiskFull`, one line naming the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time

import jax
import jax.numpy as jnp
from absl import logging

from transformer import errors
from transformer.data import textio
from transformer.training import losses


def format_duration(seconds: float) -> str:
  """`1h05m` from an hour on, else `4m09s`: the console's ETA and the reports' wall times."""
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


@contextlib.contextmanager
def _without_torch():
  """Imports in the block see PyTorch as not installed, unless it is loaded already.

  tensorboardX's writer imports PyTorch where it is installed, only to accept its tensors
  (about 1.5 s and 180 MB on a CPU, at every start of a run); scalars need none of it. A
  `None` in `sys.modules` makes `import torch` raise ImportError, which tensorboardX catches.
  """
  if "torch" in sys.modules:
    yield
    return
  sys.modules["torch"] = None
  try:
    yield
  finally:
    if sys.modules.get("torch", ...) is None:
      del sys.modules["torch"]


class MetricWriter:
  """Writes scalars to TensorBoard and `metrics.jsonl`, and prints progress with an ETA.

  tensorboardX writes the event files from a thread of its own, which a full disk would end
  with a traceback (and no more events). While the writer is open, its own `threading`
  hook notes such an end instead, and the next `write` or `close` raises `errors.DiskFull`.
  """

  def __init__(self, workdir: str, total_steps: int, start_step: int = 0):
    self.enabled = jax.process_index() == 0
    self.total_steps = total_steps
    self.workdir, self.path = workdir, os.path.join(workdir, "metrics.jsonl")
    self._events_full: str | None = None  # why tensorboardX's thread ended, if the disk filled
    self._hook = self._thread_ended  # one bound method, to tell whether it is still installed
    self.writer, self._closed = None, False
    if self.enabled:
      # Here, not at import, and without PyTorch: see `_without_torch`.
      with _without_torch():
        from tensorboardX import SummaryWriter
      with errors.writing("the TensorBoard events", workdir):
        self.writer = SummaryWriter(workdir)
      self._previous_hook, threading.excepthook = threading.excepthook, self._hook
    self._t0, self._step0 = time.time(), start_step
    self._time_before = 0.0  # seconds the kept lines of earlier runs (before a resume) span
    if self.enabled:
      self._truncate_after(start_step)

  def _thread_ended(self, args) -> None:
    """`threading.excepthook` while open: notes tensorboardX's thread ending for want of disk
    space; passes everything else to the hook before it."""
    reason = errors.disk_full_reason(args.exc_value)
    if reason and type(args.thread).__module__.startswith("tensorboardX"):
      self._events_full = reason
    else:
      self._previous_hook(args)

  def _check_events(self) -> None:
    if self._events_full:
      raise errors.DiskFull("the TensorBoard events", self.workdir, self._events_full)

  def _truncate_after(self, step: int) -> None:
    """Keeps the lines up to `step` (the restored checkpoint); a line cut short by a kill
    during its write is dropped with a warning."""
    if not os.path.exists(self.path):
      return
    with open(self.path, encoding="utf-8") as f:
      lines = f.read().split("\n")
    kept = []
    for number, line in enumerate(lines, start=1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError:
        logging.warning("%s:%d is not a whole JSON line (a kill during its write?): dropped",
                        self.path, number)
        continue
      if record.get("step", 0) <= step:
        kept.append(line + "\n")
    with errors.writing("the metrics log", self.path):  # the file itself stays as it was
      textio.write_text_atomically(self.path, "".join(kept))
    self._time_before = max((json.loads(line).get("time", 0.0) for line in kept), default=0.0)

  def write(self, step: int, scalars: dict[str, float], prefix: str = "train") -> None:
    """Logs `scalars` under `prefix/` at `step`."""
    if not self.enabled:
      return
    self._check_events()
    named = {f"{prefix}/{k}": float(v) for k, v in scalars.items()}
    for tag, value in named.items():
      self.writer.add_scalar(tag, value, step)
    elapsed = self._time_before + time.time() - self._t0
    # A line cut short here by a full disk is dropped when the run resumes (`_truncate_after`).
    with errors.writing("the metrics log", self.path), open(self.path, "a") as f:
      f.write(json.dumps({"step": step, "time": round(elapsed, 3), **named}) + "\n")

  def progress(self, step: int, scalars: dict[str, float]) -> None:
    """One console line: step, share done, key metrics, speed and time left."""
    if not self.enabled:
      return
    elapsed = time.time() - self._t0
    rate = (step - self._step0) / elapsed if elapsed > 0 else 0.0
    eta = (self.total_steps - step) / rate if rate > 0 else float("nan")
    shown = " ".join(f"{k} {v:.4g}" for k, v in scalars.items())
    logging.info("step %d/%d (%.1f%%) %s | elapsed %s, ETA %s", step, self.total_steps,
                 100.0 * step / self.total_steps, shown, format_duration(elapsed),
                 format_duration(eta) if rate > 0 else "?")

  def close(self) -> None:
    """Puts the `threading` hook back and closes the event file (once)."""
    if not self.enabled or self._closed:
      return
    self._closed = True
    try:
      self._check_events()
      with errors.writing("the TensorBoard events", self.workdir):
        self.writer.close()
    finally:
      if threading.excepthook is self._hook:  # else someone replaced it since: theirs stays
        threading.excepthook = self._previous_hook

  def __enter__(self) -> "MetricWriter":
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    """Closes the writer; leaving on an error, a failure to close is not raised over it."""
    if exc_type is None:
      self.close()
      return
    try:
      self.close()
    except Exception:  # the error on its way out says more
      pass


@jax.jit
def _summed(sums: dict, metrics: dict) -> dict:
  """`sums + metrics`, key by key, as one program: added apart, each metric is a program of
  its own, dispatched to every device of the step's output at every step."""
  return jax.tree.map(jnp.add, sums, metrics)


class LogWindow:
  """The training metrics of the steps since the last log line: token sums, summed scalars,
  the number of steps and the seconds they took.

  Its `state()` goes into every checkpoint, so the first line after a resume averages the
  same steps (and prints the same loss) as an uninterrupted run would.
  """

  def __init__(self, saved: dict | None = None):
    saved = saved or {}
    self.sums = {k: jnp.asarray(v, jnp.float32) for k, v in saved.get("sums", {}).items()}
    self.steps = int(saved.get("steps", 0))
    self.first_loss = saved.get("first_loss")  # the run's first logged loss
    self._start = time.time() - float(saved.get("seconds", 0.0))

  def add(self, metrics: dict) -> None:
    """Adds one step's metrics (device scalars; summed on the device, no host sync)."""
    self.sums = metrics if not self.sums else _summed(self.sums, metrics)
    self.steps += 1

  def state(self) -> dict:
    """JSON-able: exact float32 sums, steps, seconds so far, the first logged loss."""
    return {"sums": {k: float(v) for k, v in jax.device_get(self.sums).items()},
            "steps": self.steps, "seconds": time.time() - self._start,
            "first_loss": self.first_loss}

  def close(self, learning_rate: float) -> dict[str, float]:
    """The window's means and rates (see `losses.summarize`); starts a new window."""
    sums = jax.device_get(self.sums)
    seconds = max(time.time() - self._start, 1e-9)
    out = losses.summarize(sums)
    out["grad_norm"] = float(sums["grad_norm"]) / self.steps
    out["nonfinite_steps"] = float(sums["nonfinite"])
    out["learning_rate"] = learning_rate
    out["steps_per_sec"] = self.steps / seconds
    out["target_tokens_per_sec"] = float(sums["weight"]) / seconds
    if self.first_loss is None:
      self.first_loss = out["loss"]
    self.sums, self.steps, self._start = {}, 0, time.time()
    return out
