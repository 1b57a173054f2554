"""Checkpoint averaging (paper §6.1) and the errors evaluate.py relies on."""

import jax
import numpy as np
import pytest

from transformer import checkpoint
from transformer.config_checks import ConfigError


def _write_steps(workdir, steps):
  ckpt = checkpoint.Checkpointer(str(workdir), keep=10)
  rng = np.random.default_rng(0)
  stored = {}
  for step in steps:
    params = {"dense": {"kernel": rng.normal(size=(3, 4)).astype(np.float32)},
              "bias": rng.normal(size=(4,)).astype(np.float32)}
    state = {"params": params, "step": np.int32(step)}
    ckpt.save(step, state, {"next_index": step}, {"step": step})
    stored[step] = params
  ckpt.wait()
  ckpt.close()
  return stored


def test_average_equals_numpy_mean_of_last_k(tmp_path):
  stored = _write_steps(tmp_path, [10, 20, 30, 40])
  averaged, steps = checkpoint.average_params(str(tmp_path), 3)
  assert steps == [20, 30, 40]
  expected = jax.tree.map(lambda *xs: np.mean(np.stack(xs), 0), *[stored[s] for s in steps])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), averaged, expected)


def test_average_of_one_is_the_latest(tmp_path):
  stored = _write_steps(tmp_path, [5, 6])
  latest, steps = checkpoint.average_params(str(tmp_path), 1)
  assert steps == [6]
  jax.tree.map(np.testing.assert_array_equal, latest, stored[6])


def test_more_than_present_says_how_many(tmp_path):
  _write_steps(tmp_path, [1, 2])
  with pytest.raises(ConfigError, match=r"--num_average=5 but .* holds only 2 checkpoint"):
    checkpoint.average_params(str(tmp_path), 5)


def test_no_checkpoint_names_workdir_and_command(tmp_path):
  with pytest.raises(FileNotFoundError, match=rf"no checkpoint in {tmp_path}.*python train.py"):
    checkpoint.average_params(str(tmp_path), 1)
