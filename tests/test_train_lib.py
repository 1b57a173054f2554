"""The training loop: learning, checkpoints, resume, and the real-data path end to end."""

import json
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import base, tatoeba_small
from transformer import checkpoint
from transformer import evaluate_lib
from transformer import model as model_lib
from transformer import optimizer
from transformer import parallel
from transformer import train_lib

TINY_MODEL = dict(vocab_size=64, d_model=32, d_ff=64, num_heads=4, d_k=8, d_v=8,
                  num_layers=1, dropout_rate=0.1, max_len=64)


def _tiny_config() -> ml_collections.ConfigDict:
  config = base.get_config()
  config.model.update(TINY_MODEL)
  config.warmup_steps = 10
  config.learning_rate_factor = 1.0
  return config


def test_tiny_model_loss_falls_over_50_steps():
  config = _tiny_config()
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


def test_checkpoint_save_restore_is_exact(tmp_path):
  config = _tiny_config()
  model = model_lib.build_model(config)
  tx = optimizer.create_optimizer(config)
  state = train_lib.create_train_state(model, tx, jax.random.key(3))
  state = state.replace(step=jnp.array(7, jnp.int32))
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=2)
  ckpt.save(7, state, {"next_index": 7}, {"vocab": {"path": "v", "sha256": "x"}})
  ckpt.wait()
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
  restored, data_state, meta = ckpt.restore(7, abstract)
  ckpt.close()
  jax.tree.map(np.testing.assert_array_equal, restored, state)
  assert data_state == {"next_index": 7} and meta["vocab"]["sha256"] == "x"


def _tatoeba_tiny(shared_data: pathlib.Path, steps: int) -> ml_collections.ConfigDict:
  """tatoeba_small shrunk so a few hundred steps take seconds on 2 cores."""
  config = tatoeba_small.get_config()
  config.model.update(vocab_size=1000, d_model=64, d_ff=128, num_heads=4, d_k=16, d_v=16,
                      num_layers=1)
  config.data.files_dir = str(shared_data / "tatoeba-deu-eng")
  config.data.tokens_per_batch = 512
  config.data.max_source_len = config.data.max_target_len = 24
  config.data.bucket_boundaries = (12, 24)  # two compiled shapes
  config.data.vocab_sample_sentences = 4000
  config.num_train_steps = steps
  config.checkpoint_every_steps = steps
  config.eval_every_steps = steps
  config.num_eval_batches = 2
  config.log_every_steps = 25
  config.warmup_steps = 50
  config.bleu_at_end = False
  return config


def _logged(workdir, key="train/loss"):
  lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return [(r["step"], r[key]) for r in map(json.loads, lines) if key in r]


def test_tatoeba_trains_checkpoints_and_reuses_vocabulary(shared_data, tmp_path):
  config = _tatoeba_tiny(shared_data, steps=200)
  train_lib.train_and_evaluate(config, str(tmp_path))
  losses = [loss for _, loss in _logged(tmp_path)]
  assert losses[-1] < losses[0] - 1.0, losses
  assert (tmp_path / "checkpoints" / "200").is_dir()
  assert (tmp_path / "config.json").is_file()
  vocab = list((tmp_path / "data").glob("spm-*.model"))
  assert len(vocab) == 1
  mtime = vocab[0].stat().st_mtime_ns

  config.num_train_steps = 225
  train_lib.train_and_evaluate(config, str(tmp_path))
  assert list((tmp_path / "data").glob("spm-*.model")) == vocab
  assert vocab[0].stat().st_mtime_ns == mtime  # reused, not retrained
  steps = [s for s, _ in _logged(tmp_path)]
  assert steps == sorted(set(steps)) and steps[-1] == 225 and 200 in steps

  # evaluate.py's file mode on the trained workdir: one line out per line in, empty kept.
  source = tmp_path / "in.en"
  source.write_text("I like tea.\n\nWhere is the station?\n", encoding="utf-8")
  output = tmp_path / "out.de"
  hypotheses = evaluate_lib.translate_file(config, str(tmp_path), str(source), str(output), 1)
  lines = output.read_text(encoding="utf-8").split("\n")
  assert lines[-1] == "" and lines[:-1] == hypotheses
  assert len(hypotheses) == 3 and hypotheses[1] == "" and hypotheses[0] and hypotheses[2]


def test_resumed_run_is_bit_identical_to_uninterrupted(shared_data, tmp_path):
  config = _tatoeba_tiny(shared_data, steps=12)
  config.log_every_steps = 4
  config.data.cache_dir = str(tmp_path / "cache")  # both runs share vocabulary and tokens
  straight = train_lib.train_and_evaluate(config, str(tmp_path / "straight"))

  config.num_train_steps = config.checkpoint_every_steps = 8  # a log boundary
  train_lib.train_and_evaluate(config, str(tmp_path / "resumed"))
  config.num_train_steps, config.checkpoint_every_steps = 12, 12
  resumed = train_lib.train_and_evaluate(config, str(tmp_path / "resumed"))

  assert resumed["loss"] == straight["loss"]
  params = [checkpoint.Checkpointer(str(tmp_path / run)).restore_params(12)
            for run in ("straight", "resumed")]
  jax.tree.map(np.testing.assert_array_equal, *params)
  assert _logged(tmp_path / "straight") == _logged(tmp_path / "resumed")


def test_vocabulary_mismatch_on_resume_is_an_error(shared_data, tmp_path):
  config = _tatoeba_tiny(shared_data, steps=2)
  train_lib.train_and_evaluate(config, str(tmp_path))
  config.num_train_steps = 4
  config.data.vocab_sample_sentences = 3000  # a different vocabulary for the same workdir
  with pytest.raises(ValueError, match="vocabulary"):
    train_lib.train_and_evaluate(config, str(tmp_path))
