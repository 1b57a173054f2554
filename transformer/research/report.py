"""Reports: what a sweep (or one run) measured, beside the paper's figures, with plots.

  python -m transformer.research.report --workdir=runs/table3     # a sweep root
  python -m transformer.research.report --workdir=runs/table3 --baseline=base
  python -m transformer.research.report --workdir=runs/base       # one run's curves

Writes `report.md`, `report.csv` and three PNG figures (`train_loss.png`,
`dev_perplexity.png`, `dev_bleu.png`, each against step and against wall time) into the
workdir (or `--output_dir`). A run is a folder with a `config.json` (the sweep root itself, or
any folder below it; a run's own sub-folders are not searched); its figures come from
`metrics.jsonl` and from the JSON scores under `eval/` (evaluate.py's, and training's
end-of-run test score). Parameters are counted from the config's shapes (nothing is
allocated). The paper's figures come from the config's `paper` metadata (configs/table3.py).

Runs that differ only in their seed (`.../seed<k>` folders of a sweep with `--seeds`) form
one row: each figure is their mean ± sample standard deviation, with n; the curves draw
their mean with a band of ± one standard deviation. The CSV has one row per run (`kind`
'run') and one per row of the report (`kind` 'variant': the means, `*_std` beside them).
A sweep's grid keys (from ROOT/sweep.json) are columns, read from each run's config.

Dev BLEU is `evaluate.py`'s score of the whole dev split when it has been run
(`python evaluate.py --workdir=RUN --split=validation`), else the last training-time score
(the first `bleu_num_sentences` sentences); test BLEU likewise from `eval/` or the score
logged when training ended; chrF, the brevity penalty and the length ratio come with them.
Of several evaluations of a split (say greedy and beam search), the latest decoded as the
run's config says is reported, from `num_average` checkpoints where one was (evaluate.py's
default), else the latest. The `*_source` columns say which. Evaluations of an ensemble
(`evaluate.py --ensemble`) are not a run's own and are left out. Where training kept a best
checkpoint on dev (`config.select`), `best_step` is its step, `best_dev_sacrebleu` the dev
BLEU training logged there and `best_test_*` its test scores (written when training ends,
`config.bleu_at_end`, or by `evaluate.py --checkpoint=best`): the figures chosen on dev,
beside the fixed step's.

`--baseline=ROW` compares every row with that row on the test split, from the test
translations under eval/ (written by training's end-of-run test score, or by evaluate.py):
over the runs of each row (seed_significance.py: ΔBLEU, ΔchrF and, where every run was scored
by `evaluate.py --comet_model`, ΔCOMET, each with its two-level bootstrap interval, P(>), the
permutation p, Holm's correction over the rows, the star, the smallest p the runs allow),
and, for test-set variance only, sacreBLEU's paired tests on the concatenated seeds both rows
share (significance.py). Where every run has a test score at its checkpoint chosen on dev,
the test over the runs is made again at those checkpoints (report.csv's `best_*` columns).

Each row's figures (and its comparison with the baseline) are appended as records to
`results/report.jsonl` (`records`; `--norecords` for none), named
`report.<ROOT's name>.<row>.<figure>`, with `--device` naming where the runs trained.
"""

from __future__ import annotations

import csv
import os
import pathlib

from absl import flags

from transformer import cli
from transformer.data import textio
from transformer.errors import ConfigError
from transformer import records
from transformer.research import runs as runs_lib
from transformer.research import seed_significance
from transformer.research import significance
from transformer.training import metric_writer

BEST = "best_"  # report.csv's columns of the comparison at the checkpoints chosen on dev


def _cell(row: dict, figure: str, digits: int = 2, paper: str | None = None,
          spread: bool = True) -> str:
  """`mean ± std` (or the value; `spread` False: the mean alone), `(k of n)` where some runs
  lack it, the paper's value after."""
  value, std = row.get(figure), row.get(f"{figure}_std") if spread else None
  if value is None:
    text = "–"
  elif figure == "wall_time_s":
    text = metric_writer.format_duration(value) + (
        f" ± {metric_writer.format_duration(std)}" if std is not None else "")
  else:
    text = f"{value:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")
  count = row.get(f"{figure}_n", row["n"])
  if value is not None and count < row["n"]:
    text += f" ({count} of {row['n']})"
  return text + (f" ({row[paper]})" if paper and row.get(paper) is not None else "")


def markdown(rows: list[dict], figures: list[str], grid_columns: list[str] = (),
             comparison: str = "") -> str:
  """The report as Markdown: one table row per report row, the paper's value in parentheses."""
  chosen = any(r.get("best_step") is not None for r in rows)  # config.select kept a best
  comet = any(r.get("test_comet") is not None for r in rows)  # evaluate.py --comet_model
  header = ["variant", *grid_columns, "n", "change", "params M (paper)", "steps", "wall time",
            "target tokens/s", "dev PPL (paper)", "dev BLEU (paper)", "test BLEU", "test chrF",
            *(["test COMET"] if comet else []), "test BP / length ratio",
            *(["best on dev: step", "its dev BLEU", "its test BLEU / chrF"] if chosen else [])]
  lines = [
      "# Runs beside the paper (Vaswani et al. 2017)", "",
      "Paper: newstest2013, beam 4, no checkpoint averaging, 37k vocabulary; perplexity per "
      "word-piece. Measured BLEU is sacreBLEU / tokenized with compound splitting; BP and "
      "length ratio (hypothesis / reference length) are sacreBLEU's. Over n seeds a figure is "
      "mean ± sample standard deviation; report.csv has every run and says where each score "
      "comes from.", "",
      "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for r in rows:
    params_digits = 1 if (r["params_m"] or 0) >= 10 else 2
    cells = [r["row"], *("–" if r.get(k) is None else str(r[k]) for k in grid_columns),
             str(r["n"]),
             r["change"], _cell(r, "params_m", params_digits, "paper_params_m", spread=False),
             _cell(r, "steps", 0), _cell(r, "wall_time_s"), _cell(r, "target_tokens_per_s", 0),
             _cell(r, "dev_perplexity", 2, "paper_ppl_dev"),
             f"{_cell(r, 'dev_sacrebleu', 1)} / "
             f"{_cell(r, 'dev_tokenized_bleu', 1, 'paper_bleu_dev')}",
             f"{_cell(r, 'test_sacrebleu', 1)} / {_cell(r, 'test_tokenized_bleu', 1)}",
             _cell(r, "test_chrf", 1), *([_cell(r, "test_comet", 4)] if comet else []),
             f"{_cell(r, 'test_brevity_penalty', 3)} / {_cell(r, 'test_length_ratio', 3)}",
             *([_cell(r, "best_step", 0), _cell(r, "best_dev_sacrebleu", 1),
                f"{_cell(r, 'best_test_sacrebleu', 1)} / {_cell(r, 'best_test_chrf', 1)}"]
               if chosen else [])]
    lines.append("| " + " | ".join(cells) + " |")
  lines += ["", *([comparison, ""] if comparison else []),
            *(f"![{pathlib.Path(f).stem}]({f})" for f in figures), ""]
  return "\n".join(lines)


def _outputs(row: runs_lib.Row, best: bool = False) -> list[significance.Output]:
  """The test translations of a row's runs (eval/*.txt) with their references: of their
  latest checkpoints, or with `best` of their best on dev.

  Raises:
    ConfigError: a run without them, naming the command that writes them.
  """
  from transformer.data import input_pipeline

  outputs = []
  for run in row.runs:
    split = run.config.data.test_split
    e = runs_lib.chosen_eval(run, split, best=best)
    hyp_file = pathlib.Path(e["file"]).with_suffix(".txt") if e else None
    if hyp_file is None or not hyp_file.is_file():
      raise ConfigError(f"no test translations in {run.workdir}/eval/: run python evaluate.py "
                        f"--workdir={run.workdir}{' --checkpoint=best' if best else ''} "
                        f"(split {split!r})")
    hypotheses = textio.read_lines(hyp_file)
    references = [r for _, r in input_pipeline.load_split(run.config, str(run.workdir), split)]
    if len(hypotheses) != len(references):
      raise ConfigError(f"{hyp_file} has {len(hypotheses)} lines but {split!r} has "
                        f"{len(references)} sentences; evaluate the run again")
    comet = e.get("comet") or {}  # evaluate.py --comet_model: a score per sentence
    outputs.append(significance.Output(str(run.workdir), run.config.get("seed", 0), hypotheses,
                                       references, comet.get("segments"),
                                       comet.get("signature")))
  return outputs


def compare(rows: list[runs_lib.Row], baseline: str,
            best: bool = False) -> dict[str, dict[str, dict]]:
  """Every row against the row named `baseline`: `{'seeds': seed_significance.compare's,
  'test_set': significance.compare's}`, each row name -> its result; of each run's latest
  checkpoints, or with `best` of its best on dev, over the runs only ('test_set' empty: the
  report gives sacreBLEU's test-set tests for the latest checkpoints alone).

  Raises:
    ConfigError: no row is named `baseline`, or its runs have no test translations or were
      scored against different references.
  """
  names = [r.name for r in rows]
  if baseline not in names:
    raise ConfigError(f"--baseline={baseline}: no such row; the rows are {', '.join(names)}")
  base = _outputs(rows[names.index(baseline)], best)
  variants, problems = {}, {}
  for row in rows:
    if row.name == baseline:
      continue
    try:
      variants[row.name] = _outputs(row, best)
    except ConfigError as e:
      problems[row.name] = {"problem": str(e)}
  try:
    seeds = seed_significance.compare(base, variants)
  except ValueError as e:
    raise ConfigError(f"--baseline={baseline}: {e}") from None
  return {"seeds": {**seeds, **problems},
          "test_set": {} if best else {**significance.compare(base, variants), **problems}}


def write_report(workdir: str | os.PathLike, output_dir: str | os.PathLike | None = None,
                 baseline: str | None = None) -> dict[str, pathlib.Path]:
  """Writes report.md, report.csv and the figures; returns their paths by file name.

  Nothing is written when `workdir` holds no run, or `baseline` names no row or one without
  test translations (`ConfigError`).
  """
  runs = runs_lib.find_runs(workdir)
  columns = runs_lib.grid_keys(workdir)
  rows = runs_lib.rows_of(runs)
  per_run = {id(run): runs_lib.summarize(run, columns) for run in runs}
  table = [runs_lib.aggregate(row.name, [per_run[id(run)] for run in row.runs], columns)
           for row in rows]
  compared = compare(rows, baseline) if baseline else {"seeds": {}, "test_set": {}}
  # The same test over the runs at their checkpoints chosen on dev, where each run has one
  # scored on the test split (training's end, or evaluate.py --checkpoint=best).
  at_best = (compare(rows, baseline, best=True)["seeds"] if baseline and all(
      runs_lib.chosen_eval(run, run.config.data.test_split, best=True) for run in runs)
      else {})
  for t in table:
    if t["row"] in compared["seeds"]:
      t.update(seed_significance.csv_columns(baseline, compared["seeds"][t["row"]]),
               **significance.csv_columns(compared["test_set"][t["row"]]))
    if t["row"] in at_best:
      t.update({f"{BEST}{k}": v for k, v in
                seed_significance.csv_columns(baseline, at_best[t["row"]]).items()})
  out = pathlib.Path(output_dir or workdir)
  out.mkdir(parents=True, exist_ok=True)
  # Imported here: matplotlib costs a process about half a second, and the runs' readers
  # (load_run, the benchmarks' time-to-BLEU suite) draw nothing.
  from transformer.research import plots

  written = plots.training_curves(rows, out)
  fields = [*runs_lib.COLUMNS[:4], *columns, *runs_lib.COLUMNS[4:],
            *(f"{f}_std" for f in runs_lib.FIGURES),
            *(seed_significance.CSV_COLUMNS + significance.CSV_COLUMNS if baseline else ()),
            *(BEST + c for c in seed_significance.CSV_COLUMNS if at_best)]
  with open(out / "report.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for row, summary in zip(rows, table):
      for run in row.runs:
        writer.writerow({k: "" if v is None else v for k, v in per_run[id(run)].items()})
      writer.writerow({k: "" if v is None else v for k, v in summary.items()})
  comparison = (seed_significance.markdown(baseline, compared["seeds"]) + "\n\n"
                + significance.markdown(baseline, compared["test_set"]) if baseline else "")
  if at_best:
    comparison += "\n\n" + seed_significance.markdown(
        baseline, at_best, at=" at the checkpoints chosen on dev")
  (out / "report.md").write_text(markdown(table, [p.name for p in written.values()], columns,
                                          comparison))
  return {"report.md": out / "report.md", "report.csv": out / "report.csv", **written}


def _define_flags() -> None:
  """Flags, defined only when run as a program: the tools share names (--workdir, --config)
  and must import together into one process (tests, notebooks)."""
  flags.DEFINE_string("workdir", None, "A sweep root (runs in the folders below it) or one "
                      "run's workdir.")
  flags.DEFINE_string("output_dir", None, "Where the report goes (default: the workdir).")
  flags.DEFINE_string("baseline", None, "A row of the report (e.g. base, or "
                      "base/warmup_steps=8000): compare every other row with it on the test "
                      "split, over each row's runs (interval, P(>), permutation p, Holm's "
                      "correction), and by sacreBLEU's paired tests (test-set variance only).")
  flags.DEFINE_bool("records", True, "Append a record of each row's figures to the results "
                    "folder (results/, or $TRANSFORMER_RESULTS_DIR).")
  flags.DEFINE_string("device", None, "Where the runs trained, for the records (e.g. "
                      "'gpu:NVIDIA H200 x1'); default: this process's device.")
  flags.mark_flag_as_required("workdir")


_UNITS = {"params_m": "M", "steps": "steps", "wall_time_s": "s", "target_tokens_per_s": "/s",
          "dev_perplexity": "perplexity", "dev_sacrebleu": "BLEU", "dev_tokenized_bleu": "BLEU",
          "dev_chrf": "chrF", "test_sacrebleu": "BLEU", "test_tokenized_bleu": "BLEU",
          "test_chrf": "chrF", "best_step": "steps", "best_dev_sacrebleu": "BLEU",
          "best_test_sacrebleu": "BLEU",
          "best_test_chrf": "chrF", "dev_comet": "COMET", "test_comet": "COMET",
          "best_test_comet": "COMET"}


def report_records(csv_path: pathlib.Path, root: str, device: str) -> list[records.Record]:
  """A record of every figure of every row of report.csv (`kind` variant): its mean, with the
  standard deviation and n beside it, and each comparison with the baseline."""
  with open(csv_path, newline="") as f:
    rows = [r for r in csv.DictReader(f) if r["kind"] == "variant"]
  name, out = pathlib.Path(root).resolve().name, []
  for r in rows:
    seeds = [int(s) for s in r["seed"].split() if s.lstrip("-").isdigit()]
    prefix = f"report.{name}.{r['row']}"

    def add(figure, value, unit, **extra):
      out.append(records.make(f"{prefix}.{figure}", float(value), unit, device=device,
                              seeds=seeds, config=r["variant"], runs=int(r["n"]), **extra))

    for figure in runs_lib.FIGURES:
      if r.get(figure):
        std = r.get(f"{figure}_std")
        add(figure, r[figure], _UNITS.get(figure, ""), **({"sd": float(std)} if std else {}))
    for m in (f"{at}{m}" for at in ("", BEST) for m in seed_significance.METRICS):
      if r.get(f"{m}_delta"):
        add(f"{m}_delta", r[f"{m}_delta"], seed_significance.LABELS[m.removeprefix(BEST)],
            baseline=r["baseline"], p_permutation=float(r[f"{m}_p_permutation"]),
            p_holm=float(r[f"{m}_p_holm"]), p_greater=float(r[f"{m}_p_greater"]),
            ci95=[float(r[f"{m}_ci95_low"]), float(r[f"{m}_ci95_high"])])
      if r.get(f"{m}_test_set_delta"):
        add(f"{m}_test_set_delta", r[f"{m}_test_set_delta"], "BLEU" if m == "sacrebleu"
            else "chrF", p_bootstrap=float(r[f"{m}_test_set_p_bootstrap"]),
            p_ar=float(r[f"{m}_test_set_p_ar"]),  # the docs' † : p <= 0.05 in both tests
            both_p_le_0_05=max(float(r[f"{m}_test_set_p_bootstrap"]),
                               float(r[f"{m}_test_set_p_ar"])) <= 0.05)
  return out


def main(argv):
  del argv
  written = write_report(flags.FLAGS.workdir, flags.FLAGS.output_dir, flags.FLAGS.baseline)
  print(written["report.md"].read_text())
  print("wrote " + ", ".join(str(p) for p in written.values()))
  if flags.FLAGS.records:
    made = report_records(written["report.csv"], flags.FLAGS.workdir,
                          flags.FLAGS.device or records.device_name())
    print(f"appended {len(made)} records to {records.append('report', made)}")


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
