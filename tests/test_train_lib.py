"""The training loop: learning, resume, vocabulary reuse, and the real-data path end to end."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import support
from tests.conftest import TRAINED_STEPS
from transformer import checkpoint
from transformer import model as model_lib
from transformer import optimizer
from transformer import parallel
from transformer import tokenizer as tokenizer_lib
from transformer import train_lib


def test_tiny_model_loss_falls_over_50_steps():
  config = support.tiny_config()
  config.model.dropout_rate = 0.1
  config.learning_rate_factor = 1.0
  model = model_lib.build_model(config)
  tx = optimizer.create_optimizer(config)
  runner = parallel.create(config, devices=jax.devices()[:1])
  state = runner.init_state(lambda: train_lib.create_train_state(model, tx, jax.random.key(0)))
  step = runner.compile_train_step(train_lib.make_train_step(model, tx, config), state)
  rng = np.random.default_rng(0)
  # A learnable mapping: the target is the source reversed.
  inputs = rng.integers(3, 64, (32, 9)).astype(np.int32)
  targets = inputs[:, ::-1].copy()
  inputs[:, -1] = targets[:, -1] = 1
  batch = runner.place_batch({"inputs": inputs, "targets": targets})
  losses = []
  for _ in range(50):
    state, m = step(state, batch, jax.random.key(1))
    losses.append(float(m["loss"] / m["weight"]))
  assert int(state.step) == 50
  assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses


def test_chunked_output_layer_gives_the_dense_step():
  """config.loss_chunk_tokens changes how the loss is computed, not the update: the same
  sums and parameters after a step, and the same evaluation sums, as the dense computation."""
  config = support.tiny_config()
  model = model_lib.build_model(config)
  tx = optimizer.create_optimizer(config)
  runner = parallel.create(config, devices=jax.devices()[:1])
  state = runner.init_state(lambda: train_lib.create_train_state(model, tx, jax.random.key(0)))
  batch = runner.place_batch(support.global_batch(0))
  results = []
  for chunk_tokens in (0, 40):  # 16 rows: chunks of 2 of the 10 target positions
    config.loss_chunk_tokens = chunk_tokens
    evaluated = runner.compile_eval_step(train_lib.make_eval_step(model, config))(
        state.params, batch)
    step = runner.compile_train_step(train_lib.make_train_step(model, tx, config), state)
    new_state, metrics = step(jax.tree.map(jnp.copy, state), batch, jax.random.key(1))
    results.append(jax.device_get((new_state.params, metrics, evaluated)))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, rtol=2e-5, atol=1e-7), *results)


def test_trained_workdir_learned_checkpointed_and_logged(trained):
  _, workdir = trained
  losses = [loss for _, loss in support.logged(workdir)]
  assert losses[-1] < losses[0] - 1.0, losses
  assert sorted(os.listdir(workdir / "checkpoints")) == ["100", "200"]
  assert (workdir / "config.json").is_file()
  assert len(list((workdir / "data").glob("spm-*.model"))) == 1
  for key in ("dev/perplexity", "dev/sacrebleu", "dev/tokenized_bleu", "dev/chrf"):
    assert [s for s, _ in support.logged(workdir, key)] == [100, 200], key
  assert list(workdir.glob("events.out.tfevents.*")), "no TensorBoard event file"


def test_resume_is_bit_identical_and_reuses_the_vocabulary(trained, copy_of_trained):
  """Resuming from step 100 ends where the uninterrupted run did: same parameters, same
  logged losses, same vocabulary file (not retrained)."""
  _, straight = trained
  config, workdir = copy_of_trained
  vocab = next((workdir / "data").glob("spm-*.model"))
  mtime = vocab.stat().st_mtime_ns
  ckpt = checkpoint.Checkpointer(str(workdir))
  ckpt.manager.delete(TRAINED_STEPS)
  ckpt.close()

  train_lib.train_and_evaluate(config, str(workdir))

  assert list((workdir / "data").glob("spm-*.model")) == [vocab]
  assert vocab.stat().st_mtime_ns == mtime
  params = [checkpoint.Checkpointer(str(w)).restore_params(TRAINED_STEPS)
            for w in (straight, workdir)]
  jax.tree.map(np.testing.assert_array_equal, *params)
  assert support.logged(workdir) == support.logged(straight)


def test_resuming_with_another_vocabulary_is_an_error(copy_of_trained, tmp_path):
  config, workdir = copy_of_trained
  other = tmp_path / "other.model"
  tokenizer_lib.train_vocabulary([f"satz nummer {i} mit worten" for i in range(300)], other,
                                 vocab_size=60)
  config.data.vocab_path = str(other)
  config.num_train_steps = TRAINED_STEPS + 10
  with pytest.raises(ValueError, match="vocabulary mismatch on resume"):
    train_lib.train_and_evaluate(config, str(workdir))
