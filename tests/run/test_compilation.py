"""Compilation out of the way: bucket shapes compiled before step 1, programs kept on disk
for the next process, and runs that never import TensorFlow."""

import json
import logging
import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache as jax_cache

from tests import support
from tests.conftest import REPO
from transformer.run import compilation
from transformer.model import transformer as model_lib
from transformer.training import optimizer
from transformer.training import parallel
from transformer.training import steps as steps_lib


def _pad_to(batch: dict, length: int) -> dict:
  return {k: np.pad(v, ((0, 0), (0, length - v.shape[1]))) for k, v in batch.items()}


def test_steps_after_compiling_every_bucket_ahead_compile_nothing_and_match_plain_jit():
  config = support.tiny_config()
  model = model_lib.build_model(config)
  tx = optimizer.create_optimizer(config)
  runner = parallel.create(config, devices=jax.devices()[:1])
  state = runner.init_state(lambda: steps_lib.create_train_state(model, tx, jax.random.key(0)))
  rng = jax.random.key(1)
  # Two bucket shapes, taking turns as a bucketed pipeline's batches do.
  batches = [support.global_batch(i) if i % 2 else _pad_to(support.global_batch(i), 16)
             for i in range(4)]
  data = types.SimpleNamespace(stats={"shapes": [(16, 16, 16), (16, 12, 10)]},
                               eval_batches=None)

  def run(compile_ahead: bool):
    step = runner.compile_train_step(steps_lib.make_train_step(model, tx, config), state)
    current = jax.tree.map(jnp.copy, state)  # the step donates its input state
    if compile_ahead:
      steps_lib.compile_batch_shapes(runner, step, None, current, rng, data, config)
    with compilation.CompileMonitor() as monitor:
      metrics = []
      for batch in batches:
        current, m = step(current, runner.place_batch(batch), rng)
        metrics.append(m)
      return jax.device_get((current.params, metrics)), monitor.seconds()

  plain, _ = run(compile_ahead=False)
  ahead, compiling = run(compile_ahead=True)
  assert compiling == 0.0
  jax.tree.map(np.testing.assert_array_equal, ahead, plain)


def test_unwritable_cache_folder_is_one_warning_and_the_run_goes_on(tmp_path, caplog):
  blocker = tmp_path / "file"
  blocker.write_text("")
  previous = jax.config.jax_compilation_cache_dir  # the tests' own (JAX_COMPILATION_CACHE_DIR)
  try:
    jax.config.update("jax_compilation_cache_dir", None)
    with caplog.at_level(logging.WARNING), \
        compilation.persistent_cache(str(blocker / "cache")) as folder:
      assert folder is None
  finally:
    jax.config.update("jax_compilation_cache_dir", previous)
  warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 1 and "cannot be written" in warnings[0].getMessage()


def test_the_cache_is_the_callers_when_chosen_and_put_back_after(tmp_path):
  """A folder the caller set (in jax.config, as a notebook would) is used as it is; one the
  block sets is the setting only within it."""
  previous = jax.config.jax_compilation_cache_dir
  try:
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "callers"))
    with compilation.persistent_cache(str(tmp_path / "configs")) as folder:
      assert folder == str(tmp_path / "callers") == jax.config.jax_compilation_cache_dir
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "callers")
    jax.config.update("jax_compilation_cache_dir", None)
    with compilation.persistent_cache(str(tmp_path / "configs")) as folder:
      assert folder == str(tmp_path / "configs") == jax.config.jax_compilation_cache_dir
      jax.jit(lambda x: x * 3)(jax.numpy.ones(3)).block_until_ready()
    assert jax.config.jax_compilation_cache_dir is None
    assert os.listdir(tmp_path / "configs")  # the program compiled within was kept there
  finally:
    jax.config.update("jax_compilation_cache_dir", previous)
    jax_cache.reset_cache()


def test_monitors_share_one_pair_of_listeners_that_goes_with_the_last_monitor():
  from jax._src import monitoring as jax_monitoring

  def listeners():
    return (len(jax_monitoring.get_event_listeners()),
            len(jax_monitoring.get_event_time_span_listeners()))

  before = listeners()
  with compilation.CompileMonitor() as outer:
    for i in range(3):
      with compilation.CompileMonitor() as inner:
        jax.jit(lambda x, i=i: x * i + 1)(np.float32(2)).block_until_ready()
      assert listeners() == (before[0] + 1, before[1] + 1)
  assert listeners() == before
  compiling = outer.seconds()
  assert compiling >= inner.seconds() > 0
  jax.jit(lambda x: x - 7)(np.float32(2)).block_until_ready()  # after both closed
  assert outer.seconds() == compiling and not compilation._recorder.open


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
  """The JSON reports of `tensorflow_free_driver.py` run twice, in two processes sharing the
  data cache and a compilation cache that starts empty."""
  root = tmp_path_factory.mktemp("tensorflow_free")
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  # Keep every program, however fast it compiled, so the second run has them all.
  env.update(PYTHONPATH=str(REPO), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             XLA_FLAGS="")
  reports = []
  for run in ("first", "second"):
    out = subprocess.run(
        [sys.executable, "tests/tensorflow_free_driver.py",
         str(root / run), str(root / "data"), str(root / "xla")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    reports.append(json.loads(out.stdout.strip().splitlines()[-1]))
  return reports


def test_training_evaluation_and_translation_run_without_tensorflow(two_runs):
  first, _ = two_runs
  assert first["tensorflow_modules"] == []
  assert np.isfinite(first["loss"]) and first["translations"] == 2


def test_a_second_process_reads_every_program_from_the_persistent_cache(two_runs):
  first, second = two_runs
  assert first["cache_misses"] > 0  # it compiled (a hit is a program it compiled before)
  assert second["cache_misses"] == 0
  assert second["cache_hits"] == first["cache_hits"] + first["cache_misses"]
