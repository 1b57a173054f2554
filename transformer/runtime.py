"""Process set-up shared by the command-line entry points.

`main` runs an absl program with TensorFlow quieted (tensorflow-datasets and TensorBoard
import it for I/O only) and glibc keeping freed memory when the CPU computes
(`host_allocator`), and turns the errors a user can fix (a bad `--config.` override, a bad
config value, path or input) into one line on stderr and exit status 2, not a traceback.
"""

from __future__ import annotations

import logging as pylogging
import os
import sys
from typing import Callable

from absl import app, flags, logging

from transformer import host_allocator
from transformer.config_checks import ConfigError

USER_ERRORS = (ConfigError, FileNotFoundError)
_PROJECT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _OwnInfoOnly(pylogging.Filter):
  """Keeps INFO lines from this project's files; libraries (orbax logs every save step by
  step at INFO) still get through at WARNING and above."""

  def filter(self, record: pylogging.LogRecord) -> bool:
    return (record.levelno >= pylogging.WARNING
            or record.pathname.startswith(_PROJECT_DIR) and "site-packages" not in record.pathname)


def _fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except (KeyError, AttributeError) as e:
    # ml_collections raises these for an override of a key the config does not have.
    bad = [a.split("=")[0] for a in argv[1:] if a.startswith("--config.")]
    _fail(f"unknown config key in {', '.join(bad) or argv[1:]}: {e}; "
          "see the config file for the keys it defines")
  except flags.Error as e:
    _fail(str(e))


def main(fn: Callable[[list[str]], object]) -> None:
  """`app.run(fn)` with quiet TensorFlow, one-line errors for user mistakes, and on the CPU
  freed memory kept for the next step (`host_allocator`; before JAX starts a backend)."""
  host_allocator.keep_freed_memory()
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # TensorFlow does no maths here

  def wrapped(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.set_verbosity(logging.INFO)
    logging.get_absl_handler().addFilter(_OwnInfoOnly())
    try:
      return fn(argv)
    except USER_ERRORS as e:
      _fail(str(e))

  app.run(wrapped, flags_parser=_parse_flags)
