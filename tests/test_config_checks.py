"""Bad configs and workdirs stop the run before compiling, with one line naming the key."""

import os
import pathlib
import subprocess
import sys

import pytest

from configs import base, big
from transformer import config_checks

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("key,value,message", [
    ("model.d_model", 0, r"config.model.d_model=0 must be a positive integer"),
    ("model.num_heads", -2, r"config.model.num_heads=-2 must be a positive integer"),
    ("data.tokens_per_batch", 0, r"config.data.tokens_per_batch=0"),
    ("model.dropout_rate", 1.0, r"config.model.dropout_rate=1.0 must be in \[0, 1\)"),
    ("model.attention_dropout_rate", -0.1, r"attention_dropout_rate=-0.1 must be in"),
    ("label_smoothing", 1.5, r"config.label_smoothing=1.5"),
    ("model.positional", "rotary", r"'sinusoidal', 'learned'"),
    ("model.norm", "mid", r"'post', 'pre'"),
    ("parallelism", "pjit", r"'jit', 'pmap'"),
    ("model.d_model", 511, r"must be even"),
])
def test_bad_values_name_the_key(key, value, message):
  config = base.get_config()
  parent, leaf = key.rsplit(".", 1) if "." in key else (None, key)
  (config[parent] if parent else config)[leaf] = value
  with pytest.raises(config_checks.ConfigError, match=message):
    config_checks.validate(config)


def test_paper_configs_are_valid():
  config_checks.validate(base.get_config())
  config_checks.validate(big.get_config())


def test_workdir_under_a_file_cannot_be_written(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(config_checks.ConfigError, match=f"workdir '{blocker}/run' cannot be"):
    config_checks.check_workdir(str(blocker / "run"))


@pytest.mark.parametrize("override,message", [
    ("--config.model.bogus=3", "unknown config key in --config.model.bogus"),
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
