"""The project's exceptions for what a user can fix or should know. Imports only the
standard library, so any module (text I/O, scoring, the CLIs) can raise them without loading
JAX."""

from __future__ import annotations

import contextlib
import errno
import os
from typing import Callable, Iterator

# What a full disk or an exhausted quota says: the errno of an OSError, and the same in the
# text of errors raised without one (TensorStore, which orbax writes checkpoints through,
# raises ValueError("RESOURCE_EXHAUSTED: ... No space left on device [os_error_code='28']")).
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXTS = tuple(os.strerror(code) for code in _DISK_FULL_ERRNOS)


class ConfigError(ValueError):
  """A config value, path or input that cannot be used; the message is one line that names
  the key (or file, line) and what to do. The command-line tools print it without a
  traceback and exit with status 2."""


class Stopped(Exception):
  """Training stopped on a signal after saving a checkpoint; the message says which step was
  saved. `exit_code` is what the command exits with: 0 for SIGTERM (a scheduler's preemption
  notice: the job did what it should), 130 for SIGINT (Ctrl-C, as shells report it)."""

  def __init__(self, message: str, exit_code: int):
    super().__init__(message)
    self.exit_code = exit_code


class Diverged(Exception):
  """The training loss or gradients became NaN or infinite; the message names the step and
  the last checkpoint, which is always finite."""


class FailedAlone(Exception):
  """This process of a multi-process run failed on its own and has told the others, which
  stop too; raised from its failure (`__cause__`) by the run's supervisor
  (`training.supervision`).

  Attributes:
    line: what the process ends with unless its failure is a user's error with a line of
      its own: `process 1 of 2 failed: <the failure>; every process of the run stops; <where
      the next run resumes>`.
    leave: `leave(status)` ends the process with `status` at once, past JAX's shutdown
      barrier, which would wait minutes for the processes already gone and then abort.
  """

  def __init__(self, line: str, leave: Callable[[int], None]):
    super().__init__(line)
    self.line, self.leave = line, leave


def disk_full_reason(e: BaseException | None) -> str | None:
  """'No space left on device' or 'Disk quota exceeded' when `e`, or an exception it was
  raised from or while handling, failed for want of disk space; else None."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in _DISK_FULL_ERRNOS:
      return os.strerror(e.errno)
    text = str(e)
    for reason in _DISK_FULL_TEXTS:
      if reason in text:
        return reason
    e = e.__cause__ or e.__context__
  return None


class DiskFull(Exception):
  """The disk, or the user's quota, filled up while the run wrote `what` at `path`. The
  message is one line: what was written where, what the next run starts from (`next_run`,
  filled in by whoever knows it: `train_lib` names the checkpoint training resumes from), and
  what to do. The command-line tools print it without a traceback and exit with status 2."""

  def __init__(self, what: str, path: str | os.PathLike, reason: str, next_run: str = ""):
    super().__init__(what, str(path), reason, next_run)
    self.what, self.path, self.reason, self.next_run = what, str(path), reason, next_run

  def __str__(self) -> str:
    next_run = f"; {self.next_run}" if self.next_run else ""
    return (f"{self.reason} while writing {self.what} to {self.path}{next_run}; make room "
            "there (or point the run at another disk) and run the same command again")


@contextlib.contextmanager
def writing(what: str, path: str | os.PathLike) -> Iterator[None]:
  """Around a write of `what` to `path`: running out of disk space or quota there becomes
  `DiskFull(what, path, ...)`, one line; every other error passes as it is."""
  try:
    yield
  except DiskFull:
    raise
  except Exception as e:
    reason = disk_full_reason(e)
    if reason is None:
      raise
    raise DiskFull(what, path, reason) from None
