"""Every table of measured figures in README.md and docs/, defined once, drawn from results/.

  python -m transformer.research.docs_tables            # rewrite every generated block
  python -m transformer.research.docs_tables --check    # exit 1 naming every stale block

A page marks a generated table with `<!-- table: NAME -->` ... `<!-- end table -->`
(`doc_blocks`); NAME is a key of `TABLES`. A cell names a record (`results/*.jsonl`, the
newest of that name counts), so a figure measured again reaches every page by one run of this
command, and `tests/test_docs_figures.py` fails while a page is behind its records. To add a
table: measure (a benchmark or research command appends the records), define the table here,
put its markers in the page, run this command.
"""

from __future__ import annotations

import argparse
import sys

from transformer.research import doc_blocks
from transformer import records
from transformer.research.doc_blocks import Table, device, fig, text
from transformer.research.docs_tables_export import EXPORT_TABLES
from transformer.research.docs_tables_models import MODEL_TABLES
from transformer.research.docs_tables_research import (MODERN_ROWS, RECORD_RACE,
                                                       RESEARCH_TABLES)

_TTB_CPU = "time_to_bleu.tatoeba_small.cpu.steps1500"
_DEV_BLEU_CPU = "time_to_bleu.tatoeba_small.cpu.steps{steps}.devbleu.run1"
_SMALL_DEV = _DEV_BLEU_CPU.format(steps=1500)
_TTB_H100 = "time_to_bleu.tatoeba_small.gpu-h100-80gb-hbm3.steps1500"
_TTB_H200 = "time_to_bleu.tatoeba_small.gpu-h200.steps1500"
_TTB_H200_NO_TUNING = "time_to_bleu.tatoeba_small.gpu-h200.xla_gpu_autotune_level-0.steps1500"
_DEMO = "report.demo-run.demo-run"
_DEMO_GPU = "train.demo.gpu-h100-80gb-hbm3"
_SMALL_GPU = "report.tatoeba_small_h200.tatoeba_small_h200"
_STEP_CPU = ("train_step.base.cpu.measurements.config-float32-reference-threefry2x32-chunk0-"
             "b64-s64-t64")
_DEC_CPU = "decoding.base.cpu"
_DEC_GPU = "decoding.base.gpu-h100-80gb-hbm3"
_PATIENCE = "report.tatoeba_small_patience.tatoeba_small_patience"


def _results() -> Table:
  """The README's table: one row per config and device."""
  small = "Tatoeba EN→DE, 15.6k pairs, 5.7M parameters"
  return Table(
      ("config", "data, model", "device", "steps", "dev perplexity", "test sacreBLEU",
       "test chrF", "test BLEU, tokenized (paper's protocol)", "wall time"),
      [("`demo.py`", "synthetic pair, 1.05M parameters", device(f"{_DEMO}.test_sacrebleu"),
        fig(f"{_DEMO}.steps", 0, unit=False), fig(f"{_DEMO}.dev_perplexity"),
        fig(f"{_DEMO}.test_sacrebleu"), fig(f"{_DEMO}.test_chrf"),
        fig(f"{_DEMO}.test_tokenized_bleu"),
        text("{w} from its first step to its test score", w=fig(f"{_DEMO}.wall_time_s", 0))),
       ("`demo.py`", "same", device(f"{_DEMO_GPU}.test_sacrebleu"), "800", "–",
        fig(f"{_DEMO_GPU}.test_sacrebleu"), "–", "–",
        text("{w}, start to printed samples", w=fig(f"{_DEMO_GPU}.wall_s", 0))),
       ("`tatoeba_small.py`", small, device(f"{_SMALL_DEV}.best_test_sacrebleu"),
        text("{s} of 1,500, chosen on dev BLEU", s=fig(f"{_SMALL_DEV}.best_step", 0, unit=False)),
        "–", fig(f"{_SMALL_DEV}.best_test_sacrebleu"), "–", "–",
        text("{t} from a fresh start, of it {c} compiling and {d} dev BLEU",
             t=fig(f"{_SMALL_DEV}.total_s", 0), c=fig(f"{_SMALL_DEV}.compile_s", 0),
             d=fig(f"{_SMALL_DEV}.dev_bleu_s", 0))),
       ("`tatoeba_small.py`", "same", device(f"{_SMALL_GPU}.best_test_sacrebleu"),
        text("{s} of 1,500, chosen on dev BLEU", s=fig(f"{_SMALL_GPU}.best_step", 0, unit=False)),
        fig(f"{_SMALL_GPU}.dev_perplexity"), fig(f"{_SMALL_GPU}.best_test_sacrebleu"),
        fig(f"{_SMALL_GPU}.best_test_chrf"), "–",
        text("{w} from its first step to its test score, dev BLEU included",
             w=fig(f"{_SMALL_GPU}.wall_time_s", 0))),
       ("`tatoeba_fast.py`", "same, pre-LN, untied, packed: 9.8M parameters",
        device(f"{RECORD_RACE}.bleu_mean"),
        text("{a}, {b}, {c} of 550, chosen on dev BLEU",
             **{k: fig(f"{RECORD_RACE}.seed{i}.chosen_step", 0, unit=False)
                for i, k in enumerate("abc")}), "–",
        text("{b} (3 seeds)", b=fig(f"{RECORD_RACE}.bleu_mean", sd=True)), "–", "–",
        text("{m} median from a fresh start, dev BLEU included",
             m=fig(f"{RECORD_RACE}.median_total_s", 1)))])


def _cpu_speed() -> Table:
  return Table(("what", "figure"), [
      ("base train step, 64×64 tokens, float32 (`--suite=train_step`)",
       text("{s} a step, {t} target tokens/s", s=fig(f"{_STEP_CPU}.step_seconds", 2),
            t=fig(f"{_STEP_CPU}.target_tokens_per_sec", 0, unit=False))),
      ("beam 4 vs greedy, base, batch 32, 32 → 32 tokens (`--suite=decoding`)",
       text("{b} vs {g} sentences/s: beam/greedy {r}",
            b=fig(f"{_DEC_CPU}.greedy_vs_beam.beam.sentences_per_sec", unit=False),
            g=fig(f"{_DEC_CPU}.greedy_vs_beam.greedy.sentences_per_sec", unit=False),
            r=fig(f"{_DEC_CPU}.greedy_vs_beam.beam_over_greedy", unit=False))),
      ("the decoder's matrix products alone, 32 rows vs 128 (greedy's vs beam 4's), same run",
       text("{a} vs {b} a step",
            a=fig(f"{_DEC_CPU}.greedy_vs_beam.products_only_ms_per_step.greedy_rows", 1),
            b=fig(f"{_DEC_CPU}.greedy_vs_beam.products_only_ms_per_step.beam_rows", 1))),
      ("beam 4 at batch 1 / 32 / 128, same run", text(
          "{a} / {b} / {c} sentences/s", **{
              k: fig(f"{_DEC_CPU}.beam_by_batch.cpu_workarounds-b{b}-beam4-s32-out32."
                     "sentences_per_sec", unit=False)
              for k, b in (("a", 1), ("b", 32), ("c", 128))})),
      ("beam 4, batch 32, `config.cpu_workarounds` on vs off",
       text("{on} vs {off} sentences/s", on=fig(
           f"{_DEC_CPU}.cpu_workarounds_on_vs_off.cpu_workarounds-b32-beam4-s32-out32."
           "sentences_per_sec", unit=False), off=fig(
           f"{_DEC_CPU}.cpu_workarounds_on_vs_off.no_cpu_workarounds-b32-beam4-s32-out32."
           "sentences_per_sec", unit=False)))])


def _modern_step_time() -> Table:
  """The modern rows' step time at tatoeba_small's shape, two rows of the list a line."""
  def cells(row):
    name = (f"train_step.tatoeba_small.cpu.measurements.{row}-float32-reference-threefry2x32-"
            "chunk0-b48-s64-t64")
    return (row, fig(f"{name}.step_seconds", 1, unit=False, scale=1e3),
            fig(f"{name}.step_ratio_to_base", unit=False))
  half = (len(MODERN_ROWS) + 1) // 2
  return Table(("row", "step ms", "× base") * 2,
               [cells(a) + cells(b) for a, b in zip(MODERN_ROWS[:half], MODERN_ROWS[half:])])


def _ttb_row(label, prefix, run, data=True):
  p = f"{prefix}.run{run}"
  cells = [label, fig(f"{p}.total_s", 1)]
  if data:
    cells.append(fig(f"{p}.data_s", 1))
  cells += [text("{c} ({t} + {e})", c=fig(f"{p}.compile_s", 1),
                 t=fig(f"{p}.compile_train_s", 1, unit=False),
                 e=fig(f"{p}.compile_eval_s", 1, unit=False)),
            fig(f"{p}.training_s", 1), fig(f"{p}.compile_share", 1),
            fig(f"{p}.dev_perplexity"), fig(f"{p}.test_sacrebleu")]
  return cells


def _cpu_time_to_bleu() -> Table:
  return Table(("run", "total", "data", "compilation (train + eval)", "training",
                "compilation share", "dev perplexity", "test sacreBLEU"),
               [_ttb_row("1, empty compilation cache", _TTB_CPU, 1),
                _ttb_row("2, programs read from the cache", _TTB_CPU, 2)])


def _dev_bleu_cost() -> Table:
  rows = []
  for steps in (400, 1500):
    p = _DEV_BLEU_CPU.format(steps=steps)
    rows.append((f"{steps:,}", fig(f"{p}.total_s", 1),
                 text("{s} ({n})", s=fig(f"{p}.dev_bleu_s", 1),
                      n=fig(f"{p}.dev_bleu_evaluations", 0, unit=False)),
                 fig(f"{p}.dev_bleu_share", 1), fig(f"{p}.best_step", 0, unit=False),
                 fig(f"{p}.best_test_sacrebleu", unit=False),
                 fig(f"{p}.test_sacrebleu", unit=False), device(f"{p}.total_s")))
  return Table(("steps", "total", "dev BLEU (evaluations)", "share of the run",
                "step chosen on dev", "its test sacreBLEU", "last step's test sacreBLEU",
                "device"), rows)


def _patience_stop() -> Table:
  """tatoeba_small chosen on dev loss with patience: where it stopped, the step dev chose and
  that checkpoint's test sacreBLEU (the test split scored once, at the chosen step)."""
  p = _PATIENCE
  return Table(("trained to (stopped on its own)", "step chosen on dev", "its test sacreBLEU",
                "its test chrF", "device"),
               [(fig(f"{p}.steps", 0, unit=False), fig(f"{p}.best_step", 0, unit=False),
                 fig(f"{p}.best_test_sacrebleu", unit=False),
                 fig(f"{p}.best_test_chrf", unit=False), device(f"{p}.steps"))])


def _gpu_time_to_bleu() -> Table:
  rows = [("NVIDIA H100 80GB HBM3, 1, empty cache", _TTB_H100, 1),
          ("NVIDIA H100 80GB HBM3, 2, programs read from the cache", _TTB_H100, 2),
          ("NVIDIA H200, XLA's autotuning on (the default), empty cache", _TTB_H200, 1),
          ("NVIDIA H200, autotuning off (`XLA_FLAGS=--xla_gpu_autotune_level=0`), empty cache",
           _TTB_H200_NO_TUNING, 1)]
  return Table(("device, run", "total", "compilation (train + eval)", "training",
                "compilation share", "dev perplexity", "test sacreBLEU"),
               [_ttb_row(label, prefix, run, data=False) for label, prefix, run in rows])


def _gpu_train_step() -> Table:
  rows = []
  for model, dtype, attention, chunk in (
      ("base", "bfloat16", "reference", 0), ("base", "float32", "reference", 0),
      ("big", "bfloat16", "reference", 0), ("big", "float32", "reference", 0),
      ("base", "bfloat16", "cudnn", 0), ("base", "bfloat16", "cudnn", 8192),
      ("big", "bfloat16", "cudnn", 0), ("big", "bfloat16", "cudnn", 8192)):
    p = (f"train_step.base.gpu-h100-80gb-hbm3.measurements.{model}-{dtype}-{attention}-"
         f"threefry2x32-chunk{chunk}-b390-s64-t64")
    rows.append((model, dtype, attention, "dense" if not chunk else f"chunks of {chunk:,}",
                 fig(f"{p}.step_seconds", 1, unit=False, scale=1e3),
                 fig(f"{p}.target_tokens_per_sec", 0, unit=False),
                 fig(f"{p}.mfu", 1), fig(f"{p}.compiled_memory_gib", 1)))
  return Table(("model", "dtype", "attention", "output layer + loss", "step ms",
                "target tokens/s", "MFU", "XLA's memory estimate"), rows)


def _gpu_decoding() -> Table:
  beam = f"{_DEC_GPU}.beam_by_batch.no_cpu_workarounds-b{{}}-beam4-s32-out32"
  vs = f"{_DEC_GPU}.greedy_vs_beam"
  by_batch = {k: fig(beam.format(b) + ".sentences_per_sec", 1, unit=False)
              for k, b in (("a", 1), ("b", 32), ("c", 128))}
  by_batch.update({k: fig(beam.format(b) + ".ms_per_step")
                   for k, b in (("x", 1), ("y", 32), ("z", 128))})
  return Table(("what", "figure"), [
      ("beam 4 at batch 1 / 32 / 128",
       text("{a} / {b} / {c} sentences/s ({x} / {y} / {z} a step)", **by_batch)),
      ("against Flax's `examples/wmt` beam search (batch 32, beam 4, taking turns)", text(
          "project {p}, Flax {f} sentences/s: **{r}** (target 2×: not met)",
          p=fig(f"{_DEC_GPU}.flax_examples_wmt.project_sentences_per_sec", 1, unit=False),
          f=fig(f"{_DEC_GPU}.flax_examples_wmt.flax_sentences_per_sec", 1, unit=False),
          r=fig(f"{_DEC_GPU}.flax_examples_wmt.project_over_flax"))),
      ("greedy vs beam 4, batch 32", text(
          "{g} vs {b} sentences/s",
          g=fig(f"{vs}.greedy.sentences_per_sec", 1, unit=False),
          b=fig(f"{vs}.beam.sentences_per_sec", 1, unit=False))),
      ("the decoder's matrix products alone, 32 rows / 128", text(
          "{a} / {b} a step", a=fig(f"{vs}.products_only_ms_per_step.greedy_rows"),
          b=fig(f"{vs}.products_only_ms_per_step.beam_rows")))])


TABLES: dict[str, Table] = {
    "results": _results(), "cpu_speed": _cpu_speed(), "modern_step_time": _modern_step_time(),
    "cpu_time_to_bleu": _cpu_time_to_bleu(), "gpu_time_to_bleu": _gpu_time_to_bleu(),
    "dev_bleu_cost": _dev_bleu_cost(), "patience_stop": _patience_stop(),
    "gpu_train_step": _gpu_train_step(), "gpu_decoding": _gpu_decoding(), **RESEARCH_TABLES,
    **EXPORT_TABLES, **MODEL_TABLES,
}


def update(check: bool = False, folder=None) -> list[str]:
  """Renders every generated block of README.md and docs/*.md from the records of `folder`
  (the results folder by default); rewrites the pages unless `check`. Returns
  `page: table` for every block that was (or, with `check`, is) stale."""
  held = records.load(folder)
  stale = []
  for page in doc_blocks.pages():
    old = page.read_text(encoding="utf-8")
    rel = page.relative_to(records.REPO)
    new, changed = doc_blocks.regenerate(old, TABLES, held, str(rel))
    stale += [f"{rel}: {name}" for name in changed]
    if changed and not check:
      page.write_text(new, encoding="utf-8")
  return stale


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 naming "
                      "every block that differs from what the records give")
  args = parser.parse_args(argv)
  try:
    stale = update(check=args.check)
  except (KeyError, ValueError) as e:  # a missing record, a page's broken markers
    print(f"error: {e.args[0]}", file=sys.stderr)
    return 2
  for line in stale:
    print(("stale " if args.check else "rewrote ") + line)
  if args.check and stale:
    print("run `python -m transformer.research.docs_tables` to regenerate them")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
