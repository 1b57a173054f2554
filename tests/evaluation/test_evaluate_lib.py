"""Evaluating a trained workdir: translating a file, scoring a split, averaging checkpoints,
and evaluate.py reading the workdir's own config."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, TRAINED_STEPS
from transformer.run import averaging
from transformer.run import checkpoint
from transformer import records
from transformer.evaluation import evaluate_lib, score_records
from transformer.run import workdir as workdir_lib
from transformer.errors import ConfigError


# Sentences of the short test split every test here scores: one batch of 16 rows (4 of them
# filler), so the tests and the evaluate.py processes share one compiled search per decoding
# setting (JAX's persistent cache) instead of compiling their own for 24 and 8 sentences.
_N = 12


def _first_test_pairs(shared_data, folder, n=_N):
  """Writes the first `n` pairs of Tatoeba's test split to `folder`; returns
  'SOURCE_PATH,TARGET_PATH' for config.data.test_files."""
  paths = []
  for lang in ("en", "de"):
    text = (shared_data / "tatoeba-deu-eng" / f"test.{lang}").read_text(encoding="utf-8")
    paths.append(folder / f"test{n}.{lang}")
    paths[-1].write_text("".join(text.splitlines(keepends=True)[:n]), encoding="utf-8")
  return ",".join(map(str, paths))


def _evaluate_py(*args, env=None):
  return subprocess.run([sys.executable, "evaluate.py", *args], cwd=REPO, capture_output=True,
                        text=True, env=env)


def test_translate_file_keeps_one_line_per_line(trained_on_tatoeba, tmp_path):
  config, workdir = trained_on_tatoeba
  source = tmp_path / "in.en"
  source.write_text("I like tea.\n\nWhere is the station?\n", encoding="utf-8")
  output = tmp_path / "out.de"
  hypotheses = evaluate_lib.translate_file(config, str(workdir), str(source), str(output), 1)
  lines = output.read_text(encoding="utf-8").split("\n")
  assert lines[-1] == "" and lines[:-1] == hypotheses
  assert len(hypotheses) == 3 and hypotheses[1] == "" and hypotheses[0] and hypotheses[2]


_LINES = "I like tea.\n\nWhere is the station?\nTom is here.\n"


def test_an_nbest_list_holds_each_lines_best_hypotheses_best_first(trained_on_tatoeba, tmp_path):
  config, workdir = trained_on_tatoeba
  source = tmp_path / "in.en"
  source.write_text(_LINES, encoding="utf-8")
  best = evaluate_lib.translate_file(config, str(workdir), str(source), None, 1)
  listed = evaluate_lib.translate_file(config, str(workdir), str(source),
                                       str(tmp_path / "out.nbest"), 1, nbest=3)
  assert (tmp_path / "out.nbest").read_text(encoding="utf-8").splitlines() == listed
  entries = [line.split(" ||| ") for line in listed]
  assert [int(n) for n, _, _ in entries] == [0, 0, 0, 2, 2, 2, 3, 3, 3]  # none for line 1
  for line in (0, 2, 3):
    texts = [text for n, text, _ in entries if int(n) == line]
    scores = [float(score) for n, _, score in entries if int(n) == line]
    assert texts[0] == best[line]  # the 1-best translation heads its list
    assert scores == sorted(scores, reverse=True) and len(set(texts)) == 3


def test_sampling_draws_the_same_translations_from_the_same_seed(trained_on_tatoeba, tmp_path):
  from transformer.decoding import sampling

  config, workdir = trained_on_tatoeba
  source = tmp_path / "in.en"
  source.write_text(_LINES * 2, encoding="utf-8")

  def draw(seed):
    return evaluate_lib.translate_file(config, str(workdir), str(source), None, 1,
                                       sampling=sampling.Sampling(1.5, 0, 0.95, seed))

  first = draw(3)
  assert first == draw(3) and first != draw(4)
  assert first[1] == first[5] == ""  # blank lines stay blank
  assert first[:4] != first[4:]  # each line draws with its own key


@pytest.mark.parametrize("nbest, how, message", [
    (5, None, r"--nbest=5 needs a beam at least as wide: pass --config.decode.beam_size=5 or "
              r"more \(it is 4\)"),
    (2, "sampling", r"--nbest=2 lists beam search's hypotheses; sampling draws one per line"),
])
def test_a_search_the_settings_cannot_make_is_one_line(trained, tmp_path, nbest, how, message):
  from transformer.decoding import sampling

  config, workdir = trained
  how = sampling.Sampling() if how else None
  with pytest.raises(ConfigError, match=message):
    evaluate_lib.translate_file(config, str(workdir), str(tmp_path / "none"), None, 1,
                                nbest=nbest, sampling=how)


def test_evaluate_py_refuses_flags_where_they_do_nothing(trained):
  _, workdir = trained
  split = _evaluate_py(f"--workdir={workdir}", "--nbest=2")
  assert split.returncode == 2 and split.stderr.splitlines()[-1] == (
      "error: --nbest and --sampling_* apply to --input: a split is scored by its best "
      "translation")
  no_temperature = _evaluate_py(f"--workdir={workdir}", "--input=-", "--sampling_topp=0.9")
  assert no_temperature.returncode == 2 and no_temperature.stderr.splitlines()[-1] == (
      "error: --sampling_topk/--sampling_topp need --sampling_temperature (1 = the model's "
      "distribution)")
  comet = _evaluate_py(f"--workdir={workdir}", "--input=-", "--comet_model=any")
  assert comet.returncode == 2 and comet.stderr.splitlines()[-1] == (
      "error: --comet_model scores a split against its references: --input has none")


def test_an_ensemble_of_a_model_with_itself_translates_as_the_model(copy_of_trained_on_tatoeba,
                                                                     shared_data, trained):
  config, workdir = copy_of_trained_on_tatoeba
  config.data.test_files = _first_test_pairs(shared_data, workdir)
  alone = evaluate_lib.evaluate_split(config, str(workdir), "test", 1)
  twice = evaluate_lib.evaluate_split(config, str(workdir), "test", 1, ensemble=[str(workdir)])
  stems = [workdir / "eval" / f"test_step120{ens}_beam4_alpha0.6.txt" for ens in ("", "_ens2")]
  assert stems[0].read_text() == stems[1].read_text()
  assert twice["sacrebleu"]["score"] == pytest.approx(alone["sacrebleu"]["score"])
  made = score_records.make("tiny.ens", twice, config, str(workdir), [f"{workdir}:60"],
                            device="cpu:a test CPU x1")
  assert [r.seeds for r in made] == [(config.seed, config.seed)] * 3
  with pytest.raises(ConfigError, match="--record='tiny seed0': name the figures"):
    score_records.check_name("tiny seed0")
  # Another checkpoint of the run is another model; another run's vocabulary is refused.
  evaluate_lib.evaluate_split(config, str(workdir), "test", 1, ensemble=[f"{workdir}:60"])
  assert (workdir / "eval" / "test_step120_ens2_beam4_alpha0.6.json").is_file()
  with pytest.raises(ConfigError, match=r"--ensemble=.* was trained with another vocabulary "):
    evaluate_lib.evaluate_split(config, str(workdir), "test", 1, ensemble=[str(trained[1])])
  with pytest.raises(ConfigError, match=r"has no checkpoint 7 \(it has \[60, 120\]\)"):
    evaluate_lib.evaluate_split(config, str(workdir), "test", 1, ensemble=[f"{workdir}:7"])


def test_evaluate_split_writes_hypotheses_and_scores(copy_of_trained_on_tatoeba, shared_data,
                                                     capsys):
  config, workdir = copy_of_trained_on_tatoeba
  config.data.test_files = _first_test_pairs(shared_data, workdir)
  result = evaluate_lib.evaluate_split(config, str(workdir), "test", 2)
  assert result["steps"] == [60, 120] and result["num_sentences"] == _N
  assert (config.decode.beam_size, config.decode.length_penalty) == (4, 0.6)
  stem = str(workdir / "eval" / "test_step120_avg2_beam4_alpha0.6")
  written = json.loads(pathlib.Path(stem + ".json").read_text())
  assert written["sacrebleu"]["score"] == pytest.approx(result["sacrebleu"]["score"])
  hypotheses = pathlib.Path(stem + ".txt").read_text().splitlines()
  assert len(hypotheses) == _N
  for side in ("hyp", "ref"):
    tokenized = pathlib.Path(f"{stem}.{side}.tok.atat")
    assert len(tokenized.read_text(encoding="utf-8").splitlines()) == _N
  out = capsys.readouterr().out
  assert out.count("sacreBLEU (detokenized, 13a, mixed case)") == 1  # printed once


@pytest.mark.parametrize("best_step", [TRAINED_STEPS // 2, TRAINED_STEPS])
def test_the_end_of_run_test_score_writes_what_evaluate_py_writes(best_step,
                                                                  copy_of_trained_on_tatoeba,
                                                                  shared_data):
  """A finished run run again only scores its test split (config.bleu_at_end); the files it
  writes under eval/ are evaluate.py's for the last checkpoint, byte for byte, so a sweep's
  report reads the test translations without evaluate.py. With a best checkpoint on dev (made
  step `best_step` here), it scores that one too, byte for byte as `--checkpoint=best`:
  decoded from the snapshot where it is earlier, the last step's decoding where it is last."""
  from transformer.run import best as best_lib
  from transformer.training import train_lib

  config, workdir = copy_of_trained_on_tatoeba
  config.data.test_files = _first_test_pairs(shared_data, workdir.parent)
  config.bleu_at_end = True
  shutil.rmtree(workdir / "best", ignore_errors=True)  # dev BLEU's choice, replaced
  snapshot = best_lib.BestSnapshot(str(workdir))
  snapshot.save(best_step, checkpoint.Checkpointer(str(workdir), read_only=True)
                .restore_params(best_step), {"step": best_step, "metric": "bleu", "value": 1.0})
  snapshot.close()
  assert not (workdir / "eval").exists()
  train_lib.train_and_evaluate(config, str(workdir), allow_config_changes=True)
  stems = [evaluate_lib.output_stem("test", [TRAINED_STEPS], config.decode),
           evaluate_lib.output_stem("test", [best_step], config.decode, best=True)]
  suffixes = (".txt", ".json", ".hyp.tok.atat", ".ref.tok.atat")
  written = [stem + suffix for stem in stems for suffix in suffixes]
  assert sorted(p.name for p in (workdir / "eval").iterdir()) == sorted(written)
  from_training = {name: (workdir / "eval" / name).read_bytes() for name in written}
  assert len(from_training[stems[0] + ".txt"].decode().splitlines()) == _N
  evaluate_lib.evaluate_split(config, str(workdir), "test", 1)
  evaluate_lib.evaluate_split(config, str(workdir), "test", 1, best=True)
  for name, content in from_training.items():
    assert (workdir / "eval" / name).read_bytes() == content, name


def test_averaged_parameters_are_the_mean_of_the_checkpoints(trained):
  _, workdir = trained
  averaged, steps = averaging.average_params(str(workdir), 2)
  ckpt = checkpoint.Checkpointer(str(workdir), read_only=True)
  a, b = (ckpt.restore_params(s) for s in (60, 120))
  np.testing.assert_allclose(averaged["shared_embedding"]["embedding"],
                             (a["shared_embedding"]["embedding"]
                              + b["shared_embedding"]["embedding"]) / 2, rtol=1e-6)
  assert steps == [60, 120]


def test_evaluate_py_with_only_the_workdir_scores_like_the_training_config(
    copy_of_trained_on_tatoeba, shared_data):
  config, workdir = copy_of_trained_on_tatoeba
  # A short test split, in the saved config too: data paths may change after training.
  config.data.test_files = _first_test_pairs(shared_data, workdir.parent)
  workdir_lib.save_config(workdir, config)
  results = workdir.parent / "results"
  run = _evaluate_py(f"--workdir={workdir}", "--record=tiny.seed0",
                     env={**os.environ, records.ENV: str(results)})
  assert run.returncode == 0, run.stderr
  stem = evaluate_lib.output_stem("test", [120], config.decode)
  from_saved = json.loads((workdir / "eval" / f"{stem}.json").read_text())
  given = evaluate_lib.evaluate_split(config, str(workdir), "test", 1)
  assert from_saved["num_sentences"] == given["num_sentences"] == _N
  for name in ("sacrebleu", "tokenized_bleu", "chrf"):
    assert from_saved[name]["score"] == pytest.approx(given[name]["score"]), name
  # --record: each score a record, named by the run's device, with the model's seed.
  kept = records.read(results / "evaluate.jsonl")
  assert {r.name: r.figure for r in kept} == {
      f"evaluate.tiny.seed0.cpu.test.{name}": from_saved[name]["score"]
      for name in ("sacrebleu", "chrf", "tokenized_bleu")}
  assert {(r.unit, r.seeds, r.extra["steps"][0]) for r in kept} <= {
      ("BLEU", (config.seed,), 120), ("chrF", (config.seed,), 120)}
  assert all(r.command.startswith("python evaluate.py --workdir=") for r in kept)


def test_greedy_and_beam_evaluations_keep_their_own_files(copy_of_trained_on_tatoeba,
                                                          shared_data):
  config, workdir = copy_of_trained_on_tatoeba
  config.data.test_files = _first_test_pairs(shared_data, workdir)
  config.decode.update(beam_size=4, length_penalty=0.6)
  beam = evaluate_lib.evaluate_split(config, str(workdir), "test", 1)
  config.decode.beam_size = 1
  greedy = evaluate_lib.evaluate_split(config, str(workdir), "test", 1)
  suffixes = (".txt", ".json", ".hyp.tok.atat", ".ref.tok.atat")
  assert sorted(p.name for p in (workdir / "eval").iterdir()) == sorted(
      stem + suffix for stem in ("test_step120_beam4_alpha0.6", "test_step120_greedy")
      for suffix in suffixes)
  for stem, result in (("test_step120_beam4_alpha0.6", beam), ("test_step120_greedy", greedy)):
    written = json.loads((workdir / "eval" / f"{stem}.json").read_text())
    assert written["decode"]["beam_size"] == result["decode"]["beam_size"]
    assert written["sacrebleu"]["score"] == pytest.approx(result["sacrebleu"]["score"])


def test_names_say_the_steps_and_the_decoding():
  assert evaluate_lib.output_stem("test", [400, 500], {"beam_size": 4, "length_penalty": 0.6}
                                  ) == "test_step500_avg2_beam4_alpha0.6"
  assert evaluate_lib.output_stem("validation", [500], {"beam_size": 1, "length_penalty": 0.6}
                                  ) == "validation_step500_greedy"
  assert evaluate_lib.decoding_tag({"beam_size": 8, "length_penalty": 1}) == "beam8_alpha1"


def test_evaluate_py_overrides_the_saved_config_without_config_flag(copy_of_trained_on_tatoeba,
                                                                    shared_data):
  config, workdir = copy_of_trained_on_tatoeba
  config.data.test_files = _first_test_pairs(shared_data, workdir.parent)
  workdir_lib.save_config(workdir, config)
  saved = workdir_lib.config_path(workdir).read_text()
  run = _evaluate_py(f"--workdir={workdir}", "--config.decode.beam_size=1")
  assert run.returncode == 0, run.stderr
  written = json.loads((workdir / "eval" / "test_step120_greedy.json").read_text())
  assert written["decode"]["beam_size"] == 1 and written["num_sentences"] == _N
  assert workdir_lib.config_path(workdir).read_text() == saved  # the file stays as it was


@pytest.mark.parametrize("override, message", [
    ("--config.decode.beamsize=1",
     "error: unknown config key decode.beamsize; did you mean decode.beam_size?\n"),
    ("--config.model.d_model=32", "error: --config describes another model than the one "
     "trained in {workdir}: its config.json has model.d_model=64 (now 32); "),
])
def test_evaluate_py_refuses_a_bad_override_in_one_line(trained_on_tatoeba, override, message):
  _, workdir = trained_on_tatoeba
  run = _evaluate_py(f"--workdir={workdir}", override)
  assert run.returncode == 2
  assert run.stderr.startswith(message.format(workdir=workdir)), run.stderr
  assert run.stderr.count("\n") == 1
  assert not (workdir / "eval").exists()


def test_evaluate_py_refuses_another_model_in_one_line(trained_on_tatoeba):
  _, workdir = trained_on_tatoeba
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
