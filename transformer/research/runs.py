"""What a report reads of its runs: each run's config, training log (`metrics.jsonl`) and
evaluations (`eval/*.json`), summarized per run (`summarize`) and over the seeds of a row
(`aggregate`). `transformer.research.report` says which figures are taken from where.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import statistics

from transformer.errors import ConfigError
from transformer.evaluation import evaluate_lib
from transformer.research import grid
from transformer.research import params
from transformer.research import sweep
from transformer.run import best as best_lib
from transformer.run import workdir as workdir_lib

# Measured figures: per run, and their mean and standard deviation over seeds.
FIGURES = ("params_m", "steps", "wall_time_s", "target_tokens_per_s", "dev_perplexity",
           "dev_sacrebleu", "dev_tokenized_bleu", "dev_chrf", "dev_brevity_penalty",
           "dev_length_ratio", "dev_comet", "test_sacrebleu", "test_tokenized_bleu", "test_chrf",
           "test_brevity_penalty", "test_length_ratio", "test_comet", "best_step",
           "best_dev_sacrebleu", "best_test_sacrebleu", "best_test_chrf", "best_test_comet")
COLUMNS = ("kind", "row", "variant", "seed", "n", "change", "paper_params_m", "paper_ppl_dev",
           "paper_bleu_dev", *FIGURES, "dev_bleu_source", "test_bleu_source")


@dataclasses.dataclass
class Run:
  """One training workdir as the report reads it."""

  name: str  # config.variant, else the folder's name
  workdir: pathlib.Path
  config: object  # its ConfigDict
  metrics: list[dict]  # the lines of metrics.jsonl
  evals: list[dict]  # eval/*.json, oldest first, each with its 'file'
  row: str = ""  # the report row it belongs to: its folder below the root, less seed<k>

  def series(self, key: str) -> list[tuple[int, float | None, float]]:
    """`(step, seconds or None, value)` of every metrics line that has `key`."""
    return [(m["step"], m.get("time"), m[key]) for m in self.metrics if key in m]

  def last(self, key: str) -> float | None:
    values = self.series(key)
    return values[-1][2] if values else None


@dataclasses.dataclass
class Row:
  """The runs of one report row: one variant (or grid point), over its seeds."""

  name: str
  runs: list[Run]


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
      found.append({**result, "file": str(path)})
  return found


def load_run(workdir: pathlib.Path, row: str = "") -> Run:
  config = workdir_lib.load_config(workdir)
  name = config.get("variant") or workdir.name
  return Run(name=name, workdir=workdir, config=config,
             metrics=_read_jsonl(workdir / "metrics.jsonl"), evals=_read_evals(workdir),
             row=row or name)


def find_runs(root: str | os.PathLike) -> list[Run]:
  """The run in `root`, or the runs below it (in the paper's row order where the configs say
  it, then by row and seed).

  Raises:
    ConfigError: `root` is not a folder, or holds no run; a run's config.json is unreadable.
  """
  root = pathlib.Path(root)
  if not root.is_dir():
    raise ConfigError(f"--workdir={root} is not a folder")
  if workdir_lib.config_path(root).is_file():
    return [load_run(root)]
  runs = []
  for folder, subfolders, _ in os.walk(root):
    subfolders.sort()
    folder = pathlib.Path(folder)
    if folder != root and workdir_lib.config_path(folder).is_file():
      subfolders.clear()  # a run's own folders (checkpoints, eval, data) hold no runs
      parts = folder.relative_to(root).parts
      if len(parts) > 1 and grid.SEED_FOLDER.fullmatch(parts[-1]):
        parts = parts[:-1]
      runs.append(load_run(folder, "/".join(parts)))
  if not runs:
    raise ConfigError(f"no runs in {root}: neither it nor a folder in it has a config.json "
                      "(written when training starts); pass a run's workdir or a sweep root")

  def order(run):
    paper = run.config.get("paper") or {}
    return (paper.get("row") or float("inf"), run.row, run.config.get("seed", 0))

  return sorted(runs, key=order)


def rows_of(runs: list[Run]) -> list[Row]:
  """The runs by report row, in the order of their first run."""
  rows = {}
  for run in runs:
    rows.setdefault(run.row, Row(run.row, [])).runs.append(run)
  return list(rows.values())


def grid_keys(root: str | os.PathLike) -> list[str]:
  """The grid keys a sweep recorded in ROOT/sweep.json (none for other folders)."""
  try:
    return list(json.loads((pathlib.Path(root) / sweep.SWEEP_FILE).read_text()).get("grid", {}))
  except (OSError, ValueError, AttributeError):
    return []


def _config_value(config, dotted: str):
  node = config
  for part in dotted.split("."):
    node = node.get(part) if hasattr(node, "get") else None
  return node


def _is_own(result: dict) -> bool:
  """Whether an evaluation is of the run's own latest checkpoints: not of an ensemble (the
  run's model with others) nor of its best checkpoint on dev (`--checkpoint=best`). Written
  before evaluations said so, an ensemble's file name says `_ens<k>`."""
  if result.get("checkpoint", "latest") != "latest":
    return False
  return result.get("models", 1) == 1 and "_ens" not in pathlib.Path(result["file"]).name


def chosen_eval(run: Run, split: str, best: bool = False) -> dict | None:
  """The score of `split` under eval/ to report: the latest decoded with the config's beam size
  and length penalty from `num_average` checkpoints (evaluate.py's default), else the latest
  with that decoding (training's end-of-run score, from the last checkpoint alone), else the
  latest; None when the split was not evaluated. Of the run's own checkpoints only, or with
  `best` of its best checkpoint on dev."""
  scored = [e for e in run.evals if e["split"] == split
            and (e.get("checkpoint") == "best" if best else _is_own(e))]
  wanted = evaluate_lib.decoding_tag(run.config.decode)
  configured = [e for e in scored if _decoding(e) == wanted]
  averaged = [e for e in configured if len(e["steps"]) == run.config.get("num_average", 1)]
  return (averaged or configured or scored or [None])[-1]


def _decoding(result: dict) -> str | None:
  """An evaluation's `decoding_tag` (`beam4_alpha0.6`, `greedy`); None when its JSON does not
  say (written by an earlier version)."""
  try:
    return evaluate_lib.decoding_tag(result["decode"])
  except (KeyError, TypeError, ValueError):
    return None


def _scores(run: Run, split: str, prefix: str) -> dict:
  """`split`'s sacrebleu, tokenized_bleu, chrf, brevity_penalty, length_ratio, comet (where
  evaluate.py --comet_model or training's config.comet_model scored it) and where they come
  from (`source`): eval/'s (`chosen_eval`), else the training log's last."""
  e = chosen_eval(run, split)
  if e is not None:
    averaged = f", {len(e['steps'])} checkpoints averaged" if len(e["steps"]) > 1 else ""
    decoded = f", decoded {_decoding(e)}" if _decoding(e) else ""
    sacre = e["sacrebleu"]
    return dict(sacrebleu=sacre["score"], tokenized_bleu=e["tokenized_bleu"]["score"],
                chrf=(e.get("chrf") or {}).get("score"),
                brevity_penalty=sacre.get("brevity_penalty"),
                length_ratio=sacre.get("length_ratio"),
                comet=(e.get("comet") or {}).get("score"),
                source=f"eval/{pathlib.Path(e['file']).name}: {e['num_sentences']} sentences, "
                f"step {e['steps'][-1]}"
                f"{averaged}{decoded}")
  logged = {k: run.last(f"{prefix}/{k}")
            for k in ("sacrebleu", "tokenized_bleu", "chrf", "comet")}
  if logged["sacrebleu"] is None:
    return dict(logged, brevity_penalty=None, length_ratio=None, source="")
  subset = run.config.bleu_num_sentences if prefix == "dev" else 0  # 0: the whole split
  where = f"training log: first {subset} sentences" if subset else "training log: the whole split"
  return dict(logged, brevity_penalty=run.last(f"{prefix}/sacrebleu_brevity_penalty"),
              length_ratio=run.last(f"{prefix}/sacrebleu_length_ratio"), source=where)


_PARAMS_M: dict[str, float] = {}  # model config (JSON) -> millions of parameters


def _params_m(config) -> float:
  """Millions of parameters, counted once per model shape (a sweep's seeds share one)."""
  key = json.dumps({"model": config.model.to_dict(), "dtype": config.get("dtype")},
                   sort_keys=True, default=str)
  if key not in _PARAMS_M:
    _PARAMS_M[key] = params.report(config)[-1][1] / 1e6
  return _PARAMS_M[key]


def summarize(run: Run, grid_columns: list[str] = ()) -> dict:
  """One run's CSV row: `COLUMNS` (and the grid keys) -> value (None where it has none)."""
  paper = run.config.get("paper") or {}
  times = [m["time"] for m in run.metrics if "time" in m]
  speeds = [v for _, _, v in run.series("train/target_tokens_per_sec")]
  row = dict(kind="run", row=run.row, variant=run.name, seed=run.config.get("seed"), n=1,
             change=paper.get("change", ""), paper_params_m=paper.get("params_m"),
             paper_ppl_dev=paper.get("ppl_dev"), paper_bleu_dev=paper.get("bleu_dev"),
             params_m=_params_m(run.config),
             steps=max((m["step"] for m in run.metrics), default=0),
             wall_time_s=max(times) if times else None,
             # The median interval: the first one includes compiling the step.
             target_tokens_per_s=statistics.median(speeds) if speeds else None,
             dev_perplexity=run.last("dev/perplexity"))
  for split, prefix in ((run.config.data.eval_split, "dev"), (run.config.data.test_split, "test")):
    scores = _scores(run, split, prefix)
    row[f"{prefix}_bleu_source"] = scores.pop("source")
    row.update({f"{prefix}_{k}": v for k, v in scores.items()})
  # The checkpoint chosen on dev (config.select), the dev BLEU training logged at its step and,
  # once training's end or evaluate.py --checkpoint=best has scored it, its test scores.
  row["best_step"] = best_lib.saved_step(run.workdir)
  row["best_dev_sacrebleu"] = next(
      (v for s, _, v in run.series("dev/sacrebleu") if s == row["best_step"]), None)
  at_best = chosen_eval(run, run.config.data.test_split, best=True)
  row["best_test_sacrebleu"] = at_best["sacrebleu"]["score"] if at_best else None
  row["best_test_chrf"] = (at_best.get("chrf") or {}).get("score") if at_best else None
  row["best_test_comet"] = (at_best.get("comet") or {}).get("score") if at_best else None
  row.update({key: _config_value(run.config, key) for key in grid_columns})
  return row


def aggregate(name: str, rows: list[dict], grid_columns: list[str] = ()) -> dict:
  """The report row of runs that differ in their seed: each figure's mean and (n >= 2) sample
  standard deviation (`<figure>_std`) over the runs that have it."""
  first = rows[0]
  out = {k: first.get(k) for k in COLUMNS + tuple(grid_columns)}
  out.update(kind="variant", row=name, n=len(rows),
             seed=" ".join(str(r["seed"]) for r in rows))
  for figure in FIGURES:
    values = [r[figure] for r in rows if r.get(figure) is not None]
    out[figure] = statistics.mean(values) if values else None
    out[f"{figure}_std"] = statistics.stdev(values) if len(values) > 1 else None
    out[f"{figure}_n"] = len(values)
  return out
