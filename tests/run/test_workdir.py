"""The config a workdir keeps: round trip, differences, one-line errors."""

import dataclasses
import errno
import json
import os
import pathlib
import socket
import subprocess
from typing import Annotated, Literal

import pytest

from configs import base, demo
from transformer.model import config as model_config
from transformer.run import schema, workdir
from transformer.errors import ConfigError, DiskFull


def test_saved_config_loads_back_equal(tmp_path):
  config = demo.get_config()
  workdir.save_config(tmp_path, config)
  loaded = workdir.load_config(tmp_path)
  assert workdir.differences(config, loaded) == []
  assert loaded.data.packing is True and loaded.model.d_model == 128


def test_differences_name_dotted_keys_and_can_be_limited():
  a, b = base.get_config(), base.get_config()
  b.model.d_model = 256
  b.num_train_steps = 5
  b.data.bucket_boundaries = (8, 16)
  assert workdir.differences(a, b) == ["data.bucket_boundaries", "model.d_model",
                                       "num_train_steps"]
  assert workdir.differences(a, b, keys=("model", "data")) == ["data.bucket_boundaries",
                                                              "model.d_model"]


def test_missing_config_says_how_to_proceed(tmp_path):
  with pytest.raises(ConfigError, match=r"no config.json in .*: .*train first, or pass --config"):
    workdir.load_config(tmp_path)


def test_config_from_another_version_is_one_line(tmp_path):
  (tmp_path / "config.json").write_text('{"model": {"d_model": 8}}')
  with pytest.raises(ConfigError, match=r"config.json: config.data is missing .*incompatible") as e:
    workdir.load_config(tmp_path)
  assert "\n" not in str(e.value)
  (tmp_path / "config.json").write_text('{"model": ')
  with pytest.raises(ConfigError, match=r"config.json cannot be read"):
    workdir.load_config(tmp_path)


def test_a_second_trainer_is_refused_while_the_first_runs(tmp_path):
  with workdir.TrainerLock(tmp_path):
    with pytest.raises(ConfigError, match=rf"in use by another trainer \(PID {os.getpid()} "):
      workdir.TrainerLock(tmp_path).__enter__()
  assert not (tmp_path / "train.lock").exists()  # released


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, caplog):
  dead = _dead_pid()
  (tmp_path / "train.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": dead}))
  with workdir.TrainerLock(tmp_path):
    assert json.loads((tmp_path / "train.lock").read_text())["pid"] == os.getpid()
  assert f"left by process {dead}, which has ended" in caplog.text


def test_a_lock_from_another_host_is_not_taken_over(tmp_path):
  (tmp_path / "train.lock").write_text(json.dumps({"host": "elsewhere", "pid": 1}))
  with pytest.raises(ConfigError, match=r"PID 1 on elsewhere.*delete .*train.lock"):
    workdir.TrainerLock(tmp_path).__enter__()


def test_a_lock_that_cannot_be_read_is_one_line_saying_what_to_do(tmp_path):
  """Empty: a trainer taking it this moment, or one that stopped while taking it."""
  (tmp_path / "train.lock").write_text("")
  with pytest.raises(ConfigError, match=r"train.lock cannot be read: .* delete it if no "
                     rf"trainer runs in {tmp_path}$"):
    workdir.TrainerLock(tmp_path).__enter__()


def test_a_lock_released_while_it_is_read_is_taken(tmp_path, monkeypatch):
  """The first trainer ends between the second's attempt to create the lock and its reading
  of it: the second takes it, where it was refused, naming "PID None on None"."""
  (tmp_path / "train.lock").write_text(json.dumps({"host": "elsewhere", "pid": 1}))
  read_text = pathlib.Path.read_text

  def released_meanwhile(path, *args, **kwargs):
    if path.name == "train.lock":
      path.unlink()
    return read_text(path, *args, **kwargs)

  monkeypatch.setattr(pathlib.Path, "read_text", released_meanwhile)
  with workdir.TrainerLock(tmp_path):
    assert json.loads(read_text(tmp_path / "train.lock"))["pid"] == os.getpid()


def test_a_full_disk_while_taking_the_lock_leaves_no_lock(tmp_path, monkeypatch):
  def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(workdir.json, "dump", no_space)
  with pytest.raises(DiskFull, match=r"while writing the trainer lock to .*train.lock"):
    workdir.TrainerLock(tmp_path).__enter__()
  assert not (tmp_path / "train.lock").exists()  # the next trainer is not refused
  monkeypatch.undo()
  with workdir.TrainerLock(tmp_path):
    pass


def test_resume_config_rules():
  saved, requested = base.get_config(), base.get_config()
  requested.data.files_dir = "/elsewhere"  # paths and speed settings may change
  requested.data.read_threads = 8
  requested.compilation_cache_dir = ""
  requested.cpu_workarounds = "off"
  assert workdir.check_resume_config(saved, requested, allow_changes=False) == [
      "compilation_cache_dir", "cpu_workarounds", "data.files_dir", "data.read_threads"]
  requested.num_train_steps = 5
  with pytest.raises(ConfigError, match=r"num_train_steps=100000 \(now 5\); pass "
                     r"--allow_config_changes"):
    workdir.check_resume_config(saved, requested, allow_changes=False)
  assert "num_train_steps" in workdir.check_resume_config(saved, requested, allow_changes=True)
  requested.data.max_source_len = 100
  with pytest.raises(ConfigError, match=r"data.max_source_len=256 \(now 100\); a run of "
                     r"another model or corpus needs a new workdir"):
    workdir.check_resume_config(saved, requested, allow_changes=True)


def _dead_pid() -> int:
  process = subprocess.Popen(["true"])
  process.wait()
  return process.pid


def test_config_for_uses_the_saved_config_or_checks_the_given_one(tmp_path):
  saved = demo.get_config()
  workdir.save_config(tmp_path, saved)
  assert workdir.config_for(tmp_path).model.d_model == 128
  given = demo.get_config()
  given.decode.beam_size = 1  # decoding, paths and dropout may change after training
  given.model.dropout_rate = 0.3
  given.data.files_dir = "/elsewhere"
  assert workdir.config_for(tmp_path, given) is given
  given.model.d_model, given.model.num_layers = 256, 4
  with pytest.raises(ConfigError, match=r"another model .*config.json has model\.d_model=128 "
                     r"\(now 256\), model\.num_layers=2 \(now 4\); drop --config") as e:
    workdir.config_for(tmp_path, given)
  assert "\n" not in str(e.value)


def test_config_for_takes_the_given_config_where_none_was_saved(tmp_path):
  given = base.get_config()
  assert workdir.config_for(tmp_path, given) is given
  with pytest.raises(ConfigError, match="no config.json"):
    workdir.config_for(tmp_path)


def test_config_for_takes_the_given_config_over_an_older_saved_one(tmp_path):
  saved = demo.get_config()
  workdir.save_config(tmp_path, saved)
  text = json.loads(workdir.config_path(tmp_path).read_text())
  del text["num_average"]  # a key this version has and the saved file's version had not
  workdir.config_path(tmp_path).write_text(json.dumps(text))
  with pytest.raises(ConfigError, match="incompatible"):
    workdir.config_for(tmp_path)
  given = demo.get_config()
  assert workdir.config_for(tmp_path, given) is given
  given.model.d_k = 8
  with pytest.raises(ConfigError, match=r"model\.d_k=32 \(now 8\)"):
    workdir.config_for(tmp_path, given)


@dataclasses.dataclass(frozen=True)
class _Extended(model_config.ModelConfig):
  """ModelConfig with an architecture field and an implementation switch more."""

  mixer: Literal["attention", "convolution"] = "attention"
  fused_kernels: Annotated[bool, model_config.PATH_OR_SPEED] = False


def test_identity_keys_are_the_model_fields_but_dropout_and_implementation_switches(
    monkeypatch):
  switches = {"model.dropout_rate", "model.attention_dropout_rate", "model.attention_impl",
              "model.remat"}
  fields = {f"model.{name}" for name in model_config.config_fields()}
  assert fields - switches <= set(workdir.IDENTITY_KEYS)
  assert not switches & set(workdir.IDENTITY_KEYS)
  # A field declared in ModelConfig is an identity key with no list to update...
  monkeypatch.setattr(model_config, "ModelConfig", _Extended)
  assert "model.mixer" in schema.identity_keys()
  # ...unless its type says it only changes how the model is computed.
  assert "model.fused_kernels" not in schema.identity_keys()
  assert "model.fused_kernels" in schema.path_or_speed_keys()


def _predating(tmp_path, *keys: str, seed: int = 3) -> dict:
  """A demo workdir's config.json as a version before `keys` existed wrote it."""
  config = demo.get_config()
  config.seed = seed
  workdir.save_config(tmp_path, config)
  text = json.loads(workdir.config_path(tmp_path).read_text())
  for key in keys:
    *parents, name = key.split(".")
    node = text
    for parent in parents:
      node = node[parent]
    del node[name]
  workdir.config_path(tmp_path).write_text(json.dumps(text))
  return text


def test_a_workdir_predating_data_seed_reads_and_resumes_as_it_was_trained(tmp_path, caplog):
  saved = _predating(tmp_path, "data.seed", "keep_full_checkpoints", seed=3)
  # Before data.seed, the run's seed sampled the vocabulary; before keep_full_checkpoints,
  # every checkpoint was full.
  loaded = workdir.load_config(tmp_path)
  assert loaded.data.seed == 3 and loaded.keep_full_checkpoints == loaded.keep_checkpoints
  requested = demo.get_config()
  requested.seed = 3
  assert requested.data.seed == 0
  filled = workdir.fill_added_keys(saved)
  assert filled == {"data.seed": 3, "keep_full_checkpoints": loaded.keep_checkpoints}
  with caplog.at_level("INFO"):
    workdir.keep_added_keys(requested, filled)
  # The resumed run samples as it did; a key that may change on resume is the request's.
  assert requested.data.seed == 3 and requested.keep_full_checkpoints == 2
  assert "predates config.data.seed: this run keeps 3" in caplog.text
  # A tool given --config for the workdir finds its vocabulary the same way.
  given = demo.get_config()
  assert workdir.config_for(tmp_path, given) is given and given.data.seed == 3
  assert workdir.check_resume_config(saved, requested, allow_changes=False) == [
      "keep_full_checkpoints"]  # allowed: it only says how much is kept
  # A workdir that has the key is read as it is.
  workdir.save_config(tmp_path, demo.get_config())
  assert workdir.fill_added_keys(json.loads(workdir.config_path(tmp_path).read_text())) == {}


# The keys of the departures after the paper (configs/modern.py).
_MODERN_KEYS = ("model.norm_type", "model.activation", "model.ffn_match_params",
                "model.glu_biases", "model.shaw_clip", "model.num_kv_heads", "model.qk_norm",
                "model.tie_embeddings", "model.biases", "optimizer", "weight_decay",
                "model.qk_norm_length", "lr_schedule", "wsd_decay_fraction", "z_loss")


def test_a_workdir_predating_the_modern_switches_reads_as_the_papers_recipe(tmp_path):
  saved = _predating(tmp_path, *_MODERN_KEYS)
  loaded = workdir.load_config(tmp_path)
  assert workdir.differences(loaded, demo.get_config()) == ["seed"]  # _predating's seed
  filled = workdir.fill_added_keys(saved)
  assert set(filled) == set(_MODERN_KEYS)
  requested = demo.get_config()
  requested.seed = 3
  assert workdir.check_resume_config(saved, requested, allow_changes=False) == []


def test_the_run_seed_is_not_what_a_trained_model_is_and_data_seed_is():
  assert "seed" not in workdir.IDENTITY_KEYS and "data.seed" in workdir.IDENTITY_KEYS


def test_a_gated_workdir_predating_glu_biases_keeps_its_feed_forward_biases(tmp_path):
  """Before `model.glu_biases`, a gated feed-forward had biases on W, V and W2: a workdir
  trained then reads as such, and one resumed with today's default keeps them."""
  config = demo.get_config()
  config.model.activation = "swiglu"
  workdir.save_config(tmp_path, config)
  text = json.loads(workdir.config_path(tmp_path).read_text())
  del text["model"]["glu_biases"]
  workdir.config_path(tmp_path).write_text(json.dumps(text))
  assert workdir.load_config(tmp_path).model.glu_biases is True
  requested = demo.get_config()
  requested.model.activation = "swiglu"
  workdir.keep_added_keys(requested, workdir.fill_added_keys(text))
  assert requested.model.glu_biases is True
  assert workdir.check_resume_config(text, requested, allow_changes=False) == []


@pytest.mark.parametrize("saved_value, now", [(True, "rms"), (False, "none")])
def test_a_workdir_from_when_qk_norm_was_true_or_false_reads_as_the_rms_form(
    tmp_path, saved_value, now):
  """`model.qk_norm` was a bool when the RMS form was the only one: such a config.json reads
  as the form it trained, and resumes under today's name without a difference."""
  config = demo.get_config()
  config.model.qk_norm = now
  workdir.save_config(tmp_path, config)
  text = json.loads(workdir.config_path(tmp_path).read_text())
  text["model"]["qk_norm"] = saved_value
  del text["model"]["qk_norm_length"]
  workdir.config_path(tmp_path).write_text(json.dumps(text))
  assert workdir.load_config(tmp_path).model.qk_norm == now
  filled = workdir.fill_added_keys(text)
  assert text["model"]["qk_norm"] == now and "model.qk_norm" not in filled
  assert workdir.check_resume_config(text, config, allow_changes=False) == []
  assert workdir.config_for(tmp_path, config) is config
