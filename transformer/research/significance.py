"""Paired significance on the test sentences, by sacreBLEU's own tests: test-set variance only.

These tests ask how much the choice of test sentences decides a difference between two sets
of translations; a second training seed can move a score further than that, so they are not
the report's verdict (seed_significance.py is, over the runs of each row) and mark nothing.

The statistics are sacreBLEU's (`sacrebleu.significance.PairedTest`, what `sacrebleu REF -i
BASE SYS --paired-bs` and `--paired-ar` run), never re-implemented here: paired bootstrap
resampling (1,000 resamples, as Koehn 2004 and Moses' script) and approximate
randomization (10,000 trials, as multeval), both two-sided, with sacreBLEU's seed
(`SACREBLEU_SEED`, 12345 by default), so the same files give the same p-values as
sacreBLEU's command line. For BLEU (13a, as `scoring.sacrebleu_score`) and chrF:

- the difference: the variant's corpus score minus the baseline's, on the same sentences;
- the 95% interval: sacreBLEU's bootstrap interval of the variant's score (`μ ± half-width`
  of the resampled scores; sacreBLEU gives no interval of the difference itself);
- the p-values of both tests.

Over seeds, the test hypotheses of the seeds both rows have are concatenated, seed by seed
(baseline seed k beside variant seed k, against the references of seed k), so k seeds of N
sentences make k × N sentence pairs, tested as if they were one run's.
"""

from __future__ import annotations

import dataclasses

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

RESAMPLES = 1000  # sacreBLEU's default for --paired-bs
TRIALS = 10000  # sacreBLEU's default for --paired-ar
METRICS = ("sacrebleu", "chrf")
# report.csv's columns of a row compared with the baseline (`csv_columns`): named test_set_
# for what they measure.
CSV_COLUMNS = ("paired_seeds", "paired_sentences",
               *(f"{m}_test_set_{k}" for m in METRICS
                 for k in ("delta", "mean", "ci95", "p_bootstrap", "p_ar")))


def metrics(references: list[str]) -> dict:
  """metric -> sacreBLEU's BLEU (13a) and chrF, with `references` cached there, as
  sacreBLEU's command line does."""
  return {"sacrebleu": BLEU(references=[references]), "chrf": CHRF(references=[references])}


def paired_tests(references: list[str], baseline: list[str], systems: dict[str, list[str]],
                 resamples: int = RESAMPLES, trials: int = TRIALS) -> dict[str, dict]:
  """sacreBLEU's paired bootstrap and approximate randomization of each system against the
  baseline, for BLEU and chrF.

  Args:
    references: one reference per sentence.
    baseline: the baseline's hypotheses, aligned with `references`.
    systems: name -> hypotheses, aligned likewise.
    resamples: bootstrap resamples; trials: approximate-randomization trials.

  Returns:
    name -> metric ('sacrebleu' | 'chrf') -> `{'score', 'baseline', 'delta', 'mean', 'ci',
    'p_bootstrap', 'p_ar', 'signature_bs', 'signature_ar'}`: scores on 0–100, `mean ± ci`
    sacreBLEU's 95% bootstrap interval of the system's score, the signatures sacreBLEU's
    (with the test, its samples and its seed).
  """
  named = [("baseline", list(baseline)), *((n, list(h)) for n, h in systems.items())]
  out = {name: {m: {} for m in METRICS} for name in systems}
  for test, samples, key in (("bs", resamples, "p_bootstrap"), ("ar", trials, "p_ar")):
    signatures, scores = PairedTest(named, metrics(list(references)), references=None,
                                    test_type=test, n_samples=samples)()
    # `scores`: 'System', then one list per metric in the order given, baseline first.
    for metric, score_name in zip(METRICS, [k for k in scores if k != "System"]):
      base, *results = scores[score_name]
      for (name, _), result in zip(named[1:], results):
        entry = out[name][metric]
        entry.update({"score": float(result.score), "baseline": float(base.score),
                      "delta": float(result.score - base.score), key: float(result.p_value),
                      f"signature_{test}": signatures[score_name].format()})
        if test == "bs":  # NumPy scalars (float32 for chrF) as plain floats, for JSON
          entry.update(mean=float(result.mean), ci=float(result.ci))
  return out


@dataclasses.dataclass
class Output:
  """One run's translations of the test split, with their references."""

  run: str  # the run's folder, for messages
  seed: int
  hypotheses: list[str]
  references: list[str]
  # COMET's score of each sentence and the model's signature, where its evaluation has them
  # (evaluate.py --comet_model): the seed tests then compare the runs on COMET too.
  comet: list[float] | None = None
  comet_model: str | None = None


def concatenate(baseline: list[Output], variant: list[Output]
                ) -> tuple[list[int], list[str], list[str], list[str]]:
  """`(seeds, baseline hypotheses, variant hypotheses, references)` over the seeds both have.

  Raises:
    ValueError: no seed in common, or references that differ between the two runs of a seed
      (they were not scored on the same sentences); the message says which.
  """
  base = {o.seed: o for o in baseline}
  var = {o.seed: o for o in variant}
  seeds = sorted(base.keys() & var.keys())
  if not seeds:
    raise ValueError(f"no seed in common (baseline seeds {sorted(base)}, this row's "
                     f"{sorted(var)})")
  hyp_base, hyp_var, refs = [], [], []
  for seed in seeds:
    if base[seed].references != var[seed].references:
      raise ValueError(f"seed {seed}: {var[seed].run} and {base[seed].run} were scored against "
                       "different references")
    hyp_base += base[seed].hypotheses
    hyp_var += var[seed].hypotheses
    refs += base[seed].references
  return seeds, hyp_base, hyp_var, refs


def compare(baseline: list[Output], variants: dict[str, list[Output]],
            resamples: int = RESAMPLES, trials: int = TRIALS) -> dict[str, dict]:
  """Each variant against the baseline over the seeds they share (`concatenate`).

  Returns:
    name -> `{'seeds', 'sentences', 'sacrebleu', 'chrf'}` (as `paired_tests`), or
    `{'problem': why not}`.
  """
  out = {}
  for name, outputs in variants.items():
    try:
      seeds, hyp_base, hyp_var, refs = concatenate(baseline, outputs)
    except ValueError as e:
      out[name] = {"problem": str(e)}
      continue
    result = paired_tests(refs, hyp_base, {name: hyp_var}, resamples, trials)[name]
    out[name] = {"seeds": seeds, "sentences": len(refs), **result}
  return out


def markdown(baseline: str, results: dict[str, dict]) -> str:
  """The table of sacreBLEU's paired tests: one line per row compared with the baseline."""
  lines = [
      f"### Against {baseline}, test-set variance only: sacreBLEU's paired tests", "",
      f"Δ = the row's score − {baseline}'s on the same sentences: the test translations "
      "under eval/ of every seed both rows have, concatenated (k seeds of N sentences: k × N "
      "pairs) and tested as one run. p-values: sacreBLEU's paired bootstrap resampling and "
      "approximate randomization (signatures below); the interval is sacreBLEU's 95% "
      "bootstrap interval of the row's score (μ ± half-width). They weigh the test sentences, "
      "not training noise, and mark nothing.", "",
      "| variant | seeds | sentences | BLEU | ΔBLEU | μ ± 95% CI | p bootstrap | p AR "
      "| chrF | ΔchrF | μ ± 95% CI | p bootstrap | p AR |", "|" + "---|" * 13]
  for name, r in results.items():
    if "problem" in r:
      lines.append(f"| {name} | not compared: {r['problem']} |" + " |" * 11)
      continue
    cells = [name, " ".join(map(str, r["seeds"])), str(r["sentences"])]
    for m in METRICS:
      e = r[m]
      cells += [f"{e['baseline']:.2f} → {e['score']:.2f}", f"{e['delta']:+.2f}",
                f"{e['mean']:.2f} ± {e['ci']:.2f}", f"{e['p_bootstrap']:.4f}",
                f"{e['p_ar']:.4f}"]
    lines.append("| " + " | ".join(cells) + " |")
  tested = [r for r in results.values() if "problem" not in r]
  if tested:
    lines += ["", *(f"- {m} {test}: `{tested[0][m]['signature_' + test]}`"
                    for m in METRICS for test in ("bs", "ar"))]
  return "\n".join(lines)


def csv_columns(r: dict) -> dict:
  """A row's `compare` result as report.csv's `CSV_COLUMNS` (`paired_seeds` says why not,
  where the row was not compared)."""
  if "problem" in r:
    return {"paired_seeds": f"not compared: {r['problem']}"}
  out = {"paired_seeds": " ".join(map(str, r["seeds"])), "paired_sentences": r["sentences"]}
  for m in METRICS:
    e = r[m]
    out.update({f"{m}_test_set_delta": e["delta"], f"{m}_test_set_mean": e["mean"],
                f"{m}_test_set_ci95": e["ci"], f"{m}_test_set_p_bootstrap": e["p_bootstrap"],
                f"{m}_test_set_p_ar": e["p_ar"]})
  return out
