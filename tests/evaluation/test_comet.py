"""COMET through `transformer.evaluation.comet`: Unbabel's library end to end, offline, on a
tiny COMET model made with its own classes (tests/comet_tiny_model.py), against the scores the
library gives directly; and the one-line errors, which need no COMET.

The library runs in the Python named by $TRANSFORMER_COMET_PYTHON, or in this one where it
imports (unbabel-comet pins numpy<2, so it is usually an environment of its own:
docs/evaluation.md). Without either, the end-to-end tests skip.
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests import support
from tests.conftest import REPO
from tests.evaluation.test_evaluate_lib import _first_test_pairs
from transformer.errors import ConfigError
from transformer.evaluation import comet
from transformer.evaluation import evaluate_lib
from transformer.evaluation import scoring
from transformer.evaluation import score_records
from transformer.run import best as best_lib
from transformer.run import checkpoint_layout
from transformer.training import train_lib

TINY_MODEL = REPO / "tests" / "comet_tiny_model.py"
COMET_PYTHON_ENV = "TRANSFORMER_COMET_PYTHON"
_SOURCES = ["I like tea.", "Where is the station?", "Tom is here.", "It is cold today."]
_HYPOTHESES = ["Ich mag Tee.", "Wo ist der Bahnhof?", "Tom ist da.", "Heute ist es kalt."]
_REFERENCES = ["Ich trinke gern Tee.", "Wo ist der Bahnhof?", "Tom ist hier.", "Es ist kalt."]


@pytest.fixture(scope="module")
def comet_python() -> str:
  given = os.environ.get(COMET_PYTHON_ENV, "").strip()
  if given:
    return given
  if importlib.util.find_spec("comet") is None:
    pytest.skip(f"COMET end to end needs unbabel-comet: set {COMET_PYTHON_ENV} to a python "
                "that has it (docs/evaluation.md)")
  return sys.executable


def _comet_run(python: str, *args: str, stdin: str | None = None) -> str:
  done = subprocess.run([python, str(TINY_MODEL), *args], input=stdin, capture_output=True,
                        text=True, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout


@pytest.fixture(scope="module")
def tiny_comet(comet_python, tmp_path_factory) -> pathlib.Path:
  """A folder laid out as COMET's downloads: `hparams.yaml`, `checkpoints/model.ckpt`."""
  folder = tmp_path_factory.mktemp("comet") / "tiny"
  text = folder.with_name("text.txt")
  rng = np.random.default_rng(0)
  letters = list("abcdefghijklmnopqrstuvwxyzäöüß")
  drawn = ["".join(rng.choice(letters, size=rng.integers(2, 9))) for _ in range(3000)]
  text.write_text("\n".join(_SOURCES + _HYPOTHESES + _REFERENCES
                            + [" ".join(drawn[i:i + 6]) for i in range(0, 3000, 6)]),
                  encoding="utf-8")
  _comet_run(comet_python, "build", str(folder), str(text))
  return folder


def _library_scores(python: str, checkpoint: pathlib.Path, sources, hypotheses, references):
  """Each sentence's score, from COMET's `predict` called directly."""
  request = json.dumps({"src": sources, "mt": hypotheses, "ref": references})
  return json.loads(_comet_run(python, "score", str(checkpoint), stdin=request))


def test_comet_scores_each_sentence_as_the_library_does(comet_python, tiny_comet):
  checkpoint = tiny_comet / "checkpoints" / "model.ckpt"
  expected = _library_scores(comet_python, checkpoint, _SOURCES, _HYPOTHESES, _REFERENCES)
  assert len(set(np.round(expected, 6))) == len(expected), "equal scores: a weak test"
  # A folder as downloaded, or its file; the sentences forwards, then backwards (in batches
  # of 3, so each sentence sits in other batches): each keeps its own score.
  both_ways = [_SOURCES + _SOURCES[::-1], _HYPOTHESES + _HYPOTHESES[::-1],
               _REFERENCES + _REFERENCES[::-1]]
  workers = []
  for model in (str(tiny_comet), str(checkpoint)):
    scored = comet.Comet(model, comet_python, batch_size=3).score(*both_ways)
    np.testing.assert_allclose(scored["segments"], expected + expected[::-1], rtol=1e-5,
                               atol=1e-6)
    assert scored["score"] == pytest.approx(np.mean(expected), rel=1e-5)
    assert scored["signature"].startswith("comet:") and model in scored["signature"]
    workers.append(comet._worker(comet_python).process.pid)
  assert workers[0] == workers[1]  # one process answered both, COMET imported once


def test_evaluate_split_scores_the_translations_with_comet(copy_of_trained_on_tatoeba,
                                                           shared_data, comet_python,
                                                           tiny_comet, capsys):
  config, workdir = copy_of_trained_on_tatoeba
  config.data.test_files = _first_test_pairs(shared_data, workdir)
  scorer = comet.Comet(str(tiny_comet), comet_python)
  result = evaluate_lib.evaluate_split(config, str(workdir), "test", 1, comet=scorer)
  stem = workdir / "eval" / "test_step120_beam4_alpha0.6"
  hypotheses = pathlib.Path(f"{stem}.txt").read_text(encoding="utf-8").splitlines()
  sources, references = (
      [line.rstrip("\n") for line in open(path, encoding="utf-8")]
      for path in config.data.test_files.split(","))
  expected = _library_scores(comet_python, tiny_comet / "checkpoints" / "model.ckpt", sources,
                             hypotheses, references)
  written = json.loads(pathlib.Path(f"{stem}.json").read_text())
  np.testing.assert_allclose(written["comet"]["segments"], expected, rtol=1e-5, atol=1e-6)
  assert written["comet"]["score"] == pytest.approx(result["comet"]["score"])
  assert f"COMET ({tiny_comet}): {result['comet']['score']:.4f}" in capsys.readouterr().out
  made = score_records.make("tiny", result, config, str(workdir), device="cpu:a test CPU x1")
  assert [r.name.rsplit(".", 1)[-1] for r in made][-1] == "comet"
  assert made[-1].unit == "COMET"


def test_training_chooses_its_best_checkpoint_on_dev_comet(copy_of_trained, comet_python,
                                                          tiny_comet, monkeypatch):
  """`config.select='comet'`: each dev-BLEU evaluation scores the dev translations with COMET
  too (`dev/comet` in the log), and the best snapshot is the step of the highest; the
  end-of-training test scores, of the last step and of that one, have COMET beside BLEU and
  chrF (greedy, to keep it short)."""
  config, workdir = copy_of_trained
  config.num_train_steps, config.bleu_every_steps, config.bleu_num_sentences = 124, 2, 8
  config.bleu_at_end, config.decode.beam_size = True, 1
  config.select, config.comet_model, config.comet_python = "comet", str(tiny_comet), comet_python
  started = []
  monkeypatch.setattr(comet, "_Worker", lambda python, start=comet._Worker: (
      started.append(python) or start(python)))
  comet._close_workers()  # whatever an earlier test left: this run starts its own
  comet._WORKERS.clear()
  train_lib.train_and_evaluate(config, str(workdir), allow_config_changes=True)
  assert started == [comet_python]  # the check, both dev evaluations and the test: one process
  logged = support.logged(workdir, "dev/comet")
  assert [s for s, _ in logged] == [122, 124]
  best_step, best = max(logged, key=lambda sv: (sv[1], -sv[0]))  # a tie keeps the first
  assert best_lib.BestSnapshot(str(workdir), read_only=True).record() == {
      "step": best_step, "metric": "comet", "value": pytest.approx(best)}
  (written,) = (workdir / "eval").glob("test_step124_greedy.json")
  scored = json.loads(written.read_text())["comet"]
  translations = written.with_suffix(".txt").read_text(encoding="utf-8").splitlines()
  assert len(scored["segments"]) == len(translations) > 0
  assert scored["score"] == pytest.approx(support.logged(workdir, "test/comet")[-1][1])
  # The test split at the checkpoint COMET chose is scored with COMET too.
  at_best = json.loads((workdir / "eval" / f"test_step{best_step}_best_greedy.json").read_text())
  assert len(at_best["comet"]["segments"]) == len(translations)


def test_a_run_whose_comet_model_is_not_there_stops_before_training(copy_of_trained,
                                                                    comet_python, tmp_path):
  config, workdir = copy_of_trained
  config.num_train_steps, config.select = 124, "comet"
  config.comet_python = comet_python
  (tmp_path / "empty").mkdir()  # a folder without checkpoints/model.ckpt, and a name
  for model, says in ((tmp_path / "empty", r"no COMET model at .*empty/checkpoints/model.ckpt"),
                      (tmp_path / "no-model", r"neither a file, a folder nor a model COMET")):
    config.comet_model = str(model)
    with pytest.raises(ConfigError, match=rf"^COMET model '{model}': {says}.* \(a hub name"):
      train_lib.train_and_evaluate(config, str(workdir), allow_config_changes=True)
  assert checkpoint_layout.resume_step(str(workdir)) == 120  # not a step trained


def test_only_process_0_runs_comet_during_training_and_every_process_takes_its_score(
    monkeypatch):
  """Process 0 scores the dev translations; the others give nothing and take its answer, so
  every process chooses the same best checkpoint (no COMET needed: the scorer is replaced)."""
  from transformer.run import coordination

  answer = {"score": 0.5, "segments": [0.25, 0.75]}
  shared = {}  # what process 0 put in the store
  config = support.tiny_config()
  config.comet_model = "m"
  pairs, hypotheses = [("a", "x"), ("b", "y")], ["x", "y"]

  def gather(name, value):
    if value:
      shared[name] = value
    return [shared[name], ""]

  monkeypatch.setattr(coordination, "gather", gather)
  for process in (0, 1):
    monkeypatch.setattr(jax, "process_index", lambda process=process: process)
    calls = []
    monkeypatch.setattr(comet.Comet, "score_pairs",
                        lambda self, *given: calls.append(given) or answer)
    assert train_lib._comet(config, pairs, hypotheses) == answer
    assert calls == ([(pairs, hypotheses)] if process == 0 else [])


def test_comet_s_failures_are_one_line(tmp_path):
  with pytest.raises(ConfigError, match=r"needs aligned lists: 2 sources, 1 hypotheses"):
    comet.Comet("any").score(["a", "b"], ["a"], ["a", "b"])
  with pytest.raises(ConfigError, match=r"--comet_python=.*no-python does not run"):
    comet.Comet("any", str(tmp_path / "no-python")).score(["a"], ["a"], ["a"])
  if importlib.util.find_spec("comet") is None:  # this interpreter lacks it, as most do
    with pytest.raises(ConfigError, match=r"COMET is not installed for .*: install it there"):
      comet.Comet("any").score(["a"], ["a"], ["a"])


def test_a_failed_comet_process_is_one_error_with_its_output_and_the_next_starts_anew(
    tmp_path):
  """A process that ends (COMET crashed, or was killed) fails the request it was answering with
  the end of its output; the next request starts another process."""
  starts = tmp_path / "starts"
  python = tmp_path / "python"
  python.write_text(f"#!/bin/sh\necho start >> {starts}\necho 'RuntimeError: boom' >&2\n"
                    "exit 1\n")
  python.chmod(0o755)
  for attempt in (1, 2):
    with pytest.raises(RuntimeError, match=r"COMET \(m, run by .*python\) failed with exit "
                                           r"status 1:\nRuntimeError: boom$"):
      comet.Comet("m", str(python)).score(["a"], ["a"], ["a"])
    assert starts.read_text().splitlines() == ["start"] * attempt


def test_a_score_prints_to_its_own_digits():
  scores = {"chrf": {"score": 51.234, "signature": "s1", "label": "chrF"},
            "comet": {"score": 0.812345, "signature": "s2", "label": "COMET (m)", "digits": 4}}
  assert scoring.format_scores(scores).splitlines() == ["chrF: 51.23  (s1)",
                                                         "COMET (m): 0.8123  (s2)"]
