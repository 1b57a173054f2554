"""One writer per data-cache entry: the processes that share a cache folder (a sweep's runs
side by side, a cluster's jobs on a shared filesystem) build each vocabulary and tokenized
split once, the others waiting for it and then reading it.

Each entry's name is a hash of what it is made from (`tokenizer.vocab_cache_path`,
`datasets.tokenized_cache_path`), and it appears complete or not at all (written under a
temporary name and renamed), so waiting is all that sharing needs. `building(path)` holds an
exclusive `flock` on `<path>.lock` while the entry is built: a second process blocks there,
says once that it waits and for what, and on getting the lock finds the entry done. The lock
file stays (empty) beside the entry; the kernel releases the lock if its holder dies, so a
crash never leaves the others waiting. Where the filesystem refuses locks, each process
builds on its own, as without sharing (same content, the last rename wins).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
from typing import Iterator

from absl import logging


@contextlib.contextmanager
def building(path: str | os.PathLike) -> Iterator[None]:
  """Around the check-and-build of the cache entry `path`: exclusive among processes."""
  lock_path = pathlib.Path(f"{path}.lock")
  lock_path.parent.mkdir(parents=True, exist_ok=True)
  with open(lock_path, "a") as lock:
    locked = _lock(lock, lock_path, path)
    try:
      yield
    finally:
      if locked:
        fcntl.flock(lock, fcntl.LOCK_UN)


def _lock(lock, lock_path: pathlib.Path, path) -> bool:
  """Takes the exclusive lock, waiting (and saying so once) while another process holds it;
  False where the filesystem has no locks."""
  try:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      logging.info("waiting for another process to build %s", path)
      fcntl.flock(lock, fcntl.LOCK_EX)
  except OSError as e:
    logging.warning("cannot lock %s (%s): building %s without waiting for other processes",
                    lock_path, e.strerror or e, path)
    return False
  return True
