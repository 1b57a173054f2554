"""Where the real text of ../shared/data is found, what the tests that need it do without it
(skip with one line; fail where CI requires it), and configs/tatoeba_small.py's one-line error
when its corpus is missing."""

import os
import pathlib
import subprocess
import sys

import pytest

from configs import tatoeba_small
from tests import support
from tests.conftest import REPO
from transformer.errors import ConfigError


def _write_tatoeba(folder: pathlib.Path) -> pathlib.Path:
  """A stand-in Tatoeba folder: the six file names, one pair each."""
  folder.mkdir(parents=True)
  for name in tatoeba_small.TATOEBA_FILES:
    (folder / name).write_text("Hallo.\n" if name.endswith(".de") else "Hello.\n")
  return folder


def test_the_data_folder_is_beside_the_checkout_unless_the_environment_names_one(
    monkeypatch, tmp_path):
  monkeypatch.delenv("TRANSFORMER_SHARED_DATA", raising=False)
  assert tatoeba_small.shared_data_dir() == REPO.parent / "shared" / "data"
  monkeypatch.setenv("TRANSFORMER_SHARED_DATA", str(tmp_path))
  assert tatoeba_small.shared_data_dir() == tmp_path
  _write_tatoeba(tmp_path / "tatoeba-deu-eng")
  assert tatoeba_small.get_config().data.files_dir == str(tmp_path / "tatoeba-deu-eng")


def test_missing_data_skips_with_one_line_or_fails_where_required(monkeypatch, tmp_path):
  monkeypatch.setenv("TRANSFORMER_SHARED_DATA", str(tmp_path / "nowhere"))
  monkeypatch.delenv("TRANSFORMER_REQUIRE_SHARED_DATA", raising=False)
  with pytest.raises(pytest.skip.Exception) as skipped:
    support.shared_data_or_skip()
  reason = str(skipped.value)
  assert reason.startswith("needs the real text of ../shared/data (Tatoeba deu-eng, "
                           "newstest2013/14)")
  assert reason.endswith("set TRANSFORMER_SHARED_DATA=/path/to/data to run it")
  assert str(tmp_path / "nowhere") in reason and "\n" not in reason
  monkeypatch.setenv("TRANSFORMER_REQUIRE_SHARED_DATA", "1")
  with pytest.raises(pytest.fail.Exception, match="TRANSFORMER_REQUIRE_SHARED_DATA is set"):
    support.shared_data_or_skip()


def test_tatoeba_small_without_its_corpus_is_one_line_saying_where_to_get_it(monkeypatch,
                                                                              tmp_path):
  monkeypatch.setenv("TRANSFORMER_SHARED_DATA", str(tmp_path))
  with pytest.raises(ConfigError) as error:
    tatoeba_small.get_config()
  message = str(error.value)
  assert "\n" not in message and f"{tmp_path / 'tatoeba-deu-eng'} does not exist" in message
  for needed in ("Tatoeba-Challenge", "tatoeba-deu-eng/{train.en,train.de,valid.en,valid.de,"
                 "test.en,test.de}", "TRANSFORMER_SHARED_DATA=DIR", "--config.data.files_dir=DIR"):
    assert needed in message, needed
  # A command line that names its own corpus is not refused for lacking this one:
  # config_flags applies the override after get_config returns.
  monkeypatch.setattr(sys, "argv", ["train.py", "--config.data.files_dir=/elsewhere"])
  assert tatoeba_small.get_config().data.files_dir == str(tmp_path / "tatoeba-deu-eng")


def test_train_py_without_the_corpus_prints_one_line_and_writes_nothing(tmp_path):
  env = dict(os.environ, TRANSFORMER_SHARED_DATA=str(tmp_path / "nowhere"))
  run = subprocess.run([sys.executable, "train.py", "--config=configs/tatoeba_small.py",
                        f"--workdir={tmp_path / 'run'}"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
  assert run.returncode == 2
  assert run.stderr.startswith("error: configs/tatoeba_small.py reads the Tatoeba German-English "
                               "pairs"), run.stderr
  assert run.stderr.count("\n") == 1 and not (tmp_path / "run").exists()
