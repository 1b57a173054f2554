"""Whether a run can write where it is told to, asked before the work that would write there.

One check for every place a command writes: the workdir (`config_checks.check_workdir`), the
compilation cache (`compilation.use_persistent_cache`), evaluate.py's --output, and the
benchmarks' profile folder. Each caller words the failure for its own flag or config key.
"""

from __future__ import annotations

import os
import tempfile


def cannot_write(path: str, *, folder: bool = True) -> str | None:
  """None when `path` can be written, else why not, in the system's words (e.g. 'Permission
  denied', 'No such file or directory').

  Args:
    path: a folder (created if missing, with its parents), or with `folder=False` a file.
      A file's folder must exist already (it is not created); an existing file must open for
      appending (its content and time stay as they were).
    folder: whether `path` is a folder.

  Permission bits alone do not tell (a read-only file system, an ACL, root), so a folder is
  proven by creating and removing a file in it.
  """
  try:
    if not folder and os.path.exists(path):
      with open(path, "a"):
        pass
      return None
    directory = path if folder else os.path.dirname(os.path.abspath(path))
    if folder:
      os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".write_test"):
      pass
  except OSError as e:
    return str(e.strerror or e)
  return None
