"""Evaluating a trained workdir: translating a file, scoring a split, averaging checkpoints,
and evaluate.py reading the workdir's own config."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO
from transformer.run import checkpoint
from transformer.evaluation import evaluate_lib
from transformer.run import workdir as workdir_lib
from transformer.errors import ConfigError


def _first_test_pairs(shared_data, folder, n=24):
  """Writes the first `n` pairs of Tatoeba's test split to `folder`; returns
  'SOURCE_PATH,TARGET_PATH' for config.data.test_files."""
  paths = []
  for lang in ("en", "de"):
    text = (shared_data / "tatoeba-deu-eng" / f"test.{lang}").read_text(encoding="utf-8")
    paths.append(folder / f"test{n}.{lang}")
    paths[-1].write_text("".join(text.splitlines(keepends=True)[:n]), encoding="utf-8")
  return ",".join(map(str, paths))


def _evaluate_py(*args):
  return subprocess.run([sys.executable, "evaluate.py", *args], cwd=REPO, capture_output=True,
                        text=True)


def test_translate_file_keeps_one_line_per_line(trained, tmp_path):
  config, workdir = trained
  source = tmp_path / "in.en"
  source.write_text("I like tea.\n\nWhere is the station?\n", encoding="utf-8")
  output = tmp_path / "out.de"
  hypotheses = evaluate_lib.translate_file(config, str(workdir), str(source), str(output), 1)
  lines = output.read_text(encoding="utf-8").split("\n")
  assert lines[-1] == "" and lines[:-1] == hypotheses
  assert len(hypotheses) == 3 and hypotheses[1] == "" and hypotheses[0] and hypotheses[2]


def test_evaluate_split_writes_hypotheses_and_scores(copy_of_trained, shared_data, capsys):
  config, workdir = copy_of_trained
  config.data.test_files = _first_test_pairs(shared_data, workdir)
  result = evaluate_lib.evaluate_split(config, str(workdir), "test", 2)
  assert result["steps"] == [60, 120] and result["num_sentences"] == 24
  written = json.loads((workdir / "eval" / "test_step120_avg2.json").read_text())
  assert written["sacrebleu"]["score"] == pytest.approx(result["sacrebleu"]["score"])
  hypotheses = (workdir / "eval" / "test_step120_avg2.txt").read_text().splitlines()
  assert len(hypotheses) == 24
  for side in ("hyp", "ref"):
    tokenized = workdir / "eval" / f"test_step120_avg2.{side}.tok.atat"
    assert len(tokenized.read_text(encoding="utf-8").splitlines()) == 24
  out = capsys.readouterr().out
  assert out.count("sacreBLEU (detokenized, 13a, mixed case)") == 1  # printed once


def test_averaged_parameters_are_the_mean_of_the_checkpoints(trained):
  _, workdir = trained
  averaged, steps = checkpoint.average_params(str(workdir), 2)
  ckpt = checkpoint.Checkpointer(str(workdir), read_only=True)
  a, b = (ckpt.restore_params(s) for s in (60, 120))
  np.testing.assert_allclose(averaged["shared_embedding"]["embedding"],
                             (a["shared_embedding"]["embedding"]
                              + b["shared_embedding"]["embedding"]) / 2, rtol=1e-6)
  assert steps == [60, 120]


def test_evaluate_py_with_only_the_workdir_scores_like_the_training_config(copy_of_trained,
                                                                           shared_data):
  config, workdir = copy_of_trained
  # A short test split, in the saved config too: data paths may change after training.
  config.data.test_files = _first_test_pairs(shared_data, workdir.parent)
  workdir_lib.save_config(workdir, config)
  run = _evaluate_py(f"--workdir={workdir}")
  assert run.returncode == 0, run.stderr
  from_saved = json.loads((workdir / "eval" / "test_step120.json").read_text())
  given = evaluate_lib.evaluate_split(config, str(workdir), "test", 1)
  assert from_saved["num_sentences"] == given["num_sentences"] == 24
  for name in ("sacrebleu", "tokenized_bleu", "chrf"):
    assert from_saved[name]["score"] == pytest.approx(given[name]["score"]), name


def test_evaluate_py_refuses_another_model_in_one_line(trained):
  _, workdir = trained
  run = _evaluate_py("--config=configs/tatoeba_small.py", f"--workdir={workdir}")
  assert run.returncode == 2
  assert run.stderr.startswith("error: --config describes another model"), run.stderr
  assert "model.d_model=64 (now 256)" in run.stderr
  assert run.stderr.count("\n") == 1
  assert not (workdir / "eval").exists()


@pytest.mark.parametrize("num_average, message", [
    (-3, r"--num_average=-3 must be at least 1"),
    (3, r"--num_average=3 but .* holds only 2 checkpoint"),
])
def test_bad_num_average_is_one_line(trained, num_average, message):
  config, workdir = trained
  with pytest.raises(ConfigError, match=message):
    evaluate_lib.translate_file(config, str(workdir), "-", None, num_average)


def test_unwritable_output_fails_before_decoding(trained, tmp_path, monkeypatch):
  config, workdir = trained
  monkeypatch.setattr(evaluate_lib, "_load", lambda *a: pytest.fail("decoded anyway"))
  with pytest.raises(ConfigError, match=r"--output=.*/missing/out.de cannot be written"):
    evaluate_lib.translate_file(config, str(workdir), "-", str(tmp_path / "missing" / "out.de"),
                                1)


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_workdir_without_checkpoints_is_one_line_and_untouched(tmp_path, make):
  from configs import demo

  workdir = tmp_path / "w"
  if make == "empty":
    workdir.mkdir()
  with pytest.raises(ConfigError, match=r"no checkpoint in .*train one first"):
    evaluate_lib.evaluate_split(demo.get_config(), str(workdir), "test", 1)
  assert (list(workdir.iterdir()) == []) if make == "empty" else not workdir.exists()
