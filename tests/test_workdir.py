"""The config a workdir keeps: round trip, differences, one-line errors."""

import pytest

from configs import base, demo
from transformer import workdir
from transformer.errors import ConfigError


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
  with pytest.raises(ConfigError, match=r"another model .*model\.d_model \(128 saved, 256 given"
                     r"\), model\.num_layers \(2 saved, 4 given\); drop --config") as e:
    workdir.config_for(tmp_path, given)
  assert "\n" not in str(e.value)


def test_config_for_takes_the_given_config_where_none_was_saved(tmp_path):
  given = base.get_config()
  assert workdir.config_for(tmp_path, given) is given
  with pytest.raises(ConfigError, match="no config.json"):
    workdir.config_for(tmp_path)
