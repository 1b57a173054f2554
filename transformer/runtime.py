"""Process set-up shared by the command-line entry points.

`setup_process` quiets TensorFlow (imported by tensorflow-datasets and TensorBoard for I/O
only) and keeps it off any accelerator; `run_cli` turns the errors a user can fix into one
line on stderr instead of a traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from absl import logging

from transformer.config_checks import ConfigError


def setup_process() -> None:
  """Environment for CLI processes, before TensorFlow or JAX are imported."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def run_cli(fn: Callable[[], object]) -> object:
  """Runs `fn`; a bad config, path or input exits with `error: <message>` and status 2."""
  logging.set_verbosity(logging.INFO)
  try:
    return fn()
  except (ConfigError, FileNotFoundError, UnicodeDecodeError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
