"""Bad configs and workdirs stop the run before compiling, with one line naming the key."""

import os
import pathlib
import subprocess
import sys

import pytest

from configs import base, big
from transformer.run import config_checks

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("key,value,message", [
    ("model.d_model", 0, r"config.model.d_model=0 must be a positive integer"),
    ("model.num_heads", -2, r"config.model.num_heads=-2 must be a positive integer"),
    ("data.tokens_per_batch", 0, r"config.data.tokens_per_batch=0"),
    ("model.dropout_rate", 1.0, r"config.model.dropout_rate=1.0 must be in \[0, 1\)"),
    ("model.attention_dropout_rate", -0.1, r"attention_dropout_rate=-0.1 must be in"),
    ("label_smoothing", 1.5, r"config.label_smoothing=1.5"),
    ("model.positional", "rotary", r"'sinusoidal', 'learned'"),
    ("model.norm", "mid", r"'post', 'pre'"),
    ("parallelism", "pjit", r"config.parallelism='pjit' is not one of 'jit', 'pmap'"),
    ("model.d_model", 511, r"must be even"),
    ("model.bogus", 1, r"unknown key config.model.bogus; config.model takes attention_"),
    ("data.dataset", "wmt", r"config.data.dataset='wmt' is not one of 'tfds', 'files'"),
    ("data.vocab_model_type", "wordpiece", r"vocab_model_type='wordpiece' is not one of 'bpe'"),
    ("data.max_source_len", 600, r"max_source_len/max_target_len=600 exceeds "
     r"config.model.max_len=512"),
    ("data.bucket_boundaries", (0, 8), r"bucket_boundaries=\(0, 8\): lengths must be positive"),
    ("decode.length_penalty", -0.5, r"length_penalty=-0.5 must be >= 0"),
    ("decode.batch_size", 0, r"config.decode.batch_size=0 must be a positive integer"),
])
def test_bad_values_name_the_key(key, value, message):
  config = base.get_config()
  parent, leaf = key.rsplit(".", 1) if "." in key else (None, key)
  (config[parent] if parent else config)[leaf] = value
  with pytest.raises(config_checks.ConfigError, match=message):
    config_checks.validate(config)


@pytest.mark.parametrize("updates,message", [
    (dict(packing=True, packed_length=32, max_source_len=40, max_target_len=40),
     r"packed_length=32 is shorter than the longest allowed pair \(40"),
    (dict(packing=True, packed_length=600), r"packed_length=600 exceeds config.model.max_len"),
])
def test_packing_lengths_fit_the_pairs_and_the_model(updates, message):
  config = base.get_config()
  config.data.update(updates)
  with pytest.raises(config_checks.ConfigError, match=message):
    config_checks.validate(config)


@pytest.mark.parametrize("parallelism,mesh,message", [
    ("jit", dict(data=-1, fsdp=-1), r"at most one axis may be -1"),
    ("jit", dict(data=0), r"sizes must be positive or -1"),
    ("pmap", dict(data=4, fsdp=2), r"'pmap' replicates the state: config.mesh.fsdp=2"),
])
def test_mesh_shapes_that_cannot_work(parallelism, mesh, message):
  config = base.get_config()
  config.parallelism = parallelism
  config.mesh.update(mesh)
  with pytest.raises(config_checks.ConfigError, match=message) as error:
    config_checks.validate(config)
  assert "\n" not in str(error.value)


def test_paper_configs_are_valid():
  config_checks.validate(base.get_config())
  config_checks.validate(big.get_config())


def test_workdir_under_a_file_cannot_be_written(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(config_checks.ConfigError, match=f"workdir '{blocker}/run' cannot be"):
    config_checks.check_workdir(str(blocker / "run"))


@pytest.mark.parametrize("override,message", [
    ("--config.model.d_modle=3", "unknown config key model.d_modle; did you mean model.d_model?"),
    ("--config.modle.d_model=3", "unknown config key modle.d_model; did you mean model?"),
    ("--config.model.dropout_rate=1.5", "config.model.dropout_rate=1.5 must be in [0, 1)"),
])
def test_cli_prints_one_line_and_exits_2(tmp_path, override, message):
  result = subprocess.run(
      [sys.executable, "train.py", "--config=configs/demo.py", f"--workdir={tmp_path}/w",
       override], cwd=REPO, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
  assert "Traceback" not in result.stderr
  assert not os.path.exists(tmp_path / "w" / "checkpoints")


def test_a_missing_key_is_named():
  config = base.get_config()
  del config.decode["length_penalty"]
  with pytest.raises(config_checks.ConfigError, match=r"config.decode.length_penalty is missing"):
    config_checks.validate(config)
