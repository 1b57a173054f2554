"""The time-to-BLEU record suite: configs taking turns, each run from empty caches, and the
summary a record is judged by."""

import json
import pathlib

import pytest

from benchmarks import record
from tests import support


def test_configs_take_turns_seed_by_seed():
  a = {"name": "a", "seeds": [0, 1, 2]}
  b = {"name": "b", "seeds": [5]}
  assert [(e["name"], s) for e, s in record.turns([a, b])] == [
      ("a", 0), ("b", 5), ("a", 1), ("a", 2)]


def test_a_run_trains_its_entrys_seed_and_steps_in_a_fresh_workdir(tmp_path):
  """Through time_to_bleu's own run: the entry's seed and steps, not the config's, and a
  vocabulary of the run's own."""
  config = support.synthetic_tiny(steps=6)
  assert config.seed == 0
  entries = [{"name": "new", "config": config, "steps": 3, "seeds": [1]}]
  (r,) = record.race(entries, str(tmp_path), test_sentences=16, choose_on_dev=False)
  assert (r["name"], r["seed"], r["steps"]) == ("new", 1, 3) and "chosen_step" not in r
  run_dir = tmp_path / "record" / "new-seed1" / "run"
  logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
  assert max(m["step"] for m in logged) == 3
  assert json.loads((run_dir / "config.json").read_text())["seed"] == 1
  assert list((run_dir.parent / "data").glob("*.model")), "no vocabulary of its own"
  assert r["test_sentences"] == 16 and r["total_s"] > r["training_s"] > 0
  assert r["dev_perplexity"] > 1 and 0 <= r["test_sacrebleu"] <= 100


def test_a_race_chooses_each_run_s_checkpoint_on_dev_and_checks_the_mark_on_its_test_bleu(
    tmp_path):
  """By default each run keeps its config's dev BLEU, and the BLEU the mark is checked on is
  the dev-chosen checkpoint's (time_to_bleu's own `best_*`), the last step's kept beside it;
  a config that chooses nothing on dev is refused before anything runs."""
  config = support.synthetic_tiny(steps=6)
  config.bleu_every_steps = 2
  seen = []

  def run_once(config, workdir, monitor, test_sentences):
    seen.append(config.bleu_every_steps)
    return {"total_s": 1.0, "compile_s": 0.1, "training_s": 0.5, "evaluation_s": 0.2,
            "test_sacrebleu": 20.0, "best_step": 2, "best_test_sacrebleu": 23.0}

  entries = [{"name": "new", "config": config, "steps": 4, "seeds": [0]}]
  (r,) = record.race(entries, str(tmp_path), 16, run_once=run_once)
  assert seen == [2]  # the config's dev BLEU stays on
  assert (r["chosen_step"], r["test_sacrebleu"], r["last_test_sacrebleu"]) == (2, 23.0, 20.0)
  assert record.summarize([r], mark=22.62)[0]["all_reached"]
  (r,) = record.race(entries, str(tmp_path), 16, run_once=run_once, choose_on_dev=False)
  assert seen[-1] == 0 and r["test_sacrebleu"] == 20.0  # no dev BLEU; the last step's
  for select, every in (("", 2), ("bleu", 0), ("chrf", 5), ("loss", 0)):
    config.select, config.bleu_every_steps = select, every
    with pytest.raises(record.ConfigError, match=rf"new chooses no checkpoint on dev \(config"
                                                  rf"\.select='{select}', config\.bleu_every"
                                                  rf"_steps={every} for 4 steps\)"):
      record.race(entries, str(tmp_path), 16, run_once=run_once)
  assert len(seen) == 2  # refused before running


def _run(name, seed, total, bleu, steps=100):
  return {"name": name, "seed": seed, "steps": steps, "total_s": total, "test_sacrebleu": bleu}


def test_the_summary_gives_median_times_the_spread_and_whether_every_seed_reached_the_mark():
  runs = [_run("fast", 0, 700.0, 23.0), _run("small", 0, 1500.0, 22.7, steps=1500),
          _run("fast", 1, 760.0, 22.8), _run("fast", 2, 690.0, 23.2)]
  fast, small = record.summarize(runs, mark=22.62)
  assert (fast["name"], fast["runs"], fast["steps"]) == ("fast", 3, 100)
  assert fast["median_total_s"] == 700.0 and fast["time_ratio"] == pytest.approx(700 / 1500)
  assert fast["bleu_mean"] == pytest.approx(23.0) and fast["bleu_sd"] == pytest.approx(0.2)
  assert fast["bleu_min"] == 22.8 and fast["all_reached"]
  assert small["time_ratio"] == 1.0 and small["bleu_sd"] == 0.0 and small["all_reached"]
  # One seed short of the mark is enough to fail it.
  runs[2]["test_sacrebleu"] = 22.61
  assert not record.summarize(runs, mark=22.62)[0]["all_reached"]


def test_a_config_spec_names_its_argument_and_a_missing_file_is_one_line():
  assert record.config_name("configs/modern_tatoeba.py:pre_ln") == "modern_tatoeba:pre_ln"
  assert record.config_name("configs/tatoeba_small.py") == "tatoeba_small"
  root = pathlib.Path(__file__).resolve().parents[2]
  config = record.load_config(f"{root}/configs/modern.py:pre_ln")
  assert config.model.norm == "pre"
  with pytest.raises(record.ConfigError, match="no such config file configs/nope.py"):
    record.load_config("configs/nope.py")


def test_a_config_raced_at_two_lengths_is_named_by_its_steps_and_one_length_twice_is_refused():
  root = pathlib.Path(__file__).resolve().parents[2]
  against = record.against_entries(
      [f"{root}/configs/modern.py:pre_ln", f"{root}/configs/modern.py:pre_ln"], ["600", "1500"],
      seeds=[0])
  assert [(e["name"], e["steps"], e["seeds"]) for e in against] == [
      ("modern:pre_ln", 600, [0]), ("modern:pre_ln", 1500, [0])]
  new = {"name": "modern:pre_ln", "config": against[0]["config"], "steps": 550, "seeds": [0, 1]}
  assert [e["name"] for e in record.named_apart([new] + against)] == [
      "modern:pre_ln@550", "modern:pre_ln@600", "modern:pre_ln@1500"]
  other = {"name": "tatoeba_small", "steps": 1500}
  assert [e["name"] for e in record.named_apart([new, other])] == ["modern:pre_ln", "tatoeba_small"]
  with pytest.raises(record.ConfigError, match="modern:pre_ln@600 more than once"):
    record.named_apart([against[0], dict(against[0])])
  with pytest.raises(record.ConfigError, match="2 configs and --record_against_steps gives 1 "):
    record.against_entries(["a.py", "b.py"], ["600"], seeds=[0])
  assert record.against_entries([], ["1500"], seeds=[0]) == []  # --record_against= : alone


def test_the_records_of_a_race_name_each_entry_by_its_steps_and_keep_the_spread():
  runs = [dict(_run("fast@550", 0, 700.0, 23.0, steps=550), compile_s=60.0, training_s=600.0,
               evaluation_s=7.0),
          dict(_run("small", 0, 1500.0, 22.5, steps=1500), compile_s=130.0, training_s=1300.0,
               evaluation_s=7.0),
          dict(_run("fast@550", 1, 760.0, 22.8, steps=550), compile_s=61.0, training_s=640.0,
               evaluation_s=7.0)]
  figures = {"mark": 22.62, "runs": runs, "summary": record.summarize(runs, 22.62)}
  named = {name: (value, unit, extra) for name, value, unit, extra in record.records(figures)}
  value, unit, extra = named["fast.steps550.bleu_mean"]
  assert (value, unit, extra["seeds"], extra["lowest"], extra["all_reached"]) == (
      pytest.approx(22.9), "BLEU", [0, 1], 22.8, True)
  assert named["fast.steps550.time_ratio"][:2] == (pytest.approx(730.0 / 1500.0), "x")
  assert named["small.steps1500.seed0.total_s"] == (1500.0, "s", {"seeds": [0]})
  # A race that chose on dev is named so, with each run's chosen step and last step's BLEU.
  for r in runs:
    r.update(chosen_step=400, last_test_sacrebleu=r["test_sacrebleu"] - 0.1)
  named = {name: value for name, value, *_ in record.records(dict(figures, choose_on_dev=True))}
  assert named["fast.steps550.devchosen.bleu_mean"] == pytest.approx(22.9)
  assert named["fast.steps550.devchosen.seed1.chosen_step"] == 400
  assert named["small.steps1500.devchosen.seed0.last_test_sacrebleu"] == pytest.approx(22.4)


def test_dev_bleu_during_training_is_timed_and_its_share_reported(tmp_path):
  """`--ttb_dev_bleu`: the config's dev BLEU stays on (every 3 steps and at the last), and the
  run reports the seconds its evaluations took (`dev/bleu_seconds`), their share of the run
  and their records' names."""
  from benchmarks import time_to_bleu
  from transformer.run import compilation

  config = support.synthetic_tiny(steps=4)
  config.bleu_every_steps, config.bleu_num_sentences, config.decode.beam_size = 3, 8, 1
  assert time_to_bleu.prepared(config, 4, str(tmp_path / "off")).bleu_every_steps == 0
  config = time_to_bleu.prepared(config, 4, str(tmp_path / "on"), dev_bleu=True)
  with compilation.CompileMonitor() as monitor:
    r = time_to_bleu.run_once(config, str(tmp_path / "on" / "run"), monitor, test_sentences=8)
  logged = support.logged(tmp_path / "on" / "run", "dev/bleu_seconds")
  # Every 3 steps, and at the last step: the final checkpoint is a candidate too.
  assert [s for s, _ in logged] == [3, 4] and all(v > 0 for _, v in logged)
  assert r["dev_bleu_evaluations"] == 2
  assert r["dev_bleu_s"] == pytest.approx(sum(v for _, v in logged))
  assert r["dev_bleu_share"] == pytest.approx(r["dev_bleu_s"] / r["total_s"])
  # The step dev BLEU chose (the first of the best) and its test score, beside the last's.
  dev = support.logged(tmp_path / "on" / "run", "dev/sacrebleu")
  assert r["best_step"] == next(s for s, v in dev if v == max(v for _, v in dev))
  assert 0 <= r["best_test_sacrebleu"] <= 100
  names = [n for n, *_ in time_to_bleu.records(
      {"steps": 4, "dev_bleu": True, "whole_test_split": False,
       "runs": [dict(r, run=1, cache_hits=0, cache_misses=0)]})]
  assert "steps4.test8.devbleu.run1.dev_bleu_share" in names
