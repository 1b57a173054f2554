"""Reports over a sweep of seeds and grid points, written here as training and evaluate.py
leave them: each figure's mean, spread and n, the CSV's rows, the curves' bands, and tests
against a baseline: over the runs of each row, and sacreBLEU's paired tests (checked against
its command line on the same translations)."""

import csv
import json

import numpy as np
import pytest
from matplotlib import image

from tests import support
from tests.evaluation.test_scoring import _degrade
from tests.research.test_significance import CLOSE, FAR, REFERENCES, sacrebleu_paired
from transformer.data import textio
from transformer.errors import ConfigError
from transformer.evaluation import evaluate_lib
from transformer.evaluation import scoring
from transformer.research import plots
from transformer.research import report
from transformer.research import runs as runs_lib
from transformer.run import workdir as workdir_lib


COMET_SIGNATURE = "comet:2.2.7|model:Unbabel/wmt22-comet-da|src+mt+ref"


def _run(workdir, data, variant, seed, warmup, hypotheses=None, comet=None, best=None):
  """A run's workdir as training and evaluate.py leave it: config.json, metrics.jsonl and
  (with `hypotheses`) the test split's eval/ files, with (`comet`: a score per sentence)
  COMET's entry as evaluate.py --comet_model writes it; with `best` (hypotheses), a best
  checkpoint on dev at step 10 and its test translations."""
  config = support.files_config(data, vocab_size=64)
  config.model.update(d_model=32, d_ff=64, num_heads=4, d_k=8, d_v=8, num_layers=1, max_len=32)
  config.data.update(max_source_len=32, max_target_len=32, test_split="test")
  config.update(variant=variant, seed=seed, warmup_steps=warmup)
  workdir.mkdir(parents=True)
  workdir_lib.save_config(workdir, config)
  lines = [{"step": 10, "time": 4.0 + seed, "train/loss": 3.0 + seed},
           {"step": 20, "time": 8.0 + 2 * seed, "train/loss": 2.0 + seed},
           {"step": 20, "dev/perplexity": 6.0 + seed}]
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
  if hypotheses is not None:
    (workdir / "eval").mkdir()
    stem = workdir / "eval" / evaluate_lib.output_stem("test", [20], config.decode)
    textio.write_lines(stem.with_name(stem.name + ".txt"), hypotheses)
    stem.with_name(stem.name + ".json").write_text(json.dumps(
        {"split": "test", "steps": [20], "num_sentences": len(hypotheses),
         "decode": config.decode.to_dict(), **scoring.score(hypotheses, REFERENCES),
         **({"comet": {"score": float(np.mean(comet)), "label": "COMET (m)", "digits": 4,
                       "signature": COMET_SIGNATURE, "segments": comet}} if comet else {})}))
  if best is not None:
    (workdir / "best" / "10").mkdir(parents=True)
    evaluate_lib.write_outputs(str(workdir), "test", [10], config, list(zip(REFERENCES,
                                                                            REFERENCES)),
                               best, scoring.score(best, REFERENCES), best=True)


@pytest.fixture
def seeded_sweep(tmp_path):
  """A sweep root of three rows: base and A1 at warmup_steps=8 over seeds 0 and 1, with test
  translations; A1 at warmup_steps=16, seed 0, not evaluated."""
  data = tmp_path / "data"
  data.mkdir()
  textio.write_lines(data / "test.en", [f"source {i}" for i in range(len(REFERENCES))])
  textio.write_lines(data / "test.de", REFERENCES)
  root = tmp_path / "runs"
  outputs = {("base", 0): FAR, ("base", 1): _degrade(REFERENCES), ("A1", 0): CLOSE,
             ("A1", 1): REFERENCES}
  for (variant, seed), hypotheses in outputs.items():
    _run(root / variant / "warmup_steps=8" / f"seed{seed}", data, variant, seed, 8, hypotheses)
  _run(root / "A1" / "warmup_steps=16" / "seed0", data, "A1", 0, 16)
  (root / "sweep.json").write_text(json.dumps({"grid": {"warmup_steps": ["8", "16"]}}))
  return root, outputs


def test_seeds_give_mean_spread_and_paired_tests_against_the_baseline(seeded_sweep, tmp_path):
  root, outputs = seeded_sweep
  report.write_report(root, baseline="base/warmup_steps=8")
  with open(root / "report.csv") as f:
    rows = list(csv.DictReader(f))
  assert [(r["kind"], r["row"], r["warmup_steps"], r["seed"], r["n"]) for r in rows] == [
      ("run", "A1/warmup_steps=16", "16", "0", "1"),
      ("variant", "A1/warmup_steps=16", "16", "0", "1"),
      ("run", "A1/warmup_steps=8", "8", "0", "1"), ("run", "A1/warmup_steps=8", "8", "1", "1"),
      ("variant", "A1/warmup_steps=8", "8", "0 1", "2"),
      ("run", "base/warmup_steps=8", "8", "0", "1"),
      ("run", "base/warmup_steps=8", "8", "1", "1"),
      ("variant", "base/warmup_steps=8", "8", "0 1", "2")]
  a1, base = rows[4], rows[7]
  bleu = [scoring.score(outputs["A1", s], REFERENCES)["sacrebleu"] for s in (0, 1)]
  assert float(rows[2]["test_sacrebleu"]) == pytest.approx(bleu[0]["score"])
  assert float(rows[2]["test_length_ratio"]) == pytest.approx(bleu[0]["length_ratio"])
  assert float(a1["test_sacrebleu"]) == pytest.approx((bleu[0]["score"] + bleu[1]["score"]) / 2)
  assert float(a1["test_sacrebleu_std"]) == pytest.approx(
      abs(bleu[0]["score"] - bleu[1]["score"]) / 2 ** 0.5)
  assert float(a1["test_brevity_penalty"]) == pytest.approx(
      (bleu[0]["brevity_penalty"] + bleu[1]["brevity_penalty"]) / 2)
  assert (float(a1["dev_perplexity"]), float(a1["dev_perplexity_std"])) == pytest.approx(
      (6.5, 0.5 ** 0.5))

  # Over runs: each row's mean of per-run scores, its permutation p; 2 runs against 2 allow
  # no p below 1/3, so nothing is starred, and the report says so.
  assert (a1["baseline"], a1["runs"], a1["baseline_runs"]) == ("base/warmup_steps=8", "2", "2")
  assert float(a1["sacrebleu_delta"]) == pytest.approx(
      float(a1["test_sacrebleu"]) - float(base["test_sacrebleu"]))
  assert float(a1["sacrebleu_ci95_low"]) <= float(a1["sacrebleu_delta"]) <= float(
      a1["sacrebleu_ci95_high"])
  assert float(a1["smallest_p"]) == pytest.approx(1 / 3)
  assert float(a1["sacrebleu_p_permutation"]) == pytest.approx(1 / 3)
  assert float(a1["sacrebleu_p_greater"]) == 1.0 and a1["significant"] == ""
  assert base["baseline"] == ""
  assert rows[1]["significant"].startswith("not compared: no test translations in ")

  # Test-set variance only: sacreBLEU's own tests on the seeds' translations, concatenated.
  assert (a1["paired_seeds"], a1["paired_sentences"]) == ("0 1", str(2 * len(REFERENCES)))
  concatenated = [outputs[v, 0] + outputs[v, 1] for v in ("base", "A1")]
  for test in ("bs", "ar"):
    sacre_base, sacre = sacrebleu_paired(tmp_path, REFERENCES * 2, *concatenated, test)
    for metric, name in (("sacrebleu", "BLEU"), ("chrf", "chrF2")):
      assert float(a1[f"{metric}_test_set_delta"]) == pytest.approx(
          sacre[name]["score"] - sacre_base[name]["score"], abs=2e-6)
      p = a1[f"{metric}_test_set_p_{'bootstrap' if test == 'bs' else 'ar'}"]
      assert float(p) == pytest.approx(sacre[name]["p_value"], abs=5e-5)
      assert float(p) <= 0.05  # which stars nothing
      if test == "bs":
        assert float(a1[f"{metric}_test_set_ci95"]) == pytest.approx(sacre[name]["ci"], abs=1e-6)

  text = (root / "report.md").read_text()
  assert "| A1/warmup_steps=8 | 8 | 2 |" in text and " ± " in text
  assert "## Against base/warmup_steps=8: over the runs of each row" in text
  seed_line = next(line for line in text.splitlines()
                   if line.startswith("| A1/warmup_steps=8 | 2 vs 2 | "))
  assert f"| {float(a1['sacrebleu_delta']):+.2f} |" in seed_line and "*" not in seed_line
  assert "No star is possible in this table: the smallest p these runs allow is 0.333" in text
  assert "### Against base/warmup_steps=8, test-set variance only" in text
  assert f"| A1/warmup_steps=8 | 0 1 | {2 * len(REFERENCES)} |" in text


def test_comet_scores_of_the_runs_give_a_comet_column_and_a_test_over_seeds(tmp_path):
  """Runs that evaluate.py scored with COMET: the report's test COMET per run and over seeds,
  and ΔCOMET over the runs of each row; a row with an unscored run is not compared on COMET
  (BLEU and chrF still are)."""
  data = tmp_path / "data"
  data.mkdir()
  textio.write_lines(data / "test.en", [f"source {i}" for i in range(len(REFERENCES))])
  textio.write_lines(data / "test.de", REFERENCES)
  root, rng = tmp_path / "runs", np.random.default_rng(0)
  segments = {}
  for variant, shift, hypotheses in (("base", 0.0, FAR), ("A1", 0.1, CLOSE),
                                     ("A2", 0.1, CLOSE)):
    for seed in (0, 1):
      scored = variant != "A2" or seed == 0  # A2's seed 1 was not scored with COMET
      segments[variant, seed] = (list(rng.normal(0.5 + shift, 0.05, len(REFERENCES)))
                                 if scored else None)
      _run(root / variant / f"seed{seed}", data, variant, seed, 8, hypotheses,
           segments[variant, seed])
  with open(root / "A1" / "seed0" / "metrics.jsonl", "a") as f:  # config.comet_model's
    f.write(json.dumps({"step": 20, "dev/comet": 0.6125}) + "\n")
  report.write_report(root, baseline="base")
  with open(root / "report.csv") as f:
    rows = {(r["kind"], r["row"], r["seed"]): r for r in csv.DictReader(f)}
  assert float(rows["run", "A1", "0"]["dev_comet"]) == 0.6125  # from the training log
  assert rows["run", "A1", "1"]["dev_comet"] == ""
  a1 = rows["variant", "A1", "0 1"]
  means = {key: np.mean(s) for key, s in segments.items() if s}
  assert float(rows["run", "A1", "1"]["test_comet"]) == pytest.approx(means["A1", 1])
  assert float(a1["test_comet"]) == pytest.approx((means["A1", 0] + means["A1", 1]) / 2)
  assert float(a1["comet_delta"]) == pytest.approx(
      float(a1["test_comet"]) - float(rows["variant", "base", "0 1"]["test_comet"]))
  assert float(a1["comet_ci95_low"]) <= float(a1["comet_delta"]) <= float(a1["comet_ci95_high"])
  assert float(a1["comet_p_permutation"]) == pytest.approx(1 / 3)
  a2 = rows["variant", "A2", "0 1"]
  assert a2["comet_delta"] == "" and a2["sacrebleu_delta"] != ""
  assert float(a2["test_comet"]) == pytest.approx(means["A2", 0])  # its one scored run
  text = (root / "report.md").read_text()
  assert f"| {means['A2', 0]:.4f} (1 of 2) |" in text
  assert "| test COMET |" in text and "| ΔCOMET |" in text
  assert f"| {float(a1['comet_delta']):+.4f} |" in text
  assert f"A2: not compared on COMET: {root / 'A2' / 'seed1'} has no COMET score" in text


def test_runs_with_a_checkpoint_chosen_on_dev_are_compared_there_too(tmp_path):
  """Where every run has a test score at its best checkpoint on dev, the test over the runs is
  made there too, apart from the latest's: here A1 is ahead at the latest checkpoints and
  behind at the chosen ones; each comparison is of its own translations, and a record."""
  data = tmp_path / "data"
  data.mkdir()
  textio.write_lines(data / "test.en", [f"source {i}" for i in range(len(REFERENCES))])
  textio.write_lines(data / "test.de", REFERENCES)
  root = tmp_path / "runs"
  latest = {"base": (FAR, _degrade(REFERENCES)), "A1": (CLOSE, REFERENCES)}
  chosen = {"base": latest["A1"], "A1": latest["base"]}
  for variant in latest:
    for seed in (0, 1):
      _run(root / variant / f"seed{seed}", data, variant, seed, 8, latest[variant][seed],
           best=chosen[variant][seed])
  report.write_report(root, baseline="base")
  with open(root / "report.csv") as f:
    rows = {r["row"]: r for r in csv.DictReader(f) if r["kind"] == "variant"}
  a1, base = rows["A1"], rows["base"]
  for prefix, figure in (("", "test_sacrebleu"), (report.BEST, "best_test_sacrebleu")):
    delta = float(a1[figure]) - float(base[figure])
    assert float(a1[f"{prefix}sacrebleu_delta"]) == pytest.approx(delta)
    assert (delta > 0) == (prefix == "")
    assert float(a1[f"{prefix}sacrebleu_p_permutation"]) == pytest.approx(1 / 3)
  assert a1["best_baseline"] == "base" and a1["best_step"] == "10"
  text = (root / "report.md").read_text()
  assert "## Against base at the checkpoints chosen on dev: over the runs of each row" in text
  made = {r.name: r for r in report.report_records(root / "report.csv", str(root), "cpu:x")}
  assert made["report.runs.A1.best_sacrebleu_delta"].figure == pytest.approx(
      float(a1["best_sacrebleu_delta"]))
  assert made["report.runs.A1.sacrebleu_delta"].figure == pytest.approx(
      float(a1["sacrebleu_delta"]))


def test_an_unknown_baseline_is_one_line_writing_nothing(seeded_sweep):
  root, _ = seeded_sweep
  with pytest.raises(ConfigError, match=r"^--baseline=A2: no such row; the rows are "
                     r"A1/warmup_steps=16, A1/warmup_steps=8, base/warmup_steps=8$"):
    report.write_report(root, baseline="A2")
  with pytest.raises(ConfigError, match=r"^no test translations in .*A1/warmup_steps=16/seed0"
                     r"/eval/: run python evaluate.py --workdir="):
    report.write_report(root, baseline="A1/warmup_steps=16")
  assert not (root / "report.md").exists()


def test_curves_over_seeds_are_a_mean_and_a_band(tmp_path):
  class Logged:
    def __init__(self, values):
      self.values = values

    def series(self, key):
      return [(step, 10.0 * step, v) for step, v in self.values] if key == "train/loss" else []

  seeds = [Logged([(1, 4.0), (2, 3.0)]), Logged([(1, 6.0), (2, 3.0), (3, 2.0)])]
  assert plots._over_seeds(seeds, "train/loss") == [
      (1, 10.0, 5.0, pytest.approx(2 ** 0.5)), (2, 20.0, 3.0, 0.0), (3, 30.0, 2.0, 0.0)]

  def band_pixels(rows):
    pixels = image.imread(plots.training_curves(rows, tmp_path)["train_loss.png"])[..., :3]
    # The first line's colour (matplotlib's C0) at the band's 20% opacity over white.
    band = 1 - 0.2 * (1 - np.array([0x1F, 0x77, 0xB4]) / 255)
    return np.all(np.abs(pixels - band) < 0.02, axis=-1).sum()

  # One run: a line (whose anti-aliased edges have a few such pixels), no band.
  assert (band_pixels([runs_lib.Row("A1", seeds)])
          > 10 * band_pixels([runs_lib.Row("A1", seeds[:1])]))
