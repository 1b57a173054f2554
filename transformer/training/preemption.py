"""Stopping between steps on SIGTERM (a scheduler's preemption notice) and SIGINT (Ctrl-C).

A signal only sets a flag: the step in flight finishes (its donated input buffers are never
touched by an exception half-way), the run's supervisor then saves a checkpoint
synchronously, flushes its logs and raises `errors.Stopped` (`Supervisor.stop_if_asked`),
which the command line turns into one line and exit status 0 (SIGTERM) or 130 (SIGINT).
Further signals while that happens are noted and ignored, so a second Ctrl-C cannot break
the save.

With several processes, a signal reaches one host first; stopping there alone would leave the
others waiting in a collective. Multi-process runs therefore use JAX's own preemption
protocol (`multihost_utils.reached_preemption_sync_point`, driven by SIGTERM through the
distributed runtime), which makes every process stop after the same step; their SIGINT is
left to the cluster's launcher.
"""

from __future__ import annotations

import signal
import threading

import jax
from absl import logging
from jax.experimental import multihost_utils

_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}
EXIT_CODES = {signal.SIGTERM: 0, signal.SIGINT: 130}


class StopRequests:
  """A context in which SIGTERM/SIGINT request a stop instead of ending the process.

  Use `stop_after(step)` once per step to learn whether to stop after it.
  """

  def __init__(self):
    self.signum: int | None = None
    self._previous: dict[int, object] = {}
    self._multiprocess = jax.process_count() > 1

  def __enter__(self) -> "StopRequests":
    # Multi-process: the distributed runtime owns SIGTERM (its preemption notifier).
    if threading.current_thread() is threading.main_thread() and not self._multiprocess:
      for signum in _NAMES:
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous.clear()

  def _handle(self, signum, frame) -> None:
    del frame
    if self.signum is None:
      self.signum = signum
      logging.warning("%s received: stopping after the step in flight, saving a checkpoint",
                      _NAMES[signum])
    else:
      logging.warning("%s received again: the checkpoint is being saved, please wait",
                      _NAMES[signum])

  def stop_after(self, step: int) -> bool:
    """Whether to save and stop after `step` (called after every step, on every process)."""
    if self._multiprocess:
      if multihost_utils.reached_preemption_sync_point(step):
        self.signum = self.signum or signal.SIGTERM
        return True
      return False
    return self.signum is not None

  @property
  def name(self) -> str:
    return _NAMES.get(self.signum, "a signal")

  @property
  def exit_code(self) -> int:
    return EXIT_CODES.get(self.signum, 0)
