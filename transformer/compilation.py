"""XLA's persistent compilation cache: a program compiled once is read back from disk.

Compilation is a large share of a short run's wall time (a program per batch shape for
training, per batch shape and beam size for decoding), and a sweep of many runs, a resumed
run or a later `evaluate.py` compile the same programs again. JAX can keep compiled programs
in a folder, keyed by the program and the compiler settings; `use_persistent_cache` turns
that on for `config.compilation_cache_dir` (default `~/.cache/transformer-xla`, shared by all
workdirs; '' turns it off). `JAX_COMPILATION_CACHE_DIR` in the environment, when set, takes
precedence (JAX reads it itself).
"""

from __future__ import annotations

import os
import tempfile

import jax
from absl import logging


def use_persistent_cache(directory: str) -> str | None:
  """Stores compiled programs in `directory` (created if needed); returns the folder in use.

  Args:
    directory: the cache folder (`~` is expanded), or '' for no cache.

  Returns:
    The folder JAX now caches in, or None when caching is off or the folder cannot be
    written (one warning; the run goes on compiling as usual).
  """
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return jax.config.jax_compilation_cache_dir
  if not directory:
    jax.config.update("jax_compilation_cache_dir", None)
    return None
  directory = os.path.abspath(os.path.expanduser(directory))
  try:
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".write_test"):
      pass
  except OSError as e:
    logging.warning("compilation cache %s cannot be written (%s): compiling without it; set "
                    "--config.compilation_cache_dir to a writable folder, or '' to silence "
                    "this", directory, e.strerror or e)
    return None
  jax.config.update("jax_compilation_cache_dir", directory)
  return directory
