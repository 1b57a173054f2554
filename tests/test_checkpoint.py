"""Checkpoints: an exact round trip, averaging (paper §6.1), and the errors evaluate.py
relies on."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import support
from transformer import checkpoint
from transformer import model as model_lib
from transformer import optimizer
from transformer import train_lib
from transformer.errors import ConfigError


def test_save_restore_is_exact(tmp_path):
  config = support.tiny_config()
  model = model_lib.build_model(config)
  tx = optimizer.create_optimizer(config)
  state = jax.jit(lambda: train_lib.create_train_state(model, tx, jax.random.key(3)))()
  state = state.replace(step=jnp.array(7, jnp.int32))
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=2)
  ckpt.save(7, state, {"next_index": 7}, {"vocab": {"path": "v", "sha256": "x"}})
  ckpt.wait()
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
  restored, data_state, meta = ckpt.restore(7, abstract)
  ckpt.close()
  jax.tree.map(np.testing.assert_array_equal, restored, state)
  assert data_state == {"next_index": 7} and meta["vocab"]["sha256"] == "x"


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
  assert list(tmp_path.iterdir()) == []  # nothing written into a workdir it only reads


def test_saved_steps_lists_complete_checkpoints_only(tmp_path):
  assert checkpoint.saved_steps(tmp_path) == []
  for name in ("200", "100", "300.orbax-checkpoint-tmp-1700000000"):
    (tmp_path / "checkpoints" / name).mkdir(parents=True)
  assert checkpoint.saved_steps(tmp_path) == [100, 200]
