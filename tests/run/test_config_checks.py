"""Bad configs and workdirs stop the run before compiling, with one line naming the key."""

import dataclasses
import functools
import os
import pathlib
import subprocess
import sys
from typing import Literal

import ml_collections
import pytest

from configs import base, big, demo, table3
from transformer.model import config as model_config
from transformer.run import config_checks, schema, workdir

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
    ("model.bogus", 1, r"unknown key config.model.bogus; config.model takes activation, "
     r"attention_"),
    ("data.dataset", "wmt", r"config.data.dataset='wmt' is not one of 'tfds', 'files'"),
    ("data.vocab_model_type", "wordpiece", r"vocab_model_type='wordpiece' is not one of 'bpe'"),
    ("data.max_source_len", 600, r"max_source_len/max_target_len=600 exceeds "
     r"config.model.max_len=512"),
    ("data.bucket_boundaries", (0, 8), r"bucket_boundaries=\(0, 8\): lengths must be positive"),
    ("decode.length_penalty", -0.5, r"length_penalty=-0.5 must be >= 0"),
    ("decode.batch_size", 0, r"config.decode.batch_size=0 must be a positive integer"),
    ("model.num_kv_heads", 3, r"config.model.num_kv_heads=3 must divide num_heads=8"),
    ("model.norm_type", "batchnorm", r"norm_type='batchnorm' is not one of 'layernorm', "),
    ("model.activation", "tanh", r"activation='tanh' is not one of 'relu', 'gelu', 'swish', "),
    ("model.ffn_match_params", True, r"ffn_match_params=True scales gated feed-forwards only "
     r"\(activation one of 'reglu', 'geglu', 'swiglu'; got 'relu'\)"),
    ("model.tie_embeddings", "all", r"tie_embeddings='all' is not one of 'three_way', "),
    ("model.shaw_clip", 0, r"config.model.shaw_clip=0 must be a positive integer"),
    ("optimizer", "sgd", r"config.optimizer='sgd' is not one of 'adam', 'adamw', 'adafactor'"),
    ("weight_decay", 0.1, r"config.weight_decay=0.1 needs optimizer='adamw' \(decoupled "),
    ("weight_decay", -0.1, r"config.weight_decay=-0.1 must be a number >= 0"),
    ("lr_schedule", "linear", r"lr_schedule='linear' is not one of 'inverse_sqrt', 'cosine'"),
    ("wsd_decay_fraction", 0.0, r"config.wsd_decay_fraction=0.0 must be in \(0, 1\]"),
    ("z_loss", -1e-4, r"config.z_loss=-0.0001 must be a number >= 0"),
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


@pytest.mark.parametrize("updates,message", [
    (dict(positional="rope", d_k=9, d_v=9), r"config.model.d_k=9 must be even for "
     r"positional='rope'"),
    (dict(positional="shaw", attention_impl="xla"), r"config.model.positional='shaw' needs "
     r"attention_impl='reference' \(got 'xla'\)"),
])
def test_position_schemes_check_what_they_need(updates, message):
  config = base.get_config()
  config.model.update(updates)
  with pytest.raises(config_checks.ConfigError, match=message):
    config_checks.validate(config)
  config.model.update(positional="t5")  # the bias form takes both
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
    # No loss scaling: float16 trains on gradients that underflow; bfloat16 is named instead.
    ("--config.dtype=float16", "config.dtype='float16' is refused for training: there is no "
     "loss scaling, so small gradients underflow to zero; use 'bfloat16'"),
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


@dataclasses.dataclass(frozen=True)
class _Extended(model_config.ModelConfig):
  """ModelConfig with a value and a field more, as a new architecture would declare them."""

  positional: Literal["sinusoidal", "learned", "rotary"] = "sinusoidal"
  mixer: Literal["attention", "convolution"] = "attention"


def test_values_and_fields_declared_in_model_config_are_what_the_checks_take(monkeypatch):
  monkeypatch.setattr(model_config, "ModelConfig", _Extended)
  config = base.get_config()
  config.model.positional = "rotary"
  config.model.mixer = "convolution"
  config_checks.validate(config)  # config_checks names neither
  config.model.mixer = "recurrence"
  with pytest.raises(config_checks.ConfigError,
                     match=r"config.model.mixer='recurrence' is not one of 'attention', "
                     r"'convolution'"):
    config_checks.validate(config)
  del config.model["mixer"]
  with pytest.raises(config_checks.ConfigError, match=r"config.model.mixer is missing"):
    config_checks.validate(config)


@pytest.mark.parametrize("key,value,allowed", [
    ("positional", "rotary", "'sinusoidal', 'learned', 'rope', 't5', 'shaw', 'alibi'"),
    ("attention_impl", "flash", "'reference', 'xla', 'cudnn'")])
def test_an_unknown_model_choice_names_the_key_and_the_declared_values(key, value, allowed):
  config = base.get_config()
  config.model[key] = value
  with pytest.raises(config_checks.ConfigError,
                     match=f"^config.model.{key}='{value}' is not one of {allowed}$"):
    config_checks.validate(config)
  assert model_config.allowed(key) == tuple(a.strip("'") for a in allowed.split(", "))


@pytest.mark.parametrize("key,value,message", [
    ("bleu_at_end", "yes", r"config.bleu_at_end='yes' must be True or False"),
    ("learning_rate_factor", "1", r"config.learning_rate_factor='1' must be a number"),
    ("data.read_threads", None, r"config.data.read_threads is missing"),
    ("decode.max_extra_len", -1, r"config.decode.max_extra_len=-1 must be an integer >= 0"),
])
def test_every_declared_key_is_checked_against_its_type(key, value, message):
  raw = base.get_config().to_dict()  # a plain dict, like a config.json from elsewhere
  parent, leaf = key.rsplit(".", 1) if "." in key else (None, key)
  node = raw[parent] if parent else raw
  if value is None:
    del node[leaf]
  else:
    node[leaf] = value
  with pytest.raises(config_checks.ConfigError, match=message):
    config_checks.validate(ml_collections.ConfigDict(raw))


_CONFIGS = {"base": base.get_config, "big": big.get_config, "demo": demo.get_config,
            **{f"table3:{v}": functools.partial(table3.get_config, v) for v in table3.NAMES}}


@pytest.mark.parametrize("name", _CONFIGS)
def test_every_key_the_configs_set_is_declared(name):
  config = _CONFIGS[name]()
  flat = set(workdir._flatten(config)) - {"variant"}  # a name, not a setting
  flat = {k for k in flat if not k.startswith("paper.")}  # table3's figures from the paper
  assert flat == set(schema.keys())
  assert config.model.to_dict().keys() == set(model_config.config_fields())
