"""Checkpoints: an exact round trip, full checkpoints and parameter snapshots, averaging
(paper §6.1), and the errors evaluate.py relies on."""

import atexit
import functools
import gc
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests import support
from tests.conftest import REPO
from transformer.run import averaging
from transformer.run import checkpoint
from transformer.run import checkpoint_layout
from transformer.run import checkpoint_reads
from transformer.model import transformer as model_lib
from transformer.training import optimizer
from transformer.training import steps as steps_lib
from transformer.errors import ConfigError


@functools.cache
def _tiny_state():
  """The initial train state of `support.tiny_config()`'s model, made once per process: its
  init is one program to compile (seconds), which every test here that saves it shares."""
  config = support.tiny_config()
  model, tx = model_lib.build_model(config), optimizer.create_optimizer(config)
  return jax.jit(lambda: steps_lib.create_train_state(model, tx, jax.random.key(0)))()


def test_save_restore_is_exact(tmp_path):
  state = _tiny_state().replace(step=jnp.array(7, jnp.int32))
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=2)
  ckpt.save(7, state, {"next_index": 7}, {"vocab": {"path": "v", "sha256": "x"}})
  ckpt.wait()
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
  restored, data_state, meta = ckpt.restore(7, abstract)
  ckpt.close()
  jax.tree.map(np.testing.assert_array_equal, restored, state)
  assert data_state == {"next_index": 7} and meta["vocab"]["sha256"] == "x"


def _write_steps(workdir, steps, keep_full=10):
  """Checkpoints of small random train states at `steps` (the newest `keep_full` full, the
  others parameter snapshots); returns the parameters saved at each step."""
  ckpt = checkpoint.Checkpointer(str(workdir), keep=10, keep_full=keep_full)
  rng = np.random.default_rng(0)
  stored = {}
  for step in steps:
    params = {"dense": {"kernel": rng.normal(size=(3, 4)).astype(np.float32)},
              "bias": rng.normal(size=(4,)).astype(np.float32)}
    moments = jax.tree.map(lambda x: np.abs(x) / 7, params)
    # A 0-d array, as TrainState.step is (orbax 0.11 rejects NumPy scalars).
    state = {"params": params, "step": np.asarray(step, np.int32), "opt_state": moments}
    ckpt.save(step, state, {"next_index": step}, {"step": step})
    stored[step] = params
  ckpt.wait()
  ckpt.close()
  return stored


def test_average_equals_numpy_mean_of_last_k(tmp_path):
  stored = _write_steps(tmp_path, [10, 20, 30, 40])
  averaged, steps = averaging.average_params(str(tmp_path), 3)
  assert steps == [20, 30, 40]
  expected = jax.tree.map(lambda *xs: np.mean(np.stack(xs), 0), *[stored[s] for s in steps])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), averaged, expected)


def test_average_of_one_is_the_latest(tmp_path):
  stored = _write_steps(tmp_path, [5, 6])
  latest, steps = averaging.average_params(str(tmp_path), 1)
  assert steps == [6]
  jax.tree.map(np.testing.assert_array_equal, latest, stored[6])


def test_more_than_present_says_how_many(tmp_path):
  _write_steps(tmp_path, [1, 2])
  with pytest.raises(ConfigError, match=r"--num_average=5 but .* holds only 2 checkpoint"):
    averaging.average_params(str(tmp_path), 5)


def test_no_checkpoint_names_workdir_and_command(tmp_path):
  with pytest.raises(ConfigError, match=rf"no checkpoint in {tmp_path}.*python train.py"):
    averaging.average_params(str(tmp_path), 1)


@functools.cache
def _saved_two_checkpoints() -> tuple[pathlib.Path, object]:
  """A folder with checkpoints 1 and 2 of a tiny train state, saved once per process (the
  state's tracing and the two saves took about 0.5 s a test), and the state's abstract tree."""
  folder = pathlib.Path(tempfile.mkdtemp(prefix="two-checkpoints-"))
  atexit.register(shutil.rmtree, folder, ignore_errors=True)
  state = _tiny_state()
  ckpt = checkpoint.Checkpointer(str(folder))
  for step in (1, 2):
    ckpt.save(step, state, {"next_index": step}, {"step": step})
  ckpt.wait()
  ckpt.close()
  return folder, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)


def _two_checkpoints(workdir):
  """Checkpoints 1 and 2 of a tiny train state in `workdir` (a copy of the files orbax
  wrote, to damage freely); returns the state's abstract tree."""
  folder, abstract = _saved_two_checkpoints()
  shutil.copytree(folder, workdir, dirs_exist_ok=True)
  return abstract


def _largest_data_file(workdir):
  return max((workdir / "checkpoints" / "2").rglob("d/*"), key=os.path.getsize)


def _truncate(workdir):
  path = _largest_data_file(workdir)
  path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


def _overwrite(workdir):
  path = _largest_data_file(workdir)
  path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))


CORRUPTIONS = {
    "truncated data file": _truncate,
    "overwritten data file": _overwrite,
    "missing manifest": lambda w: (w / "checkpoints/2/params/manifest.ocdbt").unlink(),
    "empty metadata": lambda w: (w / "checkpoints/2/params/_METADATA").write_text(""),
    "missing item": lambda w: shutil.rmtree(w / "checkpoints/2/opt_state"),
}


@pytest.mark.parametrize("damage", CORRUPTIONS, ids=list(CORRUPTIONS))
def test_a_damaged_latest_checkpoint_is_set_aside_for_the_one_before(tmp_path, damage, caplog):
  abstract = _two_checkpoints(tmp_path)
  CORRUPTIONS[damage](tmp_path)
  step, state, data_state, meta = checkpoint.Checkpointer(str(tmp_path)).restore_latest(
      abstract)
  assert (step, data_state, meta) == (1, {"next_index": 1}, {"step": 1})
  (aside,) = (tmp_path / "checkpoints-set-aside").iterdir()  # moved, not deleted
  assert aside.name.startswith("2-") and (aside / "meta").is_dir()
  (warning,) = [r for r in caplog.records if "cannot be restored" in r.getMessage()]
  assert "\n" not in warning.getMessage() and "checkpoint 2" in warning.getMessage()


# Each damage in a fresh process, then an unrelated error nobody catches (it must still show).
_DAMAGED_RESTORES = """
import gc, pathlib, sys, tempfile, time
from tests.run.test_checkpoint import CORRUPTIONS, _two_checkpoints
from transformer.run import checkpoint
for damage in sys.argv[1:]:
  workdir = pathlib.Path(tempfile.mkdtemp(dir="."))  # in the test's tmp_path
  abstract = _two_checkpoints(workdir)
  CORRUPTIONS[damage](workdir)
  assert checkpoint.Checkpointer(str(workdir)).restore_latest(abstract)[0] == 1
time.sleep(0.5)  # the orphaned reads complete
gc.collect()  # and their tasks are collected

class Unrelated:
  def __del__(self):
    raise ValueError("an unrelated error")

Unrelated()
"""


def test_a_damaged_checkpoint_is_one_warning_on_stderr(tmp_path):
  """Orbax abandons the other reads of a restore that fails; their tracebacks (pages of them
  per damaged checkpoint) must not follow the one warning, and nothing else is hidden."""
  damages = ["truncated data file", "overwritten data file", "missing manifest"]
  run = subprocess.run([sys.executable, "-c", _DAMAGED_RESTORES, *damages], cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
                       text=True)
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stderr.count("cannot be restored") == len(damages), run.stderr[-3000:]
  assert "never retrieved" not in run.stderr, run.stderr[-3000:]
  assert "Event loop is closed" not in run.stderr, run.stderr[-3000:]
  assert run.stderr.count("Traceback (most recent call last)") == 1  # the unrelated error's
  assert "ValueError: an unrelated error" in run.stderr


def test_a_failed_restore_puts_the_unraisable_hook_and_asyncio_filters_back(tmp_path,
                                                                           monkeypatch):
  """The quieting is the failed restore's alone: the hook in place before (here one that
  records) gets none of its abandoned reads, and is the hook again afterwards."""
  abstract = _two_checkpoints(tmp_path)
  _truncate(tmp_path)
  reported = []

  def hook(unraisable):
    reported.append(unraisable.exc_value)

  monkeypatch.setattr(sys, "unraisablehook", hook)
  asyncio_filters = list(logging.getLogger("asyncio").filters)
  assert checkpoint.Checkpointer(str(tmp_path)).restore_latest(abstract)[0] == 1
  assert sys.unraisablehook is hook
  assert logging.getLogger("asyncio").filters == asyncio_filters
  gc.collect()  # nothing of the failed restore is left to report
  assert reported == []


def test_no_restorable_checkpoint_is_one_line(tmp_path):
  abstract = _two_checkpoints(tmp_path)
  for step in ("1", "2"):
    (tmp_path / "checkpoints" / step / "params" / "_METADATA").write_text("")
  with pytest.raises(ConfigError, match=r"no checkpoint in .* can be restored \(steps \[2, 1\]"):
    checkpoint.Checkpointer(str(tmp_path)).restore_latest(abstract)


def test_a_checkpoint_of_another_model_is_not_set_aside(tmp_path):
  abstract = _two_checkpoints(tmp_path)
  other = jax.tree.map(lambda x: jax.ShapeDtypeStruct((*x.shape[:-1], x.shape[-1] + 1),
                                                      x.dtype) if x.ndim else x, abstract)
  with pytest.raises(ConfigError, match=r"checkpoint 2 .* holds a model of another shape"):
    checkpoint.Checkpointer(str(tmp_path)).restore_latest(other)
  assert not (tmp_path / "checkpoints-set-aside").exists()


def test_another_structure_is_another_model_and_names_the_leaf(tmp_path):
  abstract = _two_checkpoints(tmp_path)
  params = abstract.params
  extra = {**params, "extra": {"kernel": jax.ShapeDtypeStruct((2, 2), np.float32)}}
  with pytest.raises(ConfigError, match=r"checkpoint 2 .* another shape .*"
                     r"params/params/extra/kernel is not in the checkpoint"):
    checkpoint.Checkpointer(str(tmp_path)).restore_latest(abstract.replace(params=extra))
  assert not (tmp_path / "checkpoints-set-aside").exists()


def _orbax_read_fails(monkeypatch, message: str, step: int = 2):
  """Orbax's reading of the arrays of checkpoint `step` raises ValueError(message)."""
  real = ocp.StandardCheckpointHandler.restore

  def restore(handler, directory, *args, **kwargs):
    if directory.parent.name == str(step) and directory.name == "params":
      raise ValueError(message)
    return real(handler, directory, *args, **kwargs)

  monkeypatch.setattr(ocp.StandardCheckpointHandler, "restore", restore)


@pytest.mark.parametrize("message", [
    "Structure mismatch: is not compatible with the stored shape",  # what orbax says of shapes
    "a message no release of orbax has used",
])
def test_damaged_or_another_model_is_decided_by_the_stored_trees_not_by_messages(
    tmp_path, monkeypatch, message):
  """A read that fails on a checkpoint whose stored trees match is damage, whatever orbax's
  message says; a checkpoint whose trees differ is another model before anything is read."""
  abstract = _two_checkpoints(tmp_path)
  _orbax_read_fails(monkeypatch, message)
  step, *_ = checkpoint.Checkpointer(str(tmp_path)).restore_latest(abstract)
  assert step == 1
  (aside,) = (tmp_path / "checkpoints-set-aside").iterdir()
  assert aside.name.startswith("2-")
  other = jax.tree.map(lambda x: jax.ShapeDtypeStruct((*x.shape[:-1], x.shape[-1] + 1),
                                                      x.dtype) if x.ndim else x, abstract)
  _orbax_read_fails(monkeypatch, message, step=1)
  with pytest.raises(ConfigError, match=r"checkpoint 1 .* holds a model of another shape.*"
                     r"float32\[.*\] there and float32\[.*\] here"):
    checkpoint.Checkpointer(str(tmp_path)).restore_latest(other)
  assert checkpoint_layout.saved_steps(str(tmp_path)) == [1]


def test_an_error_in_the_projects_own_code_sets_nothing_aside(tmp_path, monkeypatch):
  abstract = _two_checkpoints(tmp_path)

  def broken(*args):
    raise RuntimeError("a bug after the read")

  monkeypatch.setattr(checkpoint_reads, "join", broken)
  with pytest.raises(RuntimeError, match="a bug after the read"):
    checkpoint.Checkpointer(str(tmp_path)).restore_latest(abstract)
  assert checkpoint_layout.saved_steps(str(tmp_path)) == [1, 2]
  assert not (tmp_path / "checkpoints-set-aside").exists()


def test_a_checkpoint_of_nonfinite_parameters_is_set_aside(tmp_path, caplog):
  abstract = _two_checkpoints(tmp_path)
  ckpt = checkpoint.Checkpointer(str(tmp_path))
  state, *_ = ckpt.restore(2, abstract)
  ckpt.manager.delete(2)
  bad = jax.tree.map(lambda x: x * np.nan, state.params)
  ckpt.save(2, state.replace(params=bad), {"next_index": 2}, {"step": 2})
  ckpt.close()
  step, *_ = checkpoint.Checkpointer(str(tmp_path)).restore_latest(abstract)
  assert step == 1
  assert caplog.text.count("its parameters are not all finite") == 1
  (aside,) = (tmp_path / "checkpoints-set-aside").iterdir()
  assert aside.name.startswith("2-")


def test_leftover_temporary_folders_are_removed_at_start(tmp_path):
  _two_checkpoints(tmp_path)
  (tmp_path / "checkpoints" / "3.orbax-checkpoint-tmp").mkdir()  # a kill during a save
  assert checkpoint.Checkpointer(str(tmp_path)).steps() == [1, 2]
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2"]


def _items(workdir, step):
  return sorted(p.name for p in (workdir / "checkpoints" / str(step)).iterdir() if p.is_dir())


def test_older_checkpoints_hold_the_parameters_only_and_average_like_full_ones(tmp_path):
  """Beyond the newest keep_full, a checkpoint keeps its parameters alone (a third of the
  bytes), resuming sees only the full ones, and the mean over a mix of both kinds is the
  mean of the same parameters saved full, bit for bit (the same float32 arrays are read)."""
  stored = _write_steps(tmp_path / "mixed", [10, 20, 30, 40], keep_full=2)
  _write_steps(tmp_path / "full", [10, 20, 30, 40], keep_full=10)
  mixed = tmp_path / "mixed"
  assert [_items(mixed, s) for s in (10, 20)] == [["params"]] * 2
  assert [_items(mixed, s) for s in (30, 40)] == [["data", "meta", "opt_state", "params"]] * 2
  ckpt = checkpoint.Checkpointer(str(mixed), read_only=True)
  assert (ckpt.steps(), ckpt.full_steps()) == ([10, 20, 30, 40], [30, 40])
  assert checkpoint_layout.resume_step(str(mixed)) == 40
  assert checkpoint_layout.saved_steps(str(mixed)) == [10, 20, 30, 40]  # what a sweep reads
  jax.tree.map(np.testing.assert_array_equal, ckpt.restore_params(10), stored[10])
  averaged, steps = averaging.average_params(str(mixed), 4)
  reference, _ = averaging.average_params(str(tmp_path / "full"), 4)
  assert steps == [10, 20, 30, 40]
  jax.tree.map(np.testing.assert_array_equal, averaged, reference)


def test_resuming_never_falls_back_to_a_parameter_snapshot(tmp_path):
  _write_steps(tmp_path, [1, 2, 3], keep_full=1)
  (tmp_path / "checkpoints" / "3" / "params" / "_METADATA").write_text("")
  abstract = {"params": {"dense": {"kernel": jax.ShapeDtypeStruct((3, 4), np.float32)},
                         "bias": jax.ShapeDtypeStruct((4,), np.float32)},
              "step": jax.ShapeDtypeStruct((), np.int32)}
  abstract["opt_state"] = abstract["params"]
  with pytest.raises(ConfigError, match=r"no checkpoint in .* can be restored \(steps \[3\]"):
    checkpoint.Checkpointer(str(tmp_path)).restore_latest(abstract)
  assert checkpoint_layout.saved_steps(str(tmp_path)) == [1, 2]  # the snapshots, untouched


def test_a_kill_while_a_checkpoint_becomes_a_snapshot_leaves_a_snapshot(tmp_path):
  """Killed after `meta` was renamed but before the other items were removed: the folder is
  a snapshot already (never a damaged full checkpoint), and the next trainer tidies it."""
  stored = _write_steps(tmp_path, [1, 2, 3], keep_full=10)
  folder = tmp_path / "checkpoints" / "1"
  (folder / "meta").rename(folder / "meta.removing")
  ckpt = checkpoint.Checkpointer(str(tmp_path))
  assert ckpt.full_steps() == [2, 3] and _items(tmp_path, 1) == ["params"]
  jax.tree.map(np.testing.assert_array_equal, ckpt.restore_params(1), stored[1])


def test_checkpoints_of_the_whole_state_layout_resume_and_average(tmp_path):
  """A workdir written before parameter snapshots (one `state` item) still resumes and
  averages; such a checkpoint is left whole."""
  params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
  state = {"params": params, "step": np.asarray(5, np.int32), "opt_state": {"m": params}}
  manager = ocp.CheckpointManager(tmp_path / "checkpoints", item_names=("state", "data", "meta"))
  manager.save(5, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                          data=ocp.args.JsonSave({"next_index": 5}),
                                          meta=ocp.args.JsonSave({"step": 5})))
  manager.wait_until_finished()
  manager.close()
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
  step, restored, data_state, _ = checkpoint.Checkpointer(str(tmp_path)).restore_latest(
      abstract)
  assert (step, data_state) == (5, {"next_index": 5})
  jax.tree.map(np.testing.assert_array_equal, restored, state)
  jax.tree.map(np.testing.assert_array_equal, averaging.average_params(str(tmp_path), 1)[0],
               params)


def test_on_the_cpu_a_replicated_array_is_saved_whole_from_one_replica(tmp_path):
  """Orbax's default outside GPUs writes each replicated array in one slice per replica, and
  each slice is a program to compile; on the CPU the replicas share the host's memory, so the
  project's checkpoints take one replica whole and compile nothing to save."""
  assert jax.default_backend() == "cpu" and jax.device_count() == 8
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  # A shape no other test saves, so that no program it would need is compiled already.
  kernel = jax.device_put(np.arange(8 * 13 * 7, dtype=np.float32).reshape(8 * 13, 7),
                          replicated)
  state = {"params": {"kernel": kernel}, "step": np.asarray(1, np.int32),
           "opt_state": {"kernel": kernel}}
  ckpt = checkpoint.Checkpointer(str(tmp_path))
  compiled = []
  with jax.log_compiles(True):
    logger = logging.getLogger("jax")
    handler = logging.Handler()
    handler.emit = lambda record: compiled.append(record.getMessage())
    logger.addHandler(handler)
    try:
      ckpt.save(1, state, {}, {})
      ckpt.wait()
    finally:
      logger.removeHandler(handler)
  restored = ckpt.restore_params(1)
  ckpt.close()
  # JAX says "Compiling" for each program it lowers, whether or not its cache then holds it.
  assert not [m for m in compiled if m.startswith("Compiling ")], compiled
  np.testing.assert_array_equal(restored["kernel"], np.asarray(kernel))
