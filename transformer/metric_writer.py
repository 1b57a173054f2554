"""Where training metrics go: TensorBoard event files, a JSON-lines file, console progress.

Event files are written by tensorboardX, which needs no TensorFlow (`tensorboard --logdir`
reads them). Only process 0 writes; the others are silent. `metrics.jsonl` in the workdir
holds one JSON object per logged step, with `time`: seconds since training started, summed
over resumes; on resume, lines past the restored step (from the interrupted run) are dropped
so the file reads as one uninterrupted run.
"""

from __future__ import annotations

import json
import os
import time

import jax
from absl import logging
from tensorboardX import SummaryWriter


def _format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class MetricWriter:
  """Writes scalars to TensorBoard and `metrics.jsonl`, and prints progress with an ETA."""

  def __init__(self, workdir: str, total_steps: int, start_step: int = 0):
    self.enabled = jax.process_index() == 0
    self.total_steps = total_steps
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.writer = SummaryWriter(workdir) if self.enabled else None
    self._t0, self._step0 = time.time(), start_step
    self._time_before = 0.0  # seconds the kept lines of earlier runs (before a resume) span
    if self.enabled:
      self._truncate_after(start_step)

  def _truncate_after(self, step: int) -> None:
    if not os.path.exists(self.path):
      return
    with open(self.path) as f:
      kept = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
    with open(self.path, "w") as f:
      f.writelines(kept)
    self._time_before = max((json.loads(line).get("time", 0.0) for line in kept), default=0.0)

  def write(self, step: int, scalars: dict[str, float], prefix: str = "train") -> None:
    """Logs `scalars` under `prefix/` at `step`."""
    if not self.enabled:
      return
    named = {f"{prefix}/{k}": float(v) for k, v in scalars.items()}
    for tag, value in named.items():
      self.writer.add_scalar(tag, value, step)
    elapsed = self._time_before + time.time() - self._t0
    with open(self.path, "a") as f:
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
                 100.0 * step / self.total_steps, shown, _format_duration(elapsed),
                 _format_duration(eta) if rate > 0 else "?")

  def close(self) -> None:
    if self.enabled:
      self.writer.close()
