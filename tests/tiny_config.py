"""A model small enough for subprocess tests of train.py (seconds per run), on the built-in
synthetic pair: what it tests (signals, resuming) needs no real text.

  python train.py --config=tests/tiny_config.py --workdir=DIR
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from tests import support  # noqa: E402


def get_config():
  config = support.synthetic_tiny(steps=24)
  config.checkpoint_every_steps = 4
  config.keep_checkpoints = 20
  config.log_every_steps = 1
  config.eval_every_steps = 24
  # One training shape: each of the preemption test's seven processes compiles (or reads from
  # the cache) one train step, not two. Resuming across length buckets is tested in-process
  # (tests/training/test_train_lib.py).
  config.data.bucket_boundaries = (24,)
  return config
