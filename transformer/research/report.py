"""Reports: what a sweep (or one run) measured, beside the paper's figures, with plots.

  python -m transformer.research.report --workdir=runs/table3     # a sweep root: one row per run
  python -m transformer.research.report --workdir=runs/base       # one run's curves

Writes `report.md`, `report.csv` and three PNG figures (`train_loss.png`,
`dev_perplexity.png`, `dev_bleu.png`, each against step and against wall time, one line per
run) into the workdir (or `--output_dir`). A run is a folder with a `config.json`; its figures
come from `metrics.jsonl` and from the JSON scores `evaluate.py` wrote under `eval/`.
Parameters are counted from the config's shapes (nothing is allocated). The paper's figures
come from the config's `paper` metadata (configs/table3.py).

Dev BLEU is `evaluate.py`'s score of the whole dev split when it has been run
(`python evaluate.py --workdir=RUN --split=validation`), else the last training-time score
(the first `bleu_num_sentences` sentences); test BLEU likewise from `eval/` or the score
logged when training ended. Of several evaluations of a split (say greedy and beam search),
the latest decoded as the run's config says (beam size and length penalty: the paper's, for
its configs) is reported, else the latest. The `*_source` columns of the CSV say which.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import pathlib
import statistics

from absl import flags

from transformer import cli
from transformer.evaluation import evaluate_lib
from transformer.research import params
from transformer.research import plots
from transformer.training import metric_writer
from transformer.run import workdir as workdir_lib
from transformer.errors import ConfigError

COLUMNS = ("variant", "change", "params_m", "paper_params_m", "steps", "wall_time_s",
           "target_tokens_per_s", "dev_perplexity", "paper_ppl_dev", "dev_sacrebleu",
           "dev_tokenized_bleu", "paper_bleu_dev", "dev_bleu_source", "test_sacrebleu",
           "test_tokenized_bleu", "test_bleu_source")


@dataclasses.dataclass
class Run:
  """One training workdir as the report reads it."""

  name: str  # config.variant, else the folder's name
  workdir: pathlib.Path
  config: object  # its ConfigDict
  metrics: list[dict]  # the lines of metrics.jsonl
  evals: list[dict]  # evaluate.py's eval/*.json, oldest first

  def series(self, key: str) -> list[tuple[int, float | None, float]]:
    """`(step, seconds or None, value)` of every metrics line that has `key`."""
    return [(m["step"], m.get("time"), m[key]) for m in self.metrics if key in m]

  def last(self, key: str) -> float | None:
    values = self.series(key)
    return values[-1][2] if values else None


def _read_jsonl(path: pathlib.Path) -> list[dict]:
  if not path.is_file():
    return []
  lines = []
  for line in path.read_text().splitlines():
    try:
      lines.append(json.loads(line))
    except ValueError:
      continue  # a line cut short by a run still writing it
  return lines


def _read_evals(workdir: pathlib.Path) -> list[dict]:
  found = []
  for path in sorted((workdir / "eval").glob("*.json"), key=lambda p: p.stat().st_mtime):
    try:
      result = json.loads(path.read_text())
    except ValueError:
      continue
    if isinstance(result, dict) and {"split", "steps", "sacrebleu"} <= result.keys():
      found.append(result)
  return found


def load_run(workdir: pathlib.Path) -> Run:
  config = workdir_lib.load_config(workdir)
  return Run(name=config.get("variant") or workdir.name, workdir=workdir, config=config,
             metrics=_read_jsonl(workdir / "metrics.jsonl"), evals=_read_evals(workdir))


def find_runs(root: str | os.PathLike) -> list[Run]:
  """The run in `root`, or the runs in its sub-folders (in the paper's row order where the
  configs say it, then by name).

  Raises:
    ConfigError: `root` is not a folder, or holds no run; a run's config.json is unreadable.
  """
  root = pathlib.Path(root)
  if not root.is_dir():
    raise ConfigError(f"--workdir={root} is not a folder")
  if workdir_lib.config_path(root).is_file():
    return [load_run(root)]
  runs = [load_run(d) for d in sorted(root.iterdir()) if workdir_lib.config_path(d).is_file()]
  if not runs:
    raise ConfigError(f"no runs in {root}: neither it nor a folder in it has a config.json "
                      "(written when training starts); pass a run's workdir or a sweep root")

  def order(run):
    paper = run.config.get("paper") or {}
    return (paper.get("row") or float("inf"), run.name)

  return sorted(runs, key=order)


def _chosen_eval(run: Run, split: str) -> dict | None:
  """evaluate.py's score of `split` to report: the latest decoded with the config's beam size
  and length penalty, else the latest; None when the split was not evaluated."""
  scored = [e for e in run.evals if e["split"] == split]
  wanted = evaluate_lib.decoding_tag(run.config.decode)
  configured = [e for e in scored if _decoding(e) == wanted]
  return (configured or scored or [None])[-1]


def _decoding(result: dict) -> str | None:
  """An evaluation's `decoding_tag` (`beam4_alpha0.6`, `greedy`); None when its JSON does not
  say (written by an earlier version)."""
  try:
    return evaluate_lib.decoding_tag(result["decode"])
  except (KeyError, TypeError, ValueError):
    return None


def _bleu(run: Run, split: str, prefix: str) -> tuple[float | None, float | None, str]:
  """`(sacreBLEU, tokenized BLEU, where from)` of `split`: evaluate.py's (`_chosen_eval`),
  else the training log's last."""
  e = _chosen_eval(run, split)
  if e is not None:
    averaged = f", {len(e['steps'])} checkpoints averaged" if len(e["steps"]) > 1 else ""
    decoded = f", decoded {_decoding(e)}" if _decoding(e) else ""
    return (e["sacrebleu"]["score"], e["tokenized_bleu"]["score"],
            f"evaluate.py: {e['num_sentences']} sentences, step {e['steps'][-1]}{averaged}"
            f"{decoded}")
  sacre = run.last(f"{prefix}/sacrebleu")
  if sacre is None:
    return None, None, ""
  where = (f"training log: first {run.config.bleu_num_sentences} sentences"
           if prefix == "dev" else "training log: the whole split")
  return sacre, run.last(f"{prefix}/tokenized_bleu"), where


def summarize(run: Run) -> dict:
  """One report row: `COLUMNS` -> value (None where the run has no such figure)."""
  paper = run.config.get("paper") or {}
  times = [m["time"] for m in run.metrics if "time" in m]
  speeds = [v for _, _, v in run.series("train/target_tokens_per_sec")]
  dev = _bleu(run, run.config.data.eval_split, "dev")
  test = _bleu(run, run.config.data.test_split, "test")
  return dict(
      variant=run.name, change=paper.get("change", ""),
      params_m=params.report(run.config)[-1][1] / 1e6, paper_params_m=paper.get("params_m"),
      steps=max((m["step"] for m in run.metrics), default=0),
      wall_time_s=max(times) if times else None,
      # The median interval: the first one includes compiling the step.
      target_tokens_per_s=statistics.median(speeds) if speeds else None,
      dev_perplexity=run.last("dev/perplexity"), paper_ppl_dev=paper.get("ppl_dev"),
      dev_sacrebleu=dev[0], dev_tokenized_bleu=dev[1], paper_bleu_dev=paper.get("bleu_dev"),
      dev_bleu_source=dev[2], test_sacrebleu=test[0], test_tokenized_bleu=test[1],
      test_bleu_source=test[2])


def _fmt(value, digits: int = 2) -> str:
  return "–" if value is None else f"{value:.{digits}f}"


def _duration(seconds: float | None) -> str:
  return "–" if seconds is None else metric_writer.format_duration(seconds)


def markdown(rows: list[dict], figures: list[str]) -> str:
  """The report as Markdown: one table row per run, the paper's value in parentheses."""
  lines = [
      "# Runs beside the paper (Vaswani et al. 2017)", "",
      "Paper: newstest2013, beam 4, no checkpoint averaging, 37k vocabulary; perplexity per "
      "word-piece. Measured BLEU is sacreBLEU / tokenized with compound splitting; "
      "report.csv says where each score comes from.", "",
      "| variant | change | params M (paper) | steps | wall time | target tokens/s "
      "| dev PPL (paper) | dev BLEU (paper) | test BLEU |",
      "|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    paper_params = f" ({r['paper_params_m']})" if r["paper_params_m"] is not None else ""
    ppl = _fmt(r["dev_perplexity"]) + (
        f" ({r['paper_ppl_dev']})" if r["paper_ppl_dev"] is not None else "")
    dev = f"{_fmt(r['dev_sacrebleu'], 1)} / {_fmt(r['dev_tokenized_bleu'], 1)}" + (
        f" ({r['paper_bleu_dev']})" if r["paper_bleu_dev"] is not None else "")
    test = f"{_fmt(r['test_sacrebleu'], 1)} / {_fmt(r['test_tokenized_bleu'], 1)}"
    measured = f"{r['params_m']:.{1 if r['params_m'] >= 10 else 2}f}"
    lines.append(f"| {r['variant']} | {r['change']} | {measured}{paper_params} "
                 f"| {r['steps']} | {_duration(r['wall_time_s'])} "
                 f"| {_fmt(r['target_tokens_per_s'], 0)} | {ppl} | {dev} | {test} |")
  lines += ["", *(f"![{pathlib.Path(f).stem}]({f})" for f in figures), ""]
  return "\n".join(lines)


def write_report(workdir: str | os.PathLike, output_dir: str | os.PathLike | None = None
                 ) -> dict[str, pathlib.Path]:
  """Writes report.md, report.csv and the figures; returns their paths by file name.

  Nothing is written when `workdir` holds no run (`ConfigError`).
  """
  runs = find_runs(workdir)
  rows = [summarize(run) for run in runs]
  out = pathlib.Path(output_dir or workdir)
  out.mkdir(parents=True, exist_ok=True)
  written = plots.training_curves(runs, out)
  with open(out / "report.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
  (out / "report.md").write_text(markdown(rows, [p.name for p in written.values()]))
  return {"report.md": out / "report.md", "report.csv": out / "report.csv", **written}


def _define_flags() -> None:
  """Flags, defined only when run as a program: the tools share names (--workdir, --config)
  and must import together into one process (tests, notebooks)."""
  flags.DEFINE_string("workdir", None, "A sweep root (runs in its sub-folders) or one run's "
                      "workdir.")
  flags.DEFINE_string("output_dir", None, "Where the report goes (default: the workdir).")
  flags.mark_flag_as_required("workdir")


def main(argv):
  del argv
  written = write_report(flags.FLAGS.workdir, flags.FLAGS.output_dir)
  print(written["report.md"].read_text())
  print("wrote " + ", ".join(str(p) for p in written.values()))


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
