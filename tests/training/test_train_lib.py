"""The training loop: learning, resume, vocabulary reuse, and the real-data path end to end."""

import logging
import os
import re
import shutil
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import support
from tests.conftest import TRAINED_STEPS
from transformer.run import checkpoint
from transformer.run import checkpoint_layout
from transformer import errors
from transformer.model import transformer as model_lib
from transformer.training import optimizer
from transformer.training import parallel
from transformer.data import tokenizer as tokenizer_lib
from transformer.training import steps as steps_lib
from transformer.training import train_lib
from transformer.errors import ConfigError


def test_tiny_model_loss_falls_over_50_steps():
  config = support.tiny_config()
  config.model.dropout_rate = 0.1
  config.learning_rate_factor = 1.0
  model = model_lib.build_model(config)
  tx = optimizer.create_optimizer(config)
  runner = parallel.create(config, devices=jax.devices()[:1])
  state = runner.init_state(lambda: steps_lib.create_train_state(model, tx, jax.random.key(0)))
  step = runner.compile_train_step(steps_lib.make_train_step(model, tx, config), state)
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


def test_dev_bleu_of_zero_sentences_decodes_the_whole_split(monkeypatch):
  """`config.bleu_num_sentences`: the first N dev sentences, or all of them for 0."""
  from transformer.evaluation import evaluate_lib, scoring

  decoded = []

  def translate_and_score(model, params, tokenizer, pairs, config):
    decoded.append(len(pairs))
    return [t for _, t in pairs], scoring.score([t for _, t in pairs], [t for _, t in pairs])

  monkeypatch.setattr(evaluate_lib, "translate_and_score", translate_and_score)
  data = types.SimpleNamespace(splits={"dev": [("a b", "c d")] * 7}, tokenizer=None)
  for num_sentences in (3, 0):
    train_lib._bleu(support.synthetic_tiny(steps=1), None, None, data, "dev", num_sentences)
  assert decoded == [3, 7]


def test_chunked_output_layer_gives_the_dense_step():
  """config.loss_chunk_tokens changes how the loss is computed, not the update: the same
  sums and parameters after a step, and the same evaluation sums, as the dense computation."""
  config = support.tiny_config()
  model = model_lib.build_model(config)
  tx = optimizer.create_optimizer(config)
  runner = parallel.create(config, devices=jax.devices()[:1])
  state = runner.init_state(lambda: steps_lib.create_train_state(model, tx, jax.random.key(0)))
  batch = runner.place_batch(support.global_batch(0))
  results = []
  for chunk_tokens in (0, 40):  # 16 rows: chunks of 2 of the 10 target positions
    config.loss_chunk_tokens = chunk_tokens
    evaluated = runner.compile_eval_step(steps_lib.make_eval_step(model, config))(
        state.params, batch)
    step = runner.compile_train_step(steps_lib.make_train_step(model, tx, config), state)
    new_state, metrics = step(jax.tree.map(jnp.copy, state), batch, jax.random.key(1))
    results.append(jax.device_get((new_state.params, metrics, evaluated)))
  # atol: Adam's first update is about ±lr for every gradient entry, so an entry whose gradient
  # is ~0 may move either way by a few 1e-6 when the float sums are ordered differently.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, rtol=2e-5, atol=1e-5), *results)


def test_trained_workdir_learned_checkpointed_and_logged(trained):
  _, workdir = trained
  losses = [loss for _, loss in support.logged(workdir)]
  assert losses[-1] < losses[0] - 0.5, losses
  assert sorted(map(int, os.listdir(workdir / "checkpoints"))) == [TRAINED_STEPS // 2,
                                                                  TRAINED_STEPS]
  assert (workdir / "config.json").is_file()
  assert len(list((workdir / "data").glob("spm-*.model"))) == 1
  for key in ("dev/perplexity", "dev/sacrebleu", "dev/tokenized_bleu", "dev/chrf",
              "dev/bleu_seconds"):
    assert [s for s, _ in support.logged(workdir, key)] == [TRAINED_STEPS // 2,
                                                            TRAINED_STEPS], key
  assert list(workdir.glob("events.out.tfevents.*")), "no TensorBoard event file"


def test_resume_past_a_damaged_checkpoint_is_bit_identical_and_reuses_the_vocabulary(
    trained, copy_of_trained, caplog):
  """The latest checkpoint of a copy is damaged (an item missing) and metrics.jsonl ends in a
  torn line: the rerun sets the checkpoint aside, resumes from the one before and ends where
  the uninterrupted run did (same parameters, same logged losses), with the same vocabulary
  file (not retrained)."""
  _, straight = trained
  config, workdir = copy_of_trained
  vocab = next((workdir / "data").glob("spm-*.model"))
  mtime = vocab.stat().st_mtime_ns
  shutil.rmtree(workdir / "checkpoints" / str(TRAINED_STEPS) / "opt_state")
  with open(workdir / "metrics.jsonl", "a") as f:
    f.write('{"step": 201, "train/lo')

  train_lib.train_and_evaluate(config, str(workdir))

  assert "metrics.jsonl:" in caplog.text and "is not a whole JSON line" in caplog.text
  (aside,) = (workdir / "checkpoints-set-aside").iterdir()
  assert aside.name.startswith(f"{TRAINED_STEPS}-")
  assert checkpoint.Checkpointer(str(workdir), read_only=True).steps()[-1] == TRAINED_STEPS
  assert list((workdir / "data").glob("spm-*.model")) == [vocab]
  assert vocab.stat().st_mtime_ns == mtime
  params = [checkpoint.Checkpointer(str(w), read_only=True).restore_params(TRAINED_STEPS)
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
  before = sorted(p.name for p in (workdir / "data").iterdir())
  with pytest.raises(ConfigError, match="vocabulary mismatch on resume"):
    train_lib.train_and_evaluate(config, str(workdir), allow_config_changes=True)
  assert sorted(p.name for p in (workdir / "data").iterdir()) == before  # nothing tokenized


def _diverging_config(steps: int, on_nonfinite: str):
  """The in-memory tiny model at a learning rate so high that its loss stops being finite
  within a few steps; checkpoints every 3 steps, logs every 20 (so that step is no log step)."""
  config = support.in_memory_config(steps)
  config.learning_rate_factor, config.warmup_steps = 1e5, 1
  config.checkpoint_every_steps, config.log_every_steps = 3, 20
  config.on_nonfinite = on_nonfinite
  return config


def _all_finite(workdir, step) -> bool:
  params = checkpoint.Checkpointer(str(workdir), read_only=True).restore_params(step)
  return all(np.isfinite(x).all() for x in jax.tree.leaves(params))


def test_non_finite_loss_at_a_non_log_step_stops_before_any_non_finite_checkpoint(tmp_path):
  with pytest.raises(errors.Diverged) as stopped:
    train_lib.train_and_evaluate(_diverging_config(12, "stop"), str(tmp_path),
                                 data=support.in_memory_data())
  # Which step overflows first depends on float rounding; the test needs one after a save.
  found = re.search(r"NaN or infinite at step (\d+); the last checkpoint \((\d+)\) is finite",
                    str(stopped.value))
  assert found, str(stopped.value)
  step, last = map(int, found.groups())
  assert 3 < step < 12 and last == (step - 1) // 3 * 3, (step, last)
  saved = checkpoint.Checkpointer(str(tmp_path), read_only=True).steps()
  assert saved[-1] == last and all(_all_finite(tmp_path, s) for s in saved)


def test_skipped_non_finite_updates_are_counted_and_never_saved(tmp_path, caplog):
  config = _diverging_config(12, "skip")
  config.log_every_steps = 1
  train_lib.train_and_evaluate(config, str(tmp_path), data=support.in_memory_data())
  steps = checkpoint.Checkpointer(str(tmp_path), read_only=True).steps()
  assert steps[-1] == 12 and all(_all_finite(tmp_path, s) for s in steps)
  skipped = [step for step, n in support.logged(tmp_path, "train/nonfinite_steps") if n]
  assert skipped and skipped[0] > 1, skipped
  losses = dict(support.logged(tmp_path))
  assert all(np.isnan(losses[s]) for s in skipped)  # no finite token left to average
  assert all(np.isfinite(losses[s]) for s in range(1, skipped[0]))
  assert "may be diverging" in caplog.text  # the loss rose far above its first value


def test_another_model_in_the_workdir_is_refused_before_anything_is_written(copy_of_trained):
  config, workdir = copy_of_trained
  files = {p: p.stat().st_mtime_ns for p in workdir.rglob("*")}
  config.model.d_model = 96
  with pytest.raises(ConfigError, match=r"config.json of this workdir has model.d_model=64 "
                     r"\(now 96\); a run of another model or corpus needs a new workdir"):
    train_lib.train_and_evaluate(config, str(workdir))
  config.model.d_model, config.num_train_steps = 64, TRAINED_STEPS + 10
  with pytest.raises(ConfigError, match=r"num_train_steps=120 \(now 130\); pass "
                     r"--allow_config_changes"):
    train_lib.train_and_evaluate(config, str(workdir))
  assert {p: p.stat().st_mtime_ns for p in workdir.rglob("*")} == files


def test_a_copied_workdir_resumes_and_evaluates(trained, tmp_path):
  """Copied with new file times to another path: the vocabulary, the token caches and the
  data iterator's position all carry over."""
  from transformer.evaluation import evaluate_lib

  config, original = trained
  workdir = tmp_path / "moved"
  shutil.copytree(original, workdir, copy_function=shutil.copy)  # new modification times
  data_files = sorted(p.name for p in (workdir / "data").iterdir())
  config = config.copy_and_resolve_references()
  config.num_train_steps = TRAINED_STEPS + 10
  train_lib.train_and_evaluate(config, str(workdir), allow_config_changes=True)
  assert sorted(p.name for p in (workdir / "data").iterdir()) == data_files
  assert support.logged(workdir)[-1][0] == TRAINED_STEPS + 10
  (tmp_path / "in.en").write_text("Tom is here.\n")
  (hypothesis,) = evaluate_lib.translate_file(config, str(workdir), str(tmp_path / "in.en"),
                                              None, 1)
  assert hypothesis


def test_a_full_disk_stops_training_with_one_line_and_the_rerun_ends_bit_identical(
    tmp_path, monkeypatch, capfd, caplog):
  """The save of step 6 runs out of disk space (simulated where orbax writes an array): the
  run stops with one line naming checkpoint 6 and checkpoint 4, where the next run resumes,
  and nothing of orbax's reports reaches stderr. With room made, the same command resumes
  there and ends as an uninterrupted run does: same parameters, same logged losses. Older
  checkpoints hold parameters only (keep_full_checkpoints=1), as resuming must not mind."""
  from tests.run.test_disk import fail_saves_for_want_of_space

  config = support.in_memory_config(8)
  config.checkpoint_every_steps = 2
  config.keep_checkpoints, config.keep_full_checkpoints = 3, 1
  straight, workdir = tmp_path / "straight", tmp_path / "full"
  train_lib.train_and_evaluate(config, str(straight), data=support.in_memory_data())

  fail_saves_for_want_of_space(monkeypatch, 6)
  with pytest.raises(errors.DiskFull) as full:
    train_lib.train_and_evaluate(config, str(workdir), data=support.in_memory_data())
  assert str(full.value) == (
      f"No space left on device while writing checkpoint 6 to {workdir}/checkpoints; nothing "
      "complete was deleted: the next run resumes from checkpoint 4; make room there (or "
      "point the run at another disk) and run the same command again")
  assert checkpoint_layout.saved_steps(str(workdir)) == [2, 4]
  assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
  stderr = capfd.readouterr().err
  assert "Traceback" not in stderr and "Event loop is closed" not in stderr, stderr[-3000:]

  monkeypatch.undo()
  train_lib.train_and_evaluate(config, str(workdir), data=support.in_memory_data())
  assert checkpoint.Checkpointer(str(workdir), read_only=True).full_steps() == [8]
  params = [checkpoint.Checkpointer(str(w), read_only=True).restore_params(8)
            for w in (straight, workdir)]
  jax.tree.map(np.testing.assert_array_equal, *params)
  assert support.logged(workdir) == support.logged(straight)


def _count_initialisations(monkeypatch) -> tuple[list[str], list[int]]:
  """Two lists: one that grows each time the initial parameters are traced (a Python call of
  `init_params`, as `jax.eval_shape` or a first `jax.jit` call makes), and one each time they
  are computed on a device (tracing them runs nothing and adds nothing there)."""
  traced, computed = [], []
  init_params = model_lib.init_params

  def counted(model, rng, *args, **kwargs):
    traced.append("traced")
    jax.debug.callback(lambda: computed.append(1))
    return init_params(model, rng, *args, **kwargs)

  monkeypatch.setattr(model_lib, "init_params", counted)
  return traced, computed


def test_only_a_fresh_start_computes_the_initial_state(tmp_path, monkeypatch):
  """A fresh start computes the initial state; a resume, under either runner, restores the
  checkpoint into the state's shapes and shardings alone (`runner.abstract_init`), so it
  never holds the initial state beside the restored one. Either way the initialisation is
  traced once: the shapes and the computed state come from one trace."""
  traced, computed = _count_initialisations(monkeypatch)
  for steps, parallelism in ((2, "jit"), (3, "pmap"), (4, "jit")):
    traced.clear()
    computed.clear()
    train_lib.train_and_evaluate(support.in_memory_config(steps, parallelism), str(tmp_path),
                                 data=support.in_memory_data(), allow_config_changes=True)
    assert checkpoint_layout.resume_step(str(tmp_path)) == steps
    assert bool(computed) == (steps == 2), f"{parallelism} run to step {steps}: {computed}"
    assert len(traced) == 1, f"{parallelism} run to step {steps}: {traced}"


def test_a_run_without_a_dev_split_computes_no_dev_bleu(tmp_path):
  """`bleu_every_steps` (the configs' 5000, or here 5) asks dev BLEU at its multiples and at
  the last step; a run with no dev split computes none and ends."""
  config = support.in_memory_config(2)
  config.bleu_every_steps = 5
  train_lib.train_and_evaluate(config, str(tmp_path), data=support.in_memory_data())
  assert checkpoint_layout.resume_step(str(tmp_path)) == 2
  assert not support.logged(tmp_path, "dev/sacrebleu")


@pytest.mark.parametrize("slow", ["evaluate_loss", "_bleu"], ids=["dev loss", "dev BLEU"])
def test_the_step_clock_stops_while_the_loop_evaluates(tmp_path, monkeypatch, capfd, slow):
  """config.step_timeout_seconds bounds training steps alone: a dev evaluation (or dev BLEU)
  that takes ten times the timeout leaves the run going (`Supervisor.not_stepping`), where a
  step that long would end it. The step clock (`peer_watch`'s) runs on a clock of the test's
  own, which only the slow evaluation moves, so a busy machine's slow steps and saves count
  for nothing; the evaluation also waits for several of the watch's rounds in real time."""
  from transformer.training import peer_watch

  timeout = 1  # seconds
  clock = [1000.0]
  monkeypatch.setattr(peer_watch, "time", types.SimpleNamespace(monotonic=lambda: clock[0],
                                                                sleep=time.sleep))
  ended = []  # what would end the process: its line printed, a stuck run leaves with status 1
  monkeypatch.setattr(peer_watch.PeerWatch, "_leave", lambda self, status: ended.append(status))

  evaluations = []

  def slow_evaluation(*args, **kwargs):
    evaluations.append(clock[0])
    clock[0] += 10 * timeout
    time.sleep(10 * 0.2)  # ten rounds of the watch (every max(timeout / 10, 0.2) s)
    return {"loss": 1.0} if slow == "evaluate_loss" else {"sacrebleu": 1.0, "chrf": 1.0}

  monkeypatch.setattr(steps_lib if slow == "evaluate_loss" else train_lib, slow, slow_evaluation)
  config = support.in_memory_config(4)
  config.step_timeout_seconds = timeout
  data = support.in_memory_data()
  if slow == "evaluate_loss":
    config.eval_every_steps = 2
    data.eval_batches = lambda: []  # a dev split, for the slow evaluation
  else:
    config.bleu_every_steps, config.data.eval_split = 2, "valid"
    data.splits = {"valid": [("a source", "a reference")]}  # a dev split, for dev BLEU
  train_lib.train_and_evaluate(config, str(tmp_path), data=data)
  assert len(evaluations) == 2  # at steps 2 and 4
  assert not ended and "stuck" not in capfd.readouterr().err
  assert checkpoint_layout.resume_step(str(tmp_path)) == 4
