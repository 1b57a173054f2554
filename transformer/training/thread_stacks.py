"""Where another thread of this process is: the step clock's view of the training loop.

`peer_watch`'s thread asks it of the main thread when no step has completed for too long:
whether it waits inside JAX (most likely on the devices, for another process) and the
innermost frame of the project's or the user's own code, which the one line of a stuck run
names.

Python offers one way to read another thread's stack: `sys._current_frames()`, documented
in the `sys` module ("for internal and specialized purposes") and kept by CPython since 2.5;
`faulthandler` prints stacks but returns none. This module is the one place that calls it.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading

import jax

_LIBRARY_DIRS = tuple(os.path.join(sysconfig.get_paths()[k], "")
                      for k in ("stdlib", "platstdlib", "purelib", "platlib"))
_JAX_DIR = os.path.join(os.path.dirname(os.path.dirname(jax.__file__)), "jax", "")


def _frame(thread: threading.Thread):
  return sys._current_frames().get(thread.ident)


def in_jax(thread: threading.Thread) -> bool:
  """Whether `thread` is inside a JAX call (dispatching, or waiting for a result)."""
  frame = _frame(thread)
  while frame is not None:
    if _JAX_DIR in frame.f_code.co_filename:
      return True
    frame = frame.f_back
  return False


def own_frame(thread: threading.Thread) -> str:
  """`function (file:line)` of the innermost frame of `thread` outside Python's and the
  installed libraries' files; 'a library call' when it has none."""
  frame = _frame(thread)
  while frame is not None and frame.f_code.co_filename.startswith(_LIBRARY_DIRS):
    frame = frame.f_back
  if frame is None:
    return "a library call"
  name = os.path.relpath(frame.f_code.co_filename)
  return f"{frame.f_code.co_name} ({name}:{frame.f_lineno})"
