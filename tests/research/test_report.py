"""Reports over one trained workdir: its logged figures (BLEU's length among them),
evaluate.py's scores, the plots; and one-line errors for folders without runs. Reports over
seeds and grids: test_report_seeds.py."""

import csv
import json
import os
import shutil
import subprocess
import sys

import pytest
from matplotlib import image

from tests.conftest import REPO, TRAINED_STEPS
from tests import support
from transformer.research import params
from transformer.research import plots
from transformer.research import report
from transformer.research import runs as runs_lib
from transformer.run import workdir as workdir_lib
from transformer.errors import ConfigError


def test_one_run_beside_its_logs_and_evaluations(copy_of_trained, tmp_path):
  config, workdir = copy_of_trained
  (workdir / "eval").mkdir()
  scored = {"split": "test", "steps": [60, 120], "num_sentences": 24,
            "sacrebleu": {"score": 1.5}, "tokenized_bleu": {"score": 2.5}, "chrf": {"score": 9}}
  (workdir / "eval" / "test_step120_avg2.json").write_text(json.dumps(scored))
  out = tmp_path / "report"
  written = report.write_report(workdir, out)

  with open(out / "report.csv") as f:
    row, mean = list(csv.DictReader(f))  # the run, and its report row (n = 1)
  assert (row["kind"], mean["kind"], mean["n"]) == ("run", "variant", "1")
  assert mean["test_sacrebleu"] == row["test_sacrebleu"] and mean["test_sacrebleu_std"] == ""
  assert row["variant"] == workdir.name and row["steps"] == str(TRAINED_STEPS)
  assert float(row["params_m"]) * 1e6 == pytest.approx(params.report(config)[-1][1])
  assert float(row["dev_perplexity"]) == pytest.approx(
      support.logged(workdir, "dev/perplexity")[-1][1])
  assert float(row["dev_sacrebleu"]) == pytest.approx(
      support.logged(workdir, "dev/sacrebleu")[-1][1])
  assert row["dev_bleu_source"] == "training log: first 16 sentences"
  # Training-time BLEU logs its brevity penalty and length ratio beside it.
  assert float(row["dev_length_ratio"]) == pytest.approx(
      support.logged(workdir, "dev/sacrebleu_length_ratio")[-1][1])
  assert 0 < float(row["dev_brevity_penalty"]) <= 1
  assert (row["test_sacrebleu"], row["test_tokenized_bleu"]) == ("1.5", "2.5")
  assert row["test_bleu_source"] == (
      "eval/test_step120_avg2.json: 24 sentences, step 120, 2 checkpoints averaged")
  assert row["paper_ppl_dev"] == row["paper_params_m"] == ""  # no paper row for this config
  assert float(row["wall_time_s"]) > 0 and float(row["target_tokens_per_s"]) > 0
  assert f"| {workdir.name} |" in (out / "report.md").read_text()
  for filename, _, _, _ in plots.CURVES:
    height, width, _ = image.imread(written[filename]).shape
    assert (width, height) == (1200, 450)


def test_of_several_evaluations_the_one_decoded_as_configured_is_reported(copy_of_trained):
  config, workdir = copy_of_trained
  (workdir / "eval").mkdir()
  configured = dict(config.decode)
  greedy = dict(configured, beam_size=1)
  for age, (stem, decode, bleu) in enumerate([
      ("test_step120_beam4_alpha0.6", configured, 3.0),
      ("test_step120_greedy", greedy, 2.0)]):
    path = workdir / "eval" / f"{stem}.json"
    path.write_text(json.dumps({"split": "test", "steps": [120], "num_sentences": 24,
                                "decode": decode, "sacrebleu": {"score": bleu},
                                "tokenized_bleu": {"score": bleu}}))
    os.utime(path, (1000 + age, 1000 + age))  # the greedy one is the newer
  assert configured["beam_size"] == 4 and configured["length_penalty"] == 0.6
  row = runs_lib.summarize(runs_lib.load_run(workdir))
  assert row["test_sacrebleu"] == 3.0
  assert row["test_bleu_source"] == (
      "eval/test_step120_beam4_alpha0.6.json: 24 sentences, step 120, decoded beam4_alpha0.6")

  (workdir / "eval" / "test_step120_beam4_alpha0.6.json").unlink()  # none as configured
  row = runs_lib.summarize(runs_lib.load_run(workdir))
  assert (row["test_sacrebleu"], row["test_bleu_source"]) == (
      2.0, "eval/test_step120_greedy.json: 24 sentences, step 120, decoded greedy")


def test_averaged_checkpoints_are_reported_before_the_newer_end_of_run_score(copy_of_trained):
  """Training's end-of-run score (the last checkpoint) is written after evaluate.py's average
  of `num_average` checkpoints when a finished run is run again; the average is reported."""
  config, workdir = copy_of_trained
  (workdir / "eval").mkdir()
  for age, (stem, steps, bleu) in enumerate([("test_step120_avg2_beam4_alpha0.6", [60, 120], 4.0),
                                             ("test_step120_beam4_alpha0.6", [120], 3.0)]):
    path = workdir / "eval" / f"{stem}.json"
    path.write_text(json.dumps({"split": "test", "steps": steps, "num_sentences": 24,
                                "decode": dict(config.decode), "sacrebleu": {"score": bleu},
                                "tokenized_bleu": {"score": bleu}}))
    os.utime(path, (1000 + age, 1000 + age))
  for num_average, bleu in ((2, 4.0), (1, 3.0), (5, 3.0)):  # 5: none averaged 5, the latest
    config.num_average = num_average
    workdir_lib.save_config(workdir, config)
    assert runs_lib.summarize(runs_lib.load_run(workdir))["test_sacrebleu"] == bleu, num_average


def _set_logged(workdir, key: str, values: dict[int, float]) -> None:
  """Rewrites `key` in the workdir's metrics.jsonl at the given steps."""
  path = workdir / "metrics.jsonl"
  lines = [json.loads(line) for line in path.read_text().splitlines()]
  for line in lines:
    if key in line and line["step"] in values:
      line[key] = values.pop(line["step"])
  assert not values, f"{key} is not logged at steps {sorted(values)}"
  path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_ensembles_are_not_the_runs_own_and_its_best_on_dev_has_columns_of_its_own(
    copy_of_trained, tmp_path):
  """An ensemble's evaluation (`models` > 1, or `_ens` in a file written before evaluations said
  so), though newer, is not the run's test score; the best checkpoint's step and test scores
  (`--checkpoint=best`) are columns of their own."""
  config, workdir = copy_of_trained
  (workdir / "eval").mkdir()
  for age, (stem, extra, steps, bleu) in enumerate([
      ("test_step120_beam4_alpha0.6", {}, [120], 3.0),
      ("test_step120_ens3_beam4_alpha0.6", {"models": 3}, [120], 5.0),
      ("test_step120_ens2_beam4_alpha0.6", {}, [120], 6.0),
      ("test_step60_best_beam4_alpha0.6", {"checkpoint": "best"}, [60], 4.0)]):
    path = workdir / "eval" / f"{stem}.json"
    path.write_text(json.dumps({"split": "test", "steps": steps, "num_sentences": 24,
                                "decode": dict(config.decode), "sacrebleu": {"score": bleu},
                                "tokenized_bleu": {"score": bleu}, "chrf": {"score": bleu},
                                **extra}))
    os.utime(path, (1000 + age, 1000 + age))
  shutil.rmtree(workdir / "best", ignore_errors=True)  # the trained run's (dev BLEU's) best
  (workdir / "best" / "60").mkdir(parents=True)  # what training keeps: best/<step>/
  _set_logged(workdir, "dev/sacrebleu", {60: 7.25, 120: 2.5})  # apart, unlike a tiny run's
  row = runs_lib.summarize(runs_lib.load_run(workdir))
  assert (row["test_sacrebleu"], row["best_step"], row["best_test_sacrebleu"],
          row["best_test_chrf"]) == (3.0, 60, 4.0, 4.0)
  assert row["best_dev_sacrebleu"] == 7.25  # what training logged at the chosen step
  report.write_report(workdir, tmp_path / "report")
  table = (tmp_path / "report" / "report.md").read_text()
  assert "| best on dev: step | its dev BLEU | its test BLEU / chrF |" in table
  assert "| 60 | 7.2 | 4.0 / 4.0 |" in table


def test_no_runs_and_incompatible_runs_are_one_line_errors_writing_nothing(tmp_path):
  with pytest.raises(ConfigError, match=r"no runs in .*: neither it nor a folder in it has a "
                     r"config.json"):
    report.write_report(tmp_path)
  (tmp_path / "old").mkdir()
  (tmp_path / "old" / workdir_lib.CONFIG_FILE).write_text('{"model": {"d_model": 8}}')
  with pytest.raises(ConfigError, match=r"old/config.json: .*incompatible"):
    report.write_report(tmp_path)
  assert sorted(p.name for p in tmp_path.rglob("*")) == ["config.json", "old"]


def test_cli_error_is_one_line_with_status_2(tmp_path):
  run = subprocess.run([sys.executable, "-m", "transformer.research.report",
                        f"--workdir={tmp_path}"], cwd=REPO, capture_output=True, text=True)
  assert run.returncode == 2 and run.stderr.startswith("error: no runs in")
  assert run.stderr.count("\n") == 1 and list(tmp_path.iterdir()) == []
