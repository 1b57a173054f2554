"""Significance over training seeds: whether a row beats the baseline beyond training noise.

sacreBLEU's paired tests (significance.py) ask how much the test sentences decide a
difference between two sets of translations; they say nothing about how much another seed
would move it. Here each run is one draw of training (Clark et al. 2011: replicate, test over
the replicates), and for BLEU (13a, as `scoring.sacrebleu_score`), chrF and, where every run's
evaluation scored it with the same model (evaluate.py --comet_model), COMET:

- Δ: the mean of the row's runs minus the mean of the baseline's, each run's corpus score on
  the whole test split;
- its 95% interval, from a two-level bootstrap: resample the runs of each row (with
  replacement), then the test sentences (with replacement, the same sentences for both
  rows), and recompute every run's corpus score from sacreBLEU's sufficient statistics
  (COMET's: the mean of the drawn sentences' scores);
- P(>): the probability that a run of the row scores above a run of the baseline (Bouthillier
  et al. 2021; ties count half), on the observed runs, with its interval from the bootstrap;
- p: an exact permutation test over the per-run scores: every way to split the pooled runs
  into two groups of the rows' sizes, two-sided on |Δ|. It can be no smaller than
  `smallest_p` (3 against 3 runs: 20 splits, of which the observed and its mirror are the
  most extreme, so 0.1);
- Holm–Bonferroni over the rows of one report, for each metric apart: a row is significant
  when its corrected p is at most `ALPHA` and its Δ is not zero.

Pairing seed k of the baseline with seed k of the row is arbitrary, so nothing here pairs
runs: the rows may have different seeds and different numbers of them.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from sacrebleu.metrics import CHRF
from sacrebleu.metrics.bleu import MAX_NGRAM_ORDER

from transformer.research import significance

RESAMPLES = 1000  # two-level bootstrap resamples
SEED = 12345  # the bootstrap's generator, as sacreBLEU's default seed: same files, same output
EXACT_SPLITS = 200_000  # permutation test: enumerate up to this many splits, else draw
DRAWN_SPLITS = 100_000
ALPHA = 0.05
METRICS = (*significance.METRICS, "comet")
DIGITS = {"sacrebleu": 2, "chrf": 2, "comet": 4}  # COMET's scale is about 0-1
LABELS = {"sacrebleu": "BLEU", "chrf": "chrF", "comet": "COMET"}
# report.csv's columns of a row compared with the baseline (`csv_columns`).
CSV_COLUMNS = ("baseline", "runs", "baseline_runs",
               *(f"{m}_{k}" for m in METRICS
                 for k in ("delta", "ci95_low", "ci95_high", "p_greater", "p_greater_low",
                           "p_greater_high", "p_permutation", "p_holm")),
               "smallest_p", "significant")


def corpus_scores(metric: str, stats: np.ndarray) -> np.ndarray:
  """The corpus score from summed sufficient statistics, over any leading axes.

  The formulas of sacreBLEU's `BLEU._compute_score_from_stats` (default: exponential
  smoothing, no effective order) and `CHRF._compute_f_score` (default: char order 6, β 2), on
  arrays; COMET's system score is the mean of its sentences' scores.

  Args:
    metric: 'sacrebleu', 'chrf' or 'comet'.
    stats: [..., S] summed statistics as `_extract_corpus_statistics` lists them
      (BLEU: hypothesis and reference length, 4 matches, 4 totals; chrF: hypothesis,
      reference and match counts of each of the 6 orders); COMET's: the sum of the
      sentences' scores and their number.

  Returns:
    [...] scores: BLEU and chrF on 0–100, COMET on its model's scale.
  """
  stats = np.asarray(stats, dtype=np.float64)
  if metric == "sacrebleu":
    return _bleu(stats)
  if metric == "chrf":
    return _chrf(stats)
  if metric == "comet":
    return stats[..., 0] / stats[..., 1]
  raise ValueError(f"metric={metric!r}: expected one of {METRICS}")


def _bleu(stats: np.ndarray) -> np.ndarray:
  order = MAX_NGRAM_ORDER
  sys_len, ref_len = stats[..., 0], stats[..., 1]
  correct, total = stats[..., 2:2 + order], stats[..., 2 + order:2 + 2 * order]
  with np.errstate(divide="ignore", invalid="ignore"):
    bp = np.where(sys_len < ref_len,
                  np.where(sys_len > 0, np.exp(1 - ref_len / np.maximum(sys_len, 1)), 0.0), 1.0)
    # sacreBLEU stops at the first order without n-grams (its precisions stay 0) and, for an
    # order with no match, halves the smoothed count once more ('exp', as mteval-v13a.pl).
    counted = np.cumprod(total > 0, axis=-1).astype(bool)
    halvings = np.cumsum(correct == 0, axis=-1)
    precisions = np.where(correct == 0, 100.0 / (2.0 ** halvings * total),
                          100.0 * correct / total)
    logs = np.where(counted & (precisions > 0), np.log(np.where(counted, precisions, 1.0)),
                    -9999999999.0)  # sacreBLEU's `my_log(0)`
  score = bp * np.exp(logs.mean(axis=-1))
  return np.where(correct.any(axis=-1), score, 0.0)


def _chrf(stats: np.ndarray) -> np.ndarray:
  beta2 = CHRF.BETA ** 2
  hyp, ref, match = stats[..., 0::3], stats[..., 1::3], stats[..., 2::3]
  effective = (hyp > 0) & (ref > 0)
  count = effective.sum(axis=-1)
  with np.errstate(divide="ignore", invalid="ignore"):
    prec = np.where(effective, match / hyp, 0.0).sum(axis=-1) / np.maximum(count, 1)
    rec = np.where(effective, match / ref, 0.0).sum(axis=-1) / np.maximum(count, 1)
    score = 100 * (1 + beta2) * prec * rec / (beta2 * prec + rec)
  return np.where(prec + rec > 0, score, 0.0)


def smallest_p(n_baseline: int, n_variant: int) -> float:
  """The smallest two-sided p-value the permutation test can give these numbers of runs.

  Rows of equal size: the observed split and its mirror are both the most extreme, so
  2 / C(n, k); otherwise 1 / C(n, k) (or one in the drawn splits, past `EXACT_SPLITS`).
  """
  splits = math.comb(n_baseline + n_variant, n_variant)
  if splits > EXACT_SPLITS:
    return 1 / (DRAWN_SPLITS + 1)
  return min(1.0, (2 if n_baseline == n_variant else 1) / splits)


def permutation_p(baseline: np.ndarray, variant: np.ndarray, seed: int = SEED) -> float:
  """Two-sided permutation p of the difference of mean per-run scores.

  Args:
    baseline: [Ra] the baseline's per-run scores; variant: [Rb] the row's.
    seed: for the drawn splits, past `EXACT_SPLITS` (none below it: the p-value is exact).

  Returns:
    The share of splits of the pooled runs into groups of Ra and Rb whose |Δ| reaches the
    observed one (drawn: `(1 + hits) / (1 + draws)`).
  """
  baseline, variant = np.asarray(baseline, np.float64), np.asarray(variant, np.float64)
  pooled = np.concatenate([baseline, variant])
  n, k = len(pooled), len(variant)
  observed = abs(variant.mean() - baseline.mean())
  exact = math.comb(n, k) <= EXACT_SPLITS
  if exact:
    chosen = np.array(list(itertools.combinations(range(n), k)))  # [C, Rb]
  else:
    rng = np.random.default_rng(seed)
    chosen = np.argsort(rng.random((DRAWN_SPLITS, n)), axis=1)[:, :k]
  sums = pooled[chosen].sum(axis=1)
  deltas = np.abs(sums / k - (pooled.sum() - sums) / (n - k))
  # Sums in another order round differently: a split as extreme as the observed one counts.
  hits = np.sum(deltas >= observed - 1e-9 * max(1.0, observed))
  return float(hits / len(chosen) if exact else (1 + hits) / (1 + DRAWN_SPLITS))


def holm(p_values: dict[str, float]) -> dict[str, float]:
  """Holm–Bonferroni adjusted p-values: the i-th smallest of m times (m − i + 1), made
  non-decreasing in that order, at most 1. A row is significant when its adjusted p <= α."""
  ordered = sorted(p_values, key=p_values.get)
  adjusted, running = {}, 0.0
  for i, name in enumerate(ordered):
    running = max(running, min(1.0, (len(ordered) - i) * p_values[name]))
    adjusted[name] = running
  return adjusted


def seed_test(metric: str, baseline: np.ndarray, variant: np.ndarray,
              resamples: int = RESAMPLES, seed: int = SEED) -> dict:
  """One metric of one row against the baseline, over their runs.

  Args:
    metric: 'sacrebleu', 'chrf' or 'comet'.
    baseline: [Ra, N, S] each baseline run's sentence statistics; variant: [Rb, N, S] the
      row's, on the same N sentences.
    resamples: two-level bootstrap resamples; seed: their generator's.

  Returns:
    `{'baseline', 'score', 'delta', 'ci_low', 'ci_high', 'p_greater', 'p_greater_low',
    'p_greater_high', 'p_permutation', 'smallest_p'}`: the mean scores, Δ and its 95%
    interval, P(a run of the row > a run of the baseline) and its interval, the permutation p
    and the smallest p these numbers of runs allow.
  """
  runs_a, n, _ = baseline.shape
  runs_b = variant.shape[0]
  scores_a = corpus_scores(metric, baseline.sum(axis=1))  # [Ra]
  scores_b = corpus_scores(metric, variant.sum(axis=1))  # [Rb]
  rng = np.random.default_rng(seed)
  # The same resampled sentences for every run of both rows: they share one test split.
  drawn = rng.integers(n, size=(resamples, n)) + n * np.arange(resamples)[:, None]
  counts = np.bincount(drawn.ravel(), minlength=resamples * n).reshape(resamples, n)  # [B, N]
  counts = counts.astype(np.float64)
  boot = []
  for stats, runs in ((baseline, runs_a), (variant, runs_b)):
    # NumPy's own loop, not BLAS: these products are small, and BLAS threads waiting on cores
    # that other processes hold cost more than the product (a test suite's workers).
    per_run = np.einsum("bn,rns->brs", counts, stats)  # [B, R, S]
    scores = corpus_scores(metric, per_run)  # [B, R]
    boot.append(np.take_along_axis(scores, rng.integers(runs, size=(resamples, runs)), 1))
  deltas = boot[1].mean(axis=1) - boot[0].mean(axis=1)  # [B]
  greater = _p_greater(boot[0], boot[1])  # [B]
  ci_low, ci_high = np.percentile(deltas, [2.5, 97.5])
  p_low, p_high = np.percentile(greater, [2.5, 97.5])
  return {"baseline": float(scores_a.mean()), "score": float(scores_b.mean()),
          "delta": float(scores_b.mean() - scores_a.mean()),
          "ci_low": float(ci_low), "ci_high": float(ci_high),
          "p_greater": float(_p_greater(scores_a[None], scores_b[None])[0]),
          "p_greater_low": float(p_low), "p_greater_high": float(p_high),
          "p_permutation": permutation_p(scores_a, scores_b, seed),
          "smallest_p": smallest_p(runs_a, runs_b)}


def _p_greater(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """[B, Ra], [B, Rb] -> [B]: the share of pairs (a run, b run) with b above a, ties half."""
  a, b = a[:, None, :], b[:, :, None]
  return ((b > a) + 0.5 * (b == a)).mean(axis=(1, 2))


def sentence_statistics(outputs: list[significance.Output],
                        like: significance.Output | None = None) -> dict[str, np.ndarray]:
  """metric -> [R, N, S]: each run's sentence statistics, by sacreBLEU's metrics, and COMET's
  (each sentence's score and 1) where `comet_problem` finds none.

  Raises:
    ValueError: runs scored against different references (among themselves, or from `like`:
      the baseline's first run), naming two of them.
  """
  first = like or outputs[0]
  for o in outputs:
    if o.references != first.references:
      raise ValueError(f"{o.run} and {first.run} were scored against different references")
  metrics = significance.metrics(first.references)
  stats = {m: np.array([metrics[m]._extract_corpus_statistics(o.hypotheses, None)
                        for o in outputs], dtype=np.float64) for m in significance.METRICS}
  if comet_problem(outputs, like) is None:
    scores = np.array([o.comet for o in outputs], dtype=np.float64)  # [R, N]
    stats["comet"] = np.stack([scores, np.ones_like(scores)], axis=-1)
  return stats


def comet_problem(outputs: list[significance.Output],
                  like: significance.Output | None = None) -> str | None:
  """Why these runs (with `like`, the baseline's first) cannot be compared on COMET: a run
  without a score per sentence, or runs scored by different COMET models; None when they
  can."""
  for o in outputs:
    if o.comet is None or len(o.comet) != len(o.references):
      return f"{o.run} has no COMET score per sentence (evaluate.py --comet_model)"
  first = like or outputs[0]
  for o in outputs:
    if o.comet_model != first.comet_model:
      return f"{o.run} and {first.run} were scored by different COMET models"
  return None


def compare(baseline: list[significance.Output],
            variants: dict[str, list[significance.Output]],
            resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, dict]:
  """Every row against the baseline over all of their runs, Holm-corrected over the rows.

  Returns:
    name -> `{'runs', 'baseline_runs', 'smallest_p', 'sacrebleu', 'chrf'}` (each metric as
    `seed_test`, with 'p_holm' and 'significant'), with 'comet' likewise where some run has
    COMET scores (`{'problem': why not}` for a row that cannot be compared on it), or
    `{'problem': why not}`.

  Raises:
    ValueError: the baseline's runs were scored against different references.
  """
  base = sentence_statistics(baseline)
  any_comet = any(o.comet is not None for runs in (baseline, *variants.values()) for o in runs)
  out = {}
  for name, outputs in variants.items():
    try:
      stats = sentence_statistics(outputs, baseline[0])
    except ValueError as e:
      out[name] = {"problem": str(e)}
      continue
    out[name] = {"runs": len(outputs), "baseline_runs": len(baseline),
                 "smallest_p": smallest_p(len(baseline), len(outputs)),
                 **{m: seed_test(m, base[m], stats[m], resamples, seed)
                    for m in METRICS if m in base and m in stats}}
    if any_comet and "comet" not in out[name]:
      out[name]["comet"] = {"problem": comet_problem(baseline) or
                            comet_problem(outputs, baseline[0])}
  for m in METRICS:
    compared = [name for name, r in out.items() if "p_permutation" in r.get(m, {})]
    adjusted = holm({name: out[name][m]["p_permutation"] for name in compared})
    for name in compared:
      entry = out[name][m]
      entry.update(p_holm=adjusted[name],
                   significant=entry["delta"] != 0 and adjusted[name] <= ALPHA)
  return out


def markdown(baseline: str, results: dict[str, dict], at: str = "") -> str:
  """The seed-aware table: one line per row compared with the baseline (COMET's columns where
  some row has them), and whether a star is possible at all with these numbers of runs and
  rows; `at` says which checkpoints, in the heading."""
  shown = [m for m in METRICS
           if m in significance.METRICS or any(m in r for r in results.values())]
  header = ["variant", "runs"]
  for m in shown:
    header += [LABELS[m], f"Δ{LABELS[m]}", "95% CI", "P(>)", "p", "p Holm"]
  lines = [
      f"## Against {baseline}{at}: over the runs of each row", "",
      f"Δ = the mean of the row's runs − the mean of {baseline}'s, each run's corpus score on "
      "the test split; 95% interval from a two-level bootstrap (runs, then sentences); P(>) = "
      f"the probability that a run of the row scores above a run of {baseline}, with its "
      "interval; p = an exact permutation test over the per-run scores (two-sided), then "
      "Holm–Bonferroni over the rows of this table, for each metric apart; * marks "
      f"p Holm ≤ {ALPHA}. Smallest p: the smallest p-value these numbers of runs allow.", "",
      "| " + " | ".join(header + ["smallest p"]) + " |", "|" + "---|" * (len(header) + 1)]
  notes = []
  for name, r in results.items():
    if "problem" in r:
      lines.append(f"| {name} | not compared: {r['problem']} |" + " |" * (len(header) - 1))
      continue
    cells = [name, f"{r['runs']} vs {r['baseline_runs']}"]
    for m in shown:
      cells += _metric_cells(r[m], DIGITS[m])
      if "problem" in r[m]:
        notes.append(f"{name}: not compared on {LABELS[m]}: {r[m]['problem']}.")
    lines.append("| " + " | ".join(cells + [f"{r['smallest_p']:.3g}"]) + " |")
  tested = [r for r in results.values() if "problem" not in r]
  if tested and min(r["smallest_p"] for r in tested) * len(tested) > ALPHA:
    lines += ["", f"No star is possible in this table: the smallest p these runs allow is "
              f"{min(r['smallest_p'] for r in tested):.3g}, and Holm over {len(tested)} "
              f"row(s) needs p ≤ {ALPHA / len(tested):.3g} for the first; more seeds per row "
              "lower it."]
  return "\n".join(lines + ([""] + notes if notes else []))


def _metric_cells(e: dict, digits: int) -> list[str]:
  """One metric's six cells of a row: scores, Δ (starred), interval, P(>), p, p Holm."""
  if "problem" in e:
    return ["–"] * 6
  return [f"{e['baseline']:.{digits}f} → {e['score']:.{digits}f}",
          f"{e['delta']:+.{digits}f}{'*' if e['significant'] else ''}",
          f"[{e['ci_low']:+.{digits}f}, {e['ci_high']:+.{digits}f}]",
          f"{e['p_greater']:.2f} [{e['p_greater_low']:.2f}, {e['p_greater_high']:.2f}]",
          f"{e['p_permutation']:.3g}", f"{e['p_holm']:.3g}"]


def csv_columns(baseline: str, r: dict) -> dict:
  """A row's `compare` result as report.csv's `CSV_COLUMNS` (`significant`: the metrics
  significant after correction, or why the row was not compared)."""
  if "problem" in r:
    return {"baseline": baseline, "significant": f"not compared: {r['problem']}"}
  out = {"baseline": baseline, "runs": r["runs"], "baseline_runs": r["baseline_runs"],
         "smallest_p": r["smallest_p"]}
  compared = [m for m in METRICS if "p_permutation" in r.get(m, {})]
  for m in compared:
    e = r[m]
    out.update({f"{m}_delta": e["delta"], f"{m}_ci95_low": e["ci_low"],
                f"{m}_ci95_high": e["ci_high"], f"{m}_p_greater": e["p_greater"],
                f"{m}_p_greater_low": e["p_greater_low"],
                f"{m}_p_greater_high": e["p_greater_high"],
                f"{m}_p_permutation": e["p_permutation"], f"{m}_p_holm": e["p_holm"]})
  out["significant"] = " ".join(m for m in compared if r[m]["significant"])
  return out
