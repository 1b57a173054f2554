"""sacreBLEU's paired tests (test-set variance only) against its own command line
(`--paired-bs`, `--paired-ar`) on the same files, written here; seeds paired and
concatenated."""

import json
import re
import subprocess
import sys

import pytest

from tests.evaluation.test_scoring import GERMAN, _degrade
from transformer.data import textio
from transformer.research import significance

REFERENCES = GERMAN * 2  # 48 sentences
CLOSE = [r if i % 5 else " ".join(r.split()[:-1]) for i, r in enumerate(REFERENCES)]
FAR = _degrade(_degrade(REFERENCES))


def sacrebleu_paired(tmp_path, references, baseline, system, test):
  """sacreBLEU's command line on files: `(baseline, system)`, each `{metric: {'score',
  'p_value', 'mean', 'ci'}}` (metric 'BLEU', 'chrF2'; p-values to 4 decimals after `bs`).

  sacreBLEU 2.6's JSON writer fails on the bootstrap's means (NumPy float32), so the bootstrap
  is read from its LaTeX table, printed with 6 decimals (p-values with 4).
  """
  files = [textio.write_lines(tmp_path / name, lines)
           for name, lines in (("ref", references), ("base", baseline), ("sys", system))]
  out = subprocess.run([sys.executable, "-m", "sacrebleu", str(files[0]), "-i", str(files[1]),
                        str(files[2]), f"--paired-{test}", "-m", "bleu", "chrf", "-w", "6",
                        "--format", "json" if test == "ar" else "latex"],
                       check=True, capture_output=True, text=True).stdout
  if test == "ar":
    return tuple(json.loads(out))
  body = out[out.index("\\midrule") + len("\\midrule"):out.index("\\bottomrule")]
  cell = re.compile(r"([\d.]+) \(([\d.]+) ± ([\d.]+)\)(?: \(p = ([\d.]+)\)\*?)?")
  systems = []
  for line in body.strip().splitlines():
    scores = {}
    for name, text in zip(("BLEU", "chrF2"), line.rstrip(" \\").split("&")[1:]):
      score, mean, ci, p = cell.search(text).groups()
      scores[name] = {"score": float(score), "mean": float(mean), "ci": float(ci),
                      "p_value": None if p is None else float(p)}
    systems.append(scores)
  return tuple(systems)


@pytest.mark.parametrize("test, key", [("bs", "p_bootstrap"), ("ar", "p_ar")])
def test_p_values_and_intervals_are_sacrebleus(tmp_path, test, key):
  results = significance.paired_tests(REFERENCES, FAR, {"close": CLOSE, "far": FAR})
  base, close = sacrebleu_paired(tmp_path, REFERENCES, FAR, CLOSE, test)
  for metric, name in (("sacrebleu", "BLEU"), ("chrf", "chrF2")):
    got = results["close"][metric]
    assert got["score"] == pytest.approx(close[name]["score"], abs=1e-6)
    assert got["baseline"] == pytest.approx(base[name]["score"], abs=1e-6)
    assert got["delta"] == pytest.approx(close[name]["score"] - base[name]["score"], abs=2e-6)
    assert got[key] == pytest.approx(close[name]["p_value"], abs=5e-5)
    if test == "bs":
      assert (got["mean"], got["ci"]) == pytest.approx((close[name]["mean"], close[name]["ci"]),
                                                       abs=1e-6)
      assert "bs:1000" in got["signature_bs"] and "seed:12345" in got["signature_bs"]
    assert got["delta"] > 10 and got[key] <= 0.05
    # A system against itself: sacreBLEU's p-value is its smallest, but nothing differs.
    assert results["far"][metric]["delta"] == 0


def _output(seed, hypotheses, references=REFERENCES, run="run"):
  return significance.Output(f"{run}/seed{seed}", seed, list(hypotheses), list(references))


def test_seeds_both_rows_have_are_concatenated_in_order():
  baseline = [_output(0, FAR), _output(1, REFERENCES), _output(2, FAR)]
  variant = [_output(2, CLOSE), _output(0, REFERENCES), _output(7, CLOSE)]
  seeds, base, var, refs = significance.concatenate(baseline, variant)
  assert seeds == [0, 2]
  assert base == FAR + FAR and var == REFERENCES + CLOSE and refs == REFERENCES * 2

  results = significance.compare(baseline, {"v": variant, "odd": [_output(5, CLOSE)],
                                            "moved": [_output(0, CLOSE, CLOSE, "m")]},
                                 resamples=100, trials=100)
  assert (results["v"]["seeds"], results["v"]["sentences"]) == ([0, 2], 2 * len(REFERENCES))
  assert results["v"]["sacrebleu"]["delta"] > 0
  assert results["odd"] == {"problem": "no seed in common (baseline seeds [0, 1, 2], this "
                                       "row's [5])"}
  assert results["moved"]["problem"] == ("seed 0: m/seed0 and run/seed0 were scored against "
                                         "different references")


def test_markdown_names_the_tests_and_marks_nothing():
  results = significance.compare([_output(0, FAR)], {"close": [_output(0, CLOSE)],
                                                     "odd": [_output(3, CLOSE)]})
  text = significance.markdown("base", results)
  assert "test-set variance only" in text and "*" not in text
  close_line = next(line for line in text.splitlines() if line.startswith("| close |"))
  assert f"| {results['close']['sacrebleu']['delta']:+.2f} |" in close_line
  assert "| odd | not compared: no seed in common" in text
  assert "sacrebleu bs: `nrefs:1|bs:1000|seed:12345" in text
  assert "chrf ar: `nrefs:1|ar:10000|seed:12345" in text
  columns = significance.csv_columns(results["close"])
  assert set(columns) == set(significance.CSV_COLUMNS)
  assert columns["sacrebleu_test_set_p_ar"] == results["close"]["sacrebleu"]["p_ar"]
  assert significance.csv_columns(results["odd"]) == {
      "paired_seeds": "not compared: no seed in common (baseline seeds [0], this row's [3])"}
