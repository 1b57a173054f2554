"""Significance over seeds: the vectorised scores against sacreBLEU's, the permutation p against
SciPy and an enumeration written here, Holm against its step-down definition, and the star
calibrated on simulated runs (A/A: no more stars than α; A/B: 2 BLEU over 5 runs found)."""

import itertools

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF

from tests.evaluation.test_scoring import _degrade
from tests.research.test_significance import CLOSE, FAR, REFERENCES
from transformer.evaluation import scoring
from transformer.research import seed_significance
from transformer.research import significance


def _random_bleu_stats(rng, n):
  """[n, 10] summed BLEU statistics, with orders lacking matches or n-grams among them."""
  total = -np.sort(-rng.integers(0, 30, (n, 4)), axis=1)  # fewer 4-grams than unigrams
  correct = (total * rng.random((n, 4))).astype(int)
  correct[rng.random((n, 4)) < 0.2] = 0
  return np.concatenate([rng.integers(0, 40, (n, 2)), correct, total], axis=1)


def _random_chrf_stats(rng, n):
  hyp, ref = rng.integers(0, 50, (2, n, 6))
  hyp[rng.random((n, 6)) < 0.1] = 0
  match = (np.minimum(hyp, ref) * rng.random((n, 6))).astype(int)
  return np.stack([hyp, ref, match], axis=-1).reshape(n, 18)


@pytest.mark.parametrize("metric, sacre, random_stats", [
    ("sacrebleu", BLEU(), _random_bleu_stats), ("chrf", CHRF(), _random_chrf_stats)])
def test_corpus_scores_are_sacrebleus_from_the_same_statistics(metric, sacre, random_stats):
  stats = random_stats(np.random.default_rng(0), 500)
  expected = [sacre._compute_score_from_stats([int(x) for x in s]).score for s in stats]
  np.testing.assert_allclose(seed_significance.corpus_scores(metric, stats), expected,
                             rtol=1e-12, atol=1e-12)
  # And on sentences: the statistics the report extracts, summed, give the corpus score.
  extracted = seed_significance.sentence_statistics(
      [significance.Output("run", 0, FAR, REFERENCES)])[metric]  # [1, N, S]
  scored = scoring.score(FAR, REFERENCES)[metric]["score"]
  assert seed_significance.corpus_scores(metric, extracted.sum(1))[0] == pytest.approx(scored)


def _enumerated_p(a, b):
  """Two-sided p by every labelling of the pooled runs (each distinct split once)."""
  pooled, seen, hits = list(a) + list(b), set(), 0
  for order in itertools.permutations(range(len(pooled))):
    group = frozenset(order[:len(b)])
    if group in seen:
      continue
    seen.add(group)
    var = [pooled[i] for i in group]
    base = [pooled[i] for i in range(len(pooled)) if i not in group]
    hits += abs(np.mean(var) - np.mean(base)) >= abs(np.mean(b) - np.mean(a)) - 1e-9
  return hits / len(seen)


def test_permutation_p_against_scipy_and_enumeration():
  import scipy.stats  # here, not at the top: 0.7 CPU seconds that every worker's collection paid

  rng = np.random.default_rng(1)
  for _ in range(5):
    a, b = rng.normal(10, 1, 3), rng.normal(11, 1, 3)
    exact = scipy.stats.permutation_test(
        (b, a), lambda x, y: np.mean(x) - np.mean(y), permutation_type="independent",
        n_resamples=np.inf, alternative="two-sided").pvalue
    assert seed_significance.permutation_p(a, b) == pytest.approx(exact)
    a, b = rng.normal(10, 1, 2), rng.normal(11, 1, 4)  # unequal: SciPy's two-sided differs
    assert seed_significance.permutation_p(a, b) == pytest.approx(_enumerated_p(a, b))

  # Past EXACT_SPLITS (12 against 12: 2.7M splits) the splits are drawn.
  a, b = rng.normal(10, 1, 12), rng.normal(10.5, 1, 12)
  drawn = scipy.stats.permutation_test(
      (b, a), lambda x, y: np.mean(x) - np.mean(y), permutation_type="independent",
      n_resamples=20_000, alternative="two-sided", random_state=0).pvalue
  assert seed_significance.permutation_p(a, b) == pytest.approx(drawn, abs=0.02)

  # The smallest p the numbers of runs allow is what the most separated runs get.
  for n_a, n_b, smallest in ((3, 3, 0.1), (2, 3, 0.1), (5, 5, 2 / 252), (1, 1, 1.0)):
    assert seed_significance.smallest_p(n_a, n_b) == pytest.approx(smallest)
    assert seed_significance.permutation_p(np.arange(n_a), 10 + np.arange(n_b)) == (
        pytest.approx(smallest))
  assert seed_significance.permutation_p([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0


def test_holm_is_the_step_down_procedure():
  rng = np.random.default_rng(2)
  for _ in range(50):
    p = dict(zip("abcdef", rng.random(6) ** 3))
    adjusted = seed_significance.holm(p)
    for alpha in (0.01, 0.05, 0.2):
      rejected = set()  # Holm 1979: reject in order of p while p_(i) <= α / (m - i + 1)
      for i, name in enumerate(sorted(p, key=p.get)):
        if p[name] > alpha / (len(p) - i):
          break
        rejected.add(name)
      assert {name for name in p if adjusted[name] <= alpha} == rejected
  assert seed_significance.holm({"a": 0.02, "b": 0.5}) == {"a": 0.04, "b": 0.5}


def _simulated_runs(rng, comparisons, runs, shift):
  """[C, 2, R, N, 10] int32: BLEU statistics of `runs` runs of a baseline and a row, for each
  comparison.

  Each comparison has its own test set: N = 600 sentences of 20 to 52 tokens, each token
  matched by a run when a uniform draw, shared by every run (the same test sentence), falls
  below the run's match probability, whose logit is the sentence's difficulty plus the run's
  effect (one normal draw per run: its seed) plus `shift` for the row. The n-gram matches are
  the windows of n matched tokens; hypotheses are as long as references.
  """
  n = 600
  lengths = rng.integers(20, 53, (comparisons, 1, 1, n, 1))
  tokens = np.arange(lengths.max()) < lengths
  draws = rng.random(tokens.shape, dtype=np.float32)
  difficulty = rng.normal(0, 0.2, (comparisons, 1, 1, n, 1))
  effect = rng.normal(0, 0.028, (comparisons, 2, runs, 1, 1)) + [[[[[0]]], [[[shift]]]]]
  chance = (1 / (1 + np.exp(-(0.6 + difficulty + effect)))).astype(np.float32)
  matched = tokens & (draws < chance)  # [C, 2, R, N, L]
  counts, window = [], matched
  for order in range(1, 5):
    window = window if order == 1 else window[..., :-1] & matched[..., order - 1:]
    counts.append(np.count_nonzero(window, axis=-1))
  shape = counts[0].shape
  length = np.broadcast_to(lengths[..., 0], shape)
  totals = [np.broadcast_to(np.maximum(length - k, 0), shape) for k in range(4)]
  return np.stack([length, length, *counts, *totals], axis=-1).astype(np.int32)


def _concatenated_bootstrap_p(stats, rng, resamples=100):
  """The sentence-level test over concatenated seeds: sacreBLEU's paired bootstrap
  (`significance._paired_bs_test`, restated on statistics) over seed k of the baseline beside
  seed k of the row, concatenated. [2, R, N, S] -> p."""
  pairs = stats.reshape(2, -1, stats.shape[-1])  # [2, R * N, S]
  n = pairs.shape[1]
  drawn = rng.integers(n, size=(resamples, n)) + n * np.arange(resamples)[:, None]
  counts = np.bincount(drawn.ravel(), minlength=resamples * n).reshape(resamples, n)
  resampled = np.einsum("bn,rns->rbs", counts.astype(np.float64), pairs)
  base, var = seed_significance.corpus_scores("sacrebleu", resampled)
  observed = seed_significance.corpus_scores("sacrebleu", pairs.sum(1))
  diffs = np.abs(var - base)
  return (np.sum(diffs - diffs.mean() > abs(observed[1] - observed[0])) + 1) / (resamples + 1)


def _stars(stats, resamples=50):
  """The report's verdict of each comparison (one row against the baseline), its results."""
  results = [seed_significance.seed_test("sacrebleu", s[0], s[1], resamples) for s in stats]
  starred = [r["p_permutation"] <= seed_significance.ALPHA and r["delta"] != 0 for r in results]
  return np.array(starred), results


def test_a_a_comparisons_star_no_more_than_alpha_where_the_concatenated_test_stars_most():
  """Two rows of one distribution, 5 runs each, 240 comparisons; the runs' seeds move BLEU
  more than resampling the test sentences does."""
  rng = np.random.default_rng(3)
  stats = _simulated_runs(rng, 240, 5, 0.0)
  scores = seed_significance.corpus_scores("sacrebleu", stats.sum(3))  # [C, 2, R]
  seed_sd = scores.std(axis=2, ddof=1).mean()
  one_run = stats[0, 0, 0]
  drawn = rng.integers(len(one_run), size=(200, len(one_run)))
  sentence_sd = seed_significance.corpus_scores("sacrebleu", one_run[drawn].sum(1)).std()
  assert seed_sd > 1.2 * sentence_sd, (seed_sd, sentence_sd)

  stars, _ = _stars(stats)
  concatenated = np.mean([_concatenated_bootstrap_p(s, rng) <= seed_significance.ALPHA
                          for s in stats[:80]])
  rate, error = stars.mean(), (0.05 * 0.95 / len(stars)) ** 0.5
  print(f"A/A star rate: {rate:.3f} over {len(stars)} comparisons (seed sd {seed_sd:.2f} BLEU, "
        f"sentence sd {sentence_sd:.2f}); sacreBLEU's paired bootstrap on the concatenated "
        f"seeds gives p <= 0.05 in {concatenated:.3f} of the first 80")
  assert rate <= seed_significance.ALPHA + 2 * error, rate
  assert concatenated > 4 * seed_significance.ALPHA, concatenated


def test_a_b_comparisons_find_two_bleu_over_five_runs():
  rng = np.random.default_rng(4)
  stats = _simulated_runs(rng, 200, 5, 0.068)
  scores = seed_significance.corpus_scores("sacrebleu", stats.sum(3))  # [C, 2, R]
  true_delta = (scores[:, 1] - scores[:, 0]).mean()
  assert true_delta == pytest.approx(2.0, abs=0.15)
  stars, results = _stars(stats)
  covered = np.mean([r["ci_low"] <= true_delta <= r["ci_high"] for r in results])
  print(f"A/B ({true_delta:.2f} BLEU, 5 runs a row): found in {stars.mean():.3f} of "
        f"{len(stars)}; the 95% interval covers it in {covered:.3f}")
  assert stars.mean() >= 0.8
  assert all(r["delta"] > 0 for r, star in zip(results, stars) if star)
  # Below 95%: a percentile bootstrap over 5 runs is narrow (docs/research.md says so).
  assert covered >= 0.75, covered


def _outputs(row, hypotheses, references=REFERENCES):
  return [significance.Output(f"{row}/seed{seed}", seed, list(h), list(references))
          for seed, h in enumerate(hypotheses)]


def test_compare_over_runs_with_holm_and_the_smallest_p():
  baseline = _outputs("base", [FAR, _degrade(FAR), FAR])
  variants = {"close": _outputs("close", [CLOSE, REFERENCES, CLOSE, CLOSE]),
              "same": _outputs("same", [_degrade(FAR), FAR]),
              "moved": _outputs("moved", [CLOSE], CLOSE)}
  results = seed_significance.compare(baseline, variants, resamples=200)
  assert results["moved"] == {"problem": "moved/seed0 and base/seed0 were scored against "
                                         "different references"}
  close = results["close"]
  assert (close["runs"], close["baseline_runs"]) == (4, 3)
  assert close["smallest_p"] == pytest.approx(1 / 35)
  for metric, key in (("sacrebleu", "sacrebleu"), ("chrf", "chrf")):
    per_run = [[scoring.score(o.hypotheses, REFERENCES)[key]["score"] for o in outputs]
               for outputs in (baseline, variants["close"])]
    entry = close[metric]
    assert entry["delta"] == pytest.approx(np.mean(per_run[1]) - np.mean(per_run[0]))
    assert entry["ci_low"] <= entry["delta"] <= entry["ci_high"]
    assert entry["p_greater"] == 1.0 and entry["p_permutation"] == pytest.approx(1 / 35)
    # Holm over the two rows compared: the smaller p doubled.
    assert entry["p_holm"] == pytest.approx(2 / 35) and not entry["significant"]
    assert results["same"][metric]["p_holm"] >= results["same"][metric]["p_permutation"]

  text = seed_significance.markdown("base", results)
  assert "| close | 4 vs 3 |" in text and "| moved | not compared: moved/seed0" in text
  assert "No star is possible in this table: the smallest p these runs allow is 0.0286, " \
         "and Holm over 2 row(s) needs p ≤ 0.025 for the first" in text
  columns = seed_significance.csv_columns("base", close)
  # Every column but COMET's, which no run here has.
  assert set(columns) == {c for c in seed_significance.CSV_COLUMNS
                          if not c.startswith("comet_")} and columns["significant"] == ""

  with pytest.raises(ValueError, match=r"^moved/seed0 and base/seed0 were scored against "
                     r"different references$"):
    seed_significance.compare([*baseline, *variants["moved"]], {})

  # One row of 4 runs against 3: no correction, and 1/35 <= 0.05 stars it.
  alone = seed_significance.compare(baseline, {"close": variants["close"]}, resamples=200)
  assert alone["close"]["sacrebleu"]["significant"]
  assert f"{alone['close']['sacrebleu']['delta']:+.2f}*" in seed_significance.markdown(
      "base", alone)
  assert seed_significance.csv_columns("base", alone["close"])["significant"] == (
      "sacrebleu chrf")


def test_the_bootstrap_interval_widens_with_the_spread_of_seeds():
  rng = np.random.default_rng(5)
  stats = _simulated_runs(rng, 1, 4, 0.0)[0]  # [2, R, N, S]
  same = np.repeat(stats[:, :1], 4, axis=1)  # every run the first seed's
  steady = seed_significance.seed_test("sacrebleu", same[0], same[1], 300)
  noisy = seed_significance.seed_test("sacrebleu", stats[0], stats[1], 300)
  assert (steady["ci_high"] - steady["ci_low"]) < 0.5 * (noisy["ci_high"] - noisy["ci_low"])


def test_the_sentence_level_draws_the_same_sentences_for_both_rows():
  """The two-level bootstrap's sentence level, with one run per row (the run level then
  draws nothing): two identical rows give the interval [0, 0], as one set of sentences drawn
  for both must (drawn apart for each row, it would be wide); two rows that differ give the
  interval of a paired bootstrap written here from sacreBLEU's own sentence statistics and
  scores (without the sentence level it would be a point)."""
  n = len(REFERENCES)
  for metric, sacre in (("sacrebleu", BLEU()), ("chrf", CHRF())):
    stats = seed_significance.sentence_statistics(_outputs("x", [FAR, CLOSE]))[metric]
    same = seed_significance.seed_test(metric, stats[:1], stats[:1], 300)
    assert same["ci_low"] == same["ci_high"] == 0.0
    differ = seed_significance.seed_test(metric, stats[:1], stats[1:], 1000)
    sentences = [[sacre._extract_corpus_statistics([h], [[r]])[0] for h, r in
                  zip(hypotheses, REFERENCES)] for hypotheses in (FAR, CLOSE)]
    rng, deltas = np.random.default_rng(0), []
    for _ in range(1000):
      drawn = rng.integers(n, size=n)
      far, close = ([int(x) for x in np.sum([rows[i] for i in drawn], axis=0)]
                    for rows in sentences)
      deltas.append(sacre._compute_score_from_stats(close).score
                    - sacre._compute_score_from_stats(far).score)
    low, high = np.percentile(deltas, [2.5, 97.5])
    assert high - low > 1.0, (low, high)
    assert abs(differ["ci_low"] - low) < 0.15 * (high - low), (differ, low, high)
    assert abs(differ["ci_high"] - high) < 0.15 * (high - low), (differ, low, high)


def _with_comet(outputs, rng, shift=0.0, model="comet:2.2.7|model:m|src+mt+ref"):
  """`outputs` with a COMET score per sentence (drawn around 0.5 + `shift`), as
  evaluate.py --comet_model leaves them."""
  return [significance.Output(o.run, o.seed, o.hypotheses, o.references,
                              list(rng.normal(0.5 + shift, 0.1, len(o.references))), model)
          for o in outputs]


def test_comet_s_system_score_is_the_mean_and_its_sentence_level_a_paired_bootstrap():
  """COMET's statistics are each sentence's score: its corpus score is their mean, identical
  rows give the interval [0, 0], and two that differ give the interval of a paired bootstrap
  of the mean written here."""
  rng = np.random.default_rng(3)
  runs = _with_comet(_outputs("x", [FAR, CLOSE]), rng)
  stats = seed_significance.sentence_statistics(runs)["comet"]  # [2, N, 2]
  np.testing.assert_allclose(seed_significance.corpus_scores("comet", stats.sum(1)),
                             [np.mean(o.comet) for o in runs], rtol=1e-12)
  same = seed_significance.seed_test("comet", stats[:1], stats[:1], 300)
  assert same["ci_low"] == same["ci_high"] == 0.0
  differ = seed_significance.seed_test("comet", stats[:1], stats[1:], 1000)
  assert differ["delta"] == pytest.approx(np.mean(runs[1].comet) - np.mean(runs[0].comet))
  a, b = (np.array(o.comet) for o in runs)
  draws = np.random.default_rng(0).integers(len(a), size=(1000, len(a)))
  low, high = np.percentile(b[draws].mean(1) - a[draws].mean(1), [2.5, 97.5])
  assert abs(differ["ci_low"] - low) < 0.15 * (high - low), (differ, low, high)
  assert abs(differ["ci_high"] - high) < 0.15 * (high - low), (differ, low, high)


def test_rows_are_compared_on_comet_only_where_every_run_has_the_same_model_s_scores():
  rng = np.random.default_rng(4)
  baseline = _with_comet(_outputs("base", [FAR, _degrade(FAR)]), rng)
  variants = {"better": _with_comet(_outputs("better", [CLOSE, REFERENCES]), rng, 0.2),
              "unscored": _outputs("unscored", [CLOSE, FAR]),
              "other_model": _with_comet(_outputs("other", [CLOSE, FAR]), rng, model="m2")}
  results = seed_significance.compare(baseline, variants, resamples=200)
  better = results["better"]["comet"]
  assert better["delta"] == pytest.approx(
      np.mean([np.mean(o.comet) for o in variants["better"]])
      - np.mean([np.mean(o.comet) for o in baseline]))
  assert better["p_permutation"] == pytest.approx(1 / 3) and not better["significant"]
  assert results["unscored"]["comet"]["problem"] == (
      "unscored/seed0 has no COMET score per sentence (evaluate.py --comet_model)")
  assert "different COMET models" in results["other_model"]["comet"]["problem"]
  for name in variants:  # BLEU and chrF are compared whatever COMET has
    assert "p_holm" in results[name]["sacrebleu"] and "p_holm" in results[name]["chrf"]
  text = seed_significance.markdown("base", results)
  header = next(line for line in text.splitlines() if line.startswith("| variant |"))
  assert "| COMET | ΔCOMET | 95% CI |" in header
  row = next(line for line in text.splitlines() if line.startswith("| better |"))
  assert f"| {better['delta']:+.4f} |" in row
  assert "unscored: not compared on COMET: unscored/seed0 has no COMET score" in text
  columns = seed_significance.csv_columns("base", results["unscored"])
  assert "comet_delta" not in columns and "sacrebleu_delta" in columns
  # Without a COMET score anywhere the table keeps its BLEU and chrF columns alone.
  plain = seed_significance.compare(_outputs("base", [FAR]), {"v": _outputs("v", [CLOSE])},
                                    resamples=50)
  assert "comet" not in plain["v"] and "COMET" not in seed_significance.markdown("base", plain)
