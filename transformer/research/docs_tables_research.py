"""The tables of docs/research.md (`docs_tables` gathers every page's): the standing
time-to-BLEU record, a sweep's compile-once saving, and the modifications after the paper
measured against base."""

from __future__ import annotations

from transformer.research.doc_blocks import Table, extra, fig, text

MODERN_ROWS = ("base", "rmsnorm", "pre_ln", "gelu", "swish", "reglu", "geglu", "swiglu", "rope",
               "t5", "shaw", "alibi", "mqa", "gqa", "qk_norm", "two_way_tying", "untied",
               "no_bias", "z_loss", "adamw", "adafactor", "cosine", "wsd", "combined")
# The standing time-to-BLEU record, raced choosing on dev (README and docs/research.md).
RECORD_RACE = "record.tatoeba_fast.cpu.tatoeba_fast.steps550.devchosen"


def _record_on_dev() -> Table:
  """The standing record raced choosing each run's checkpoint on dev (`--suite=record`'s
  default): per seed, its time, the step dev BLEU chose and that step's test sacreBLEU beside
  the last step's; then the median and the mean."""
  p = RECORD_RACE
  rows = [(str(seed), fig(f"{p}.seed{seed}.total_s", 1), fig(f"{p}.seed{seed}.compile_s", 1),
           fig(f"{p}.seed{seed}.chosen_step", 0, unit=False),
           fig(f"{p}.seed{seed}.test_sacrebleu"), fig(f"{p}.seed{seed}.last_test_sacrebleu"))
          for seed in (0, 1, 2)]
  rows.append(("all", text("median {t}", t=fig(f"{p}.median_total_s", 1)), "", "",
               text("{b}, lowest {low}", b=fig(f"{p}.bleu_mean", sd=True),
                    low=extra(f"{p}.bleu_mean", "lowest")), ""))
  return Table(("seed", "total", "compilation", "step chosen on dev", "its test sacreBLEU",
                "last step's"), rows)


def _fast_on_dev() -> Table:
  """configs/tatoeba_fast.py against each of two of its departures undone, seed 0: the step
  dev BLEU chose, that dev BLEU, and the test sacreBLEU of that checkpoint."""
  rows = []
  for label, p in (("the recipe (untied, packed)", "tatoeba_fast_embeddings.tie_embeddings=none"),
                   ("embeddings tied (three-way)",
                    "tatoeba_fast_embeddings.tie_embeddings=three-way"),
                   ("pairs not packed", "tatoeba_fast_packing.packing=false")):
    p = f"report.{p}"
    rows.append((label, fig(f"{p}.best_step", 0, unit=False),
                 fig(f"{p}.best_dev_sacrebleu", unit=False),
                 fig(f"{p}.best_test_sacrebleu", unit=False)))
  return Table(("config", "step chosen on dev", "its dev sacreBLEU", "its test sacreBLEU"),
               rows)


def _sweep_compile_once() -> Table:
  p = "sweep.tatoeba_small.cpu"
  return Table(("", "wall", "CPU"), [
      ("`--compile_once`", fig(f"{p}.compile_once.wall_s", 1), fig(f"{p}.compile_once.cpu_s", 1)),
      ("`--nocompile_once`", fig(f"{p}.nocompile_once.wall_s", 1),
       fig(f"{p}.nocompile_once.cpu_s", 1)),
      ("ratio", fig(f"{p}.ratio_wall_s"), fig(f"{p}.ratio_cpu_s"))])


def _modern_400() -> Table:
  rows = []
  for row in MODERN_ROWS:
    p = f"report.modern_tatoeba.{row}"
    deltas = (("–", "–") if row == "base" else tuple(
        fig(f"{p}.{m}_test_set_delta", signed=True, flag="both_p_le_0_05")
        for m in ("sacrebleu", "chrf")))
    rows.append((row, fig(f"{p}.params_m", unit=False),
                 fig(f"{p}.dev_perplexity", sd=True),
                 fig(f"{p}.test_sacrebleu", 1, sd=True),
                 fig(f"{p}.test_chrf", 1, sd=True),
                 fig(f"{p}.test_length_ratio", 3, sd=True)) + deltas)
  return Table(("row", "params M", "dev perplexity", "test BLEU", "test chrF", "length ratio",
                "ΔBLEU (test set)", "ΔchrF (test set)"), rows)


def _cosine_wsd() -> Table:
  rows = []
  for row in ("cosine", "wsd"):
    p = f"report.cw.{row}/{row}"  # the report names a row by its folder
    rows.append((row, text("{d} {ci}", d=fig(f"{p}.sacrebleu_delta", signed=True),
                           ci=extra(f"{p}.sacrebleu_delta", "ci95")),
                 extra(f"{p}.sacrebleu_delta", "p_greater"),
                 extra(f"{p}.sacrebleu_delta", "p_permutation", significant=2),
                 text("{d} {ci}", d=fig(f"{p}.chrf_delta", signed=True),
                      ci=extra(f"{p}.chrf_delta", "ci95")),
                 extra(f"{p}.chrf_delta", "p_permutation", significant=2)))
  return Table(("row", "ΔBLEU [95%]", "P(>)", "p", "ΔchrF [95%]", "p"), rows)


def _modern_1500() -> Table:
  """The rows at the checkpoint each run chose on dev BLEU (`best_*`), with the test over the
  runs made there (the report's `best_<metric>_delta`)."""
  def delta(p, metric):
    d = f"{p}.best_{metric}_delta"
    cells = [text("{d} {ci}", d=fig(d, signed=True), ci=extra(d, "ci95"))]
    if metric == "sacrebleu":
      cells.append(extra(d, "p_greater"))
    return cells + [text("{p} / {h}", p=extra(d, "p_permutation", significant=2),
                         h=extra(d, "p_holm", significant=2))]

  rows = []
  for row in ("base", "pre_ln", "untied", "combined"):
    p = f"report.modern_1500.{row}"
    bleu = [""] * 3 if row == "base" else delta(p, "sacrebleu")
    chrf = [""] * 2 if row == "base" else delta(p, "chrf")
    rows.append([row, fig(f"{p}.best_step", 0, unit=False, sd=True),
                 fig(f"{p}.best_test_sacrebleu", sd=True), *bleu,
                 fig(f"{p}.best_test_chrf", sd=True), *chrf,
                 fig(f"{p}.dev_perplexity", sd=True)])
  return Table(("row", "step chosen on dev", "test BLEU", "ΔBLEU [95%]", "P(>)", "p / Holm",
                "test chrF", "ΔchrF [95%]", "p / Holm", "dev perplexity at 1,500"), rows)


RESEARCH_TABLES = {
    "record_on_dev": _record_on_dev(), "fast_on_dev": _fast_on_dev(),
    "sweep_compile_once": _sweep_compile_once(), "modern_400": _modern_400(),
    "cosine_wsd": _cosine_wsd(), "modern_1500": _modern_1500(),
}
