"""What orbax reports of a failed restore or save, kept out of sight behind the one line the
caller gives (a warning naming a damaged checkpoint, `errors.DiskFull` for a full disk).

Orbax reads and writes a checkpoint's arrays concurrently in event loops of its own and, when
one array fails, abandons the others: each reports its own error later, from TensorStore's
threads or when collected. `QuietOrphanedReads` (around a restore) and `QuietFailedSave`
(around a save, from its start until its end is known) drop exactly those reports, and wait
for them to be over before putting the process's hook and filters back.
"""

from __future__ import annotations

import gc
import logging as std_logging
import os
import sys
import time
import warnings
from typing import Callable, TypeVar

from transformer import errors

T = TypeVar("T")

# How long no orphaned read must have ended before a failed restore is over (seconds), and
# the most it waits for that.
_QUIET_SECONDS, _SETTLE_SECONDS = 0.2, 30.0


class Failure:
  """A failed restore or save, kept as text: holding the exception would keep its traceback,
  and with it orbax's abandoned reads and writes, alive."""

  def __init__(self, e: Exception):
    self.reason = first_line(e)
    self.disk_full = errors.disk_full_reason(e)


class QuietOrphanedReads:
  """Around one restore of a step folder: if it fails, the tracebacks of the reads orbax
  abandoned are dropped, and everything else passes as before.

  Orbax reads a checkpoint's arrays concurrently in an event loop of its own, and closes that
  loop as soon as one read fails while the others are still under way. Those others then end
  in tracebacks on stderr: each read completing calls into the closed loop ("Event loop is
  closed", raised in TensorStore's threads), and each abandoned read's error is reported when
  its coroutine is collected (or as asyncio's "exception was never retrieved"). Pages of them
  would follow the one warning that names the damaged checkpoint. While open, this wraps
  `sys.unraisablehook` and filters the `asyncio` logger; a failed restore is reported with
  `fail(e)` inside the block, and on leaving the block the abandoned reads are collected and
  waited for (until none has ended for `_QUIET_SECONDS`) before both are put back as they
  were. The caller must hold no reference to the exception by then (`except ... as e` drops
  its own at the end of the clause).

  What is dropped is recognised by message, as neither has a type of its own: asyncio's
  plain RuntimeError "Event loop is closed", and orbax's read errors (a plain `Exception`)
  whose message names this step's folder (in the TensorStore spec it quotes).
  """

  LOGGERS = ("asyncio",)  # the loggers whose records of orphaned reads are dropped

  def __init__(self, step_directory: str):
    self.path = os.path.join(step_directory, "")
    self.failure: Failure | None = None
    self._last_orphan = 0.0
    self._hook = self._unraisable  # one bound method, to tell whether it is still installed

  def fail(self, e: Exception) -> None:
    """Records that the restore failed with `e` (as text)."""
    self.failure = Failure(e)

  def _is_orphaned_read(self, exc: BaseException | None) -> bool:
    if exc is None:
      return False
    text = str(exc)
    if (isinstance(exc, RuntimeError) and text == "Event loop is closed") or self.path in text:
      self._last_orphan = time.monotonic()
      return True
    return False

  def _unraisable(self, unraisable) -> None:
    if not self._is_orphaned_read(unraisable.exc_value):
      self._previous_hook(unraisable)

  def filter(self, record: std_logging.LogRecord) -> bool:
    """The filter of the `LOGGERS`: drops records of an orphaned read's exception."""
    return not (record.exc_info and self._is_orphaned_read(record.exc_info[1]))

  def __enter__(self) -> "QuietOrphanedReads":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()

  def start(self) -> "QuietOrphanedReads":
    """Installs the hook and the filters (what entering the block does)."""
    self._previous_hook = sys.unraisablehook
    sys.unraisablehook = self._hook
    for name in self.LOGGERS:
      std_logging.getLogger(name).addFilter(self)
    return self

  def stop(self) -> None:
    """Waits for the orphans of a failure, then puts hook and filters back (what leaving the
    block does)."""
    try:
      if self.failure is not None:
        self._settle()
    finally:
      for name in self.LOGGERS:
        std_logging.getLogger(name).removeFilter(self)
      if sys.unraisablehook is self._hook:  # else someone replaced it since: theirs stays
        sys.unraisablehook = self._previous_hook

  def _settle(self) -> None:
    """Collects the abandoned reads (their errors are reported now, not at some later
    collection) and waits until those still under way have ended. The reads orbax never
    started are coroutines, which Python warns about ("never awaited") when collected: those
    warnings are dropped too."""
    with warnings.catch_warnings():
      warnings.filterwarnings("ignore", r"coroutine .* was never awaited", RuntimeWarning)
      gc.collect()
      start = self._last_orphan = time.monotonic()
      while (time.monotonic() - self._last_orphan < _QUIET_SECONDS
             and time.monotonic() - start < _SETTLE_SECONDS):
        time.sleep(_QUIET_SECONDS / 4)
      gc.collect()


def read_quietly(step_directory: str, read: Callable[[], T]) -> tuple[T | None, Failure | None]:
  """`(read(), None)`, or `(None, why it failed)` when `read` (orbax's reading of the
  checkpoint in `step_directory`) raises, with the reads orbax abandoned kept quiet."""
  with QuietOrphanedReads(step_directory) as quiet:
    try:
      return read(), None
    except Exception as e:  # orbax, TensorStore and JSON raise many kinds
      quiet.fail(e)
  return None, quiet.failure


class QuietFailedSave(QuietOrphanedReads):
  """Around one save, from its start until its end is known (orbax writes on in its threads
  while training goes on): if the disk fills, what orbax reports of the failure is dropped,
  and the run stops with one line (`errors.DiskFull`) instead. Orbax logs the failure's
  traceback (through absl) for the write that failed, for each stage that waited on it and
  for the save, and the writes it abandoned call into its closed event loop as a failed
  restore's reads do. Only records whose error is a full disk or quota that names this
  save's folder (`<step>` or `<step>.orbax-checkpoint-tmp`) or no file at all are dropped,
  with the closed loop's; any other failure is reported as orbax reports it. The writes that
  failed or never started in orbax's stopped event loops are reported when they are
  collected ("Task exception was never retrieved", "coroutine ... was never awaited"): the
  caller lets go of the `CheckpointManager` that holds them (through the failure's
  traceback) before the block ends, so that they are collected, and quieted, inside it; or,
  where orbax still holds them while it waits for other processes, leaves the block open
  until the process ends.
  """

  LOGGERS = ("asyncio", "absl")  # orbax logs through absl

  def __init__(self, directory: str, step: int):
    super().__init__(directory)
    # This process's part of the save failed for want of space, as orbax reported it while
    # the save goes on (across processes, orbax's threads then wait for the others).
    self.seen: Failure | None = None
    self.path = os.path.join(directory, str(step))  # no separator: the temporary name too

  def _is_orphaned_read(self, exc: BaseException | None) -> bool:
    """A closed loop's error, or a full disk's that names this save's folder, or no file at
    all (orbax's small metadata files fail on close, as "[Errno 28] ..."), anywhere down its
    chain (a wait that timed out on a failed write, say)."""
    loop_closed = isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
    if loop_closed or exc is None:
      return super()._is_orphaned_read(exc)
    if errors.disk_full_reason(exc) is None:
      return False
    chain = _chain(exc)
    if any(self.path in str(e) for e in chain) or not any(_names_a_file(e) for e in chain):
      self._last_orphan = time.monotonic()
      if self.seen is None:
        self.seen = Failure(exc)
      return True
    return False


def _chain(e: BaseException) -> list[BaseException]:
  """`e` and the exceptions it was raised from or while handling."""
  chain = []
  while e is not None and all(e is not seen for seen in chain):
    chain.append(e)
    e = e.__cause__ or e.__context__
  return chain


def _names_a_file(e: BaseException) -> bool:
  return bool(getattr(e, "filename", None)) or os.sep in str(e)


def first_line(e: Exception) -> str:
  """A short reason for a log line: the first line of the message, without TensorStore's
  spec dump."""
  text = str(e).strip().split(" See full TensorStore details")[0]
  return text.splitlines()[0][:200] if text else type(e).__name__
