"""A full disk: one line naming what was written, the checkpoints before it kept; and the disk
that checkpoints need, known before they are written.

A full disk is simulated where orbax hands an array to TensorStore
(`fail_saves_for_want_of_space`): the write raises what TensorStore raises on a full
filesystem while the item's other arrays are still being written, and other writes of the
same file fail unawaited, so orbax's own reporting of the failure (tracebacks logged from its
threads, writes abandoned in its closed event loop, errors never retrieved) happens as it does
on a real full disk; CI needs no small filesystem.
"""

import asyncio
import errno
import json
import logging
import os
import pathlib
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from orbax.checkpoint._src.serialization import serialization as orbax_serialization

from tests import support
from transformer import errors
from transformer.data import datasets
from transformer.data import tokenizer as tokenizer_lib
from transformer.model import transformer as model_lib
from transformer.run import checkpoint
from transformer.run import checkpoint_layout
from transformer.run import disk
from transformer.run import workdir as workdir_lib
from transformer.training import metric_writer
from transformer.training import optimizer
from transformer.training import steps as steps_lib

REPO = pathlib.Path(__file__).resolve().parents[2]
_SERIALIZE = "async_serialize_from_host"  # orbax's write of one array through TensorStore


def failing_serialize(original, step: int):
  """`original` (orbax's `async_serialize_from_host`), except that in the save of `step`
  the first array's write fails as TensorStore's does when the disk is full, after the
  other writes have started.

  With it fail three more writes of the same file that nobody awaits, as on a real full
  disk: orbax's event loop stops at the first failure, and the writes that failed in its
  last turn keep errors nobody retrieved, in tasks reached from the failure's traceback
  (here this frame's `abandoned`), which orbax holds. asyncio reports each ("Task exception
  was never retrieved") when its task is collected: at exit, or whenever orbax lets go."""
  failed = []

  async def serialize(rslices_on_host, tensorstore_spec, **kwargs):
    spec = json.dumps(tensorstore_spec)
    if f"{os.sep}{step}.orbax-checkpoint-tmp" not in spec or failed:
      return await original(rslices_on_host, tensorstore_spec, **kwargs)
    failed.append(step)
    base = json.loads(spec)["kvstore"]["base"]
    path = base["path"] if isinstance(base, dict) else base
    error = (f'RESOURCE_EXHAUSTED: Error writing "params/0" in OCDBT database at local file '
             f'"{path}": Failed to write 1375050 bytes to file 11: No space left on device '
             "[os_error_code='28']")

    async def write_of_the_same_file():
      raise ValueError(error)

    abandoned = [asyncio.ensure_future(write_of_the_same_file()) for _ in range(3)]
    await asyncio.sleep(0)  # they fail before this write does
    assert all(task.done() for task in abandoned)
    raise ValueError(error)

  return serialize


def fail_saves_for_want_of_space(monkeypatch, step: int) -> None:
  """Makes the checkpoint save of `step` run out of disk space (see the module docstring)."""
  monkeypatch.setattr(orbax_serialization, _SERIALIZE,
                      failing_serialize(getattr(orbax_serialization, _SERIALIZE), step))


def _trained_like_state(config):
  """A tiny train state whose moments are as incompressible as a trained model's (Adam's
  moments start at zero, which orbax's compression would shrink to nothing)."""
  model, tx = model_lib.build_model(config), optimizer.create_optimizer(config)
  state = jax.jit(lambda: steps_lib.create_train_state(model, tx, jax.random.key(0)))()
  rng = np.random.default_rng(0)
  return jax.tree.map(lambda x: x + rng.normal(size=x.shape).astype(x.dtype) * 1e-3
                      if x.dtype == jnp.float32 else x, state)


def test_a_save_that_fills_the_disk_is_one_line_and_keeps_the_checkpoints_before_it(
    tmp_path, monkeypatch, capfd, caplog):
  state = _trained_like_state(support.tiny_config())
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
  fail_saves_for_want_of_space(monkeypatch, 3)
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=5, keep_full=2)

  def save(step):
    ckpt.save(step, state.replace(step=jnp.array(step, jnp.int32)), {"next_index": step},
              {"step": step})

  save(1)
  save(2)
  with pytest.raises(errors.DiskFull) as full:
    save(3)
    ckpt.wait()
  message = str(full.value)
  assert message == (f"No space left on device while writing checkpoint 3 to {tmp_path}/"
                     "checkpoints; make room there (or point the run at another disk) and run "
                     "the same command again")
  assert checkpoint_layout.resume_step(str(tmp_path)) == 2
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2", "3.orbax-checkpoint-tmp"]
  assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
  stderr = capfd.readouterr().err
  assert "Traceback" not in stderr and "Event loop is closed" not in stderr, stderr[-3000:]

  monkeypatch.undo()  # room made: the next trainer removes the unfinished save and resumes
  again = checkpoint.Checkpointer(str(tmp_path), keep=5, keep_full=2)
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2"]
  step, restored, data_state, _ = again.restore_latest(abstract)
  assert (step, data_state) == (2, {"next_index": 2})
  jax.tree.map(np.testing.assert_array_equal, restored.params, state.params)


def failing_write_text(original, step: int):
  """`original` (orbax's `async_path.write_text`, which writes a checkpoint's small metadata
  files), except that in the save of `step` it fails as a full disk does when the file is
  closed: an OSError that names no file."""

  async def write_text(path, text):
    if f"{os.sep}{step}.orbax-checkpoint-tmp" in str(path):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return await original(path, text)

  return write_text


# A trainer's run in a fresh process, through the launcher: its third save fills the disk,
# in the arrays' writes or in orbax's metadata files.
_FULL_DISK_RUN = """
import os
import jax.numpy as jnp
import numpy as np
from orbax.checkpoint._src.path import async_path
from orbax.checkpoint._src.serialization import serialization
from tests.run.test_disk import failing_serialize, failing_write_text, _SERIALIZE
from transformer import cli
from transformer.run import checkpoint

if os.environ["FULL_DISK_IN"] == "arrays":
  setattr(serialization, _SERIALIZE, failing_serialize(getattr(serialization, _SERIALIZE), 3))
else:
  async_path.write_text = failing_write_text(async_path.write_text, 3)

def main(argv):
  ckpt = checkpoint.Checkpointer(os.environ["WORKDIR"], keep=5, keep_full=2)
  rng = np.random.default_rng(0)
  for step in (1, 2, 3, 4):
    params = {f"w{i}": jnp.asarray(rng.normal(size=(64, 64)), jnp.float32) for i in range(12)}
    ckpt.save(step, {"params": params, "step": jnp.asarray(step, jnp.int32),
                     "opt_state": params}, {}, {"step": step})
  ckpt.wait()

cli.run(main)
"""


@pytest.mark.parametrize("where", ["arrays", "metadata"])
def test_a_full_disk_ends_the_command_with_one_line(tmp_path, where):
  """Through the launcher, in a process of its own: one line on stderr, exit status 2, no
  traceback (orbax's, or its event loop's, from any thread, or asyncio's for the writes it
  abandoned), nothing complete deleted."""
  run = subprocess.run([sys.executable, "-c", _FULL_DISK_RUN], cwd=REPO,
                       env=dict(os.environ, PYTHONPATH=str(REPO), WORKDIR=str(tmp_path),
                                FULL_DISK_IN=where, TRANSFORMER_KEEP_FREED_MEMORY="0"),
                       capture_output=True, text=True, timeout=120)
  lines = run.stderr.strip().splitlines()
  assert run.returncode == 2, run.stderr[-3000:]
  assert lines == [f"error: No space left on device while writing checkpoint 3 to {tmp_path}/"
                   "checkpoints; make room there (or point the run at another disk) and run "
                   "the same command again"], run.stderr[-3000:]
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2", "3.orbax-checkpoint-tmp"]


def _no_room(*args, **kwargs):
  raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _vocabulary(folder):
  path = folder / "spm.model"
  tokenizer_lib.train_vocabulary([f"satz nummer {i} mit worten" for i in range(300)], path,
                                 vocab_size=60)
  return path


def test_the_metrics_log_and_the_vocabulary_name_themselves_when_the_disk_fills(
    tmp_path, monkeypatch):
  writer = metric_writer.MetricWriter(str(tmp_path), total_steps=10)
  monkeypatch.setattr("builtins.open", _no_room)
  with pytest.raises(errors.DiskFull, match=rf"^No space left on device while writing the "
                     rf"metrics log to {tmp_path}/metrics.jsonl; make room"):
    writer.write(1, {"loss": 1.0})
  monkeypatch.undo()
  writer.close()
  monkeypatch.setattr(os, "fsync", _no_room)
  path = tmp_path / "data" / "spm.model"
  with pytest.raises(errors.DiskFull, match=rf"writing the vocabulary to {path};"):
    _vocabulary(tmp_path / "data")
  assert not list((tmp_path / "data").iterdir())  # no part-written file left behind


def _config_json(folder):
  workdir_lib.save_config(folder, support.tiny_config())
  return folder / "config.json"


def _metrics_log_cut_back(folder):
  (folder / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in (1, 2, 3)))
  metric_writer.MetricWriter(str(folder), total_steps=10, start_step=2).close()
  assert (folder / "metrics.jsonl").read_text().count("step") == 2
  return folder / "metrics.jsonl"


def _token_cache(folder):
  support.write_pairs(folder / "corpus", n=20)
  config = support.files_config(folder / "corpus")
  source = datasets.split_sources(config, folder / "cache", ("train",))["train"]
  tok = tokenizer_lib.get_or_train(config, folder / "cache", source)
  datasets.tokenize(source, tok, folder / "cache")
  return datasets.tokenized_cache_path(source, tok, folder / "cache")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names open files by /proc")
@pytest.mark.parametrize("write", [_config_json, _vocabulary, _metrics_log_cut_back,
                                   _token_cache],
                         ids=["config.json", "vocabulary", "metrics log cut back on resume",
                              "tokenized cache"])
def test_a_file_a_run_resumes_from_is_on_disk_before_it_replaces_the_old(tmp_path, monkeypatch,
                                                                        write):
  """Written to a temporary file, flushed to disk (fsync), then renamed over the old: after a
  power cut the file is the old one or the new one, never empty or cut short."""
  events, fsync, replace = [], os.fsync, os.replace
  monkeypatch.setattr(os, "fsync", lambda fd: events.append(
      ("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or fsync(fd))
  monkeypatch.setattr(os, "replace", lambda src, dst: events.append(
      ("replace", os.fspath(src), os.fspath(dst))) or replace(src, dst))
  path = write(tmp_path)
  (moved,) = [e for e in events if e[0] == "replace" and e[2] == str(path)]
  flushed = {e[1] for e in events[:events.index(moved)] if e[0] == "fsync"}
  if path.is_dir():  # every file of a folder renamed whole
    assert {f"{moved[1]}/{p.name}" for p in path.iterdir()} <= flushed, events
  else:
    assert moved[1] in flushed, events


def test_disk_full_reason_reads_errno_quota_and_tensorstore_text():
  assert errors.disk_full_reason(OSError(errno.ENOSPC, "x")) == "No space left on device"
  assert errors.disk_full_reason(OSError(errno.EDQUOT, "x")) == "Disk quota exceeded"
  tensorstore = ValueError("RESOURCE_EXHAUSTED: ... No space left on device "
                           "[os_error_code='28']")
  try:
    try:
      raise tensorstore
    except ValueError as e:
      raise RuntimeError("orbax: save failed") from e
  except RuntimeError as e:
    assert errors.disk_full_reason(e) == "No space left on device"
  assert errors.disk_full_reason(OSError(errno.EACCES, "Permission denied")) is None
  assert errors.disk_full_reason(ValueError("Event loop is closed")) is None


# (model, the most the estimate may be above the bytes written). How many files orbax writes for
# the same state varies from save to save (30-39 here, as its writes happen to be grouped), and
# so do the bytes: over 56 and 37 saves on 2 CPU cores, the estimate was 6-21% above for the tiny
# model of 23k parameters, where orbax's metadata per array is a large share of each file, and
# 6-10% above for the 147k parameters of the synthetic pair's model, where compression is most
# of the difference (8-9% for the demo's 1.05M).
_ESTIMATE_MARGINS = [(support.tiny_config, 1.3), (lambda: support.synthetic_tiny(steps=24), 1.15)]


@pytest.mark.parametrize("config, margin", _ESTIMATE_MARGINS, ids=["23k", "147k"])
def test_the_estimate_matches_the_bytes_written(tmp_path, config, margin):
  """Never below the bytes written, and at most `margin` times them."""
  state = _trained_like_state(config())
  full, snapshot = disk.checkpoint_bytes(state)
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=2, keep_full=1)
  for step in (1, 2):
    ckpt.save(step, state.replace(step=jnp.array(step, jnp.int32)), {"next_index": step},
              {"step": step})
  ckpt.wait()
  written_full = disk.used_bytes(str(tmp_path / "checkpoints" / "2"))
  written_snapshot = disk.used_bytes(str(tmp_path / "checkpoints" / "1"))
  assert written_full <= full <= margin * written_full, (full, written_full)
  assert written_snapshot <= snapshot <= margin * written_snapshot, (snapshot, written_snapshot)
  assert disk.peak_bytes(full, snapshot, keep=20, keep_full=2) == 3 * full + 18 * snapshot


def test_too_little_room_is_one_warning_with_the_numbers(tmp_path, monkeypatch, caplog):
  params = {"w": jax.ShapeDtypeStruct((1000, 1000), jnp.float32)}  # 4 MB
  state = {"params": params, "step": jax.ShapeDtypeStruct((), jnp.int32),
           "opt_state": (params, params)}
  monkeypatch.setattr(disk.shutil, "disk_usage",
                      lambda _: types.SimpleNamespace(free=30_000_000))
  caplog.set_level(logging.INFO)
  disk.report(str(tmp_path / "checkpoints"), state, keep=5, keep_full=2)
  (info,) = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
  assert info.startswith("checkpoints: 12.0 MB full, 4.0 MB parameters only; "
                         "keep_checkpoints=5 with keep_full_checkpoints=2 hold up to 48.1 MB")
  (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert "has 30.0 MB free, but the checkpoints will need 48.1 MB more" in warning
