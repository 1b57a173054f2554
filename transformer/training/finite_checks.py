"""Reading the training steps' non-finite flags on the host, one step late, and stopping
(`errors.Diverged`) where `config.on_nonfinite='stop'`."""

from __future__ import annotations

import collections

import jax

from transformer import errors
from transformer.run import checkpoint
from transformer.training import metric_writer


class FiniteChecks:
  """The non-finite flags of finished steps (`metrics['nonfinite']`), read on the host one
  step late: reading a step's flag waits for the step, and one step late the device is
  already running the next. With `stop`, a flag set raises `errors.Diverged`."""

  def __init__(self, stop: bool, ckpt: checkpoint.Checkpointer,
               writer: metric_writer.MetricWriter):
    self.stop, self.ckpt, self.writer = stop, ckpt, writer
    self.unchecked = collections.deque()  # (step, non-finite flag) not yet read on the host

  def add(self, step: int, nonfinite: jax.Array) -> None:
    """Takes the flag of `step`, just dispatched, and reads those of the steps before it."""
    self.unchecked.append((step, nonfinite))
    self.check(newest_too=False)

  def check(self, newest_too: bool) -> None:
    """Reads the flags taken, all but the newest unless `newest_too`."""
    while len(self.unchecked) > (0 if newest_too else 1):
      step, nonfinite = self.unchecked.popleft()
      if self.stop and float(nonfinite):
        self.ckpt.wait()
        self.writer.close()
        raise errors.Diverged(
            f"the training loss or gradients became NaN or infinite at step {step}; the last "
            f"checkpoint ({self.ckpt.latest_step() or 'none yet'}) is finite. Lower "
            "config.learning_rate_factor, or set config.on_nonfinite='skip' to drop such "
            "updates")
