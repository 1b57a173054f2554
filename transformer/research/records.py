"""Measured figures, one record each, in the repository's `results/` folder.

A benchmark or research command appends a record for every figure it measures: the figure,
its unit, and how it was measured (the command line, the commit, the date, the device, the
config and its seeds). The README's and the docs' tables are generated from the newest record
of each name (`python -m transformer.research.docs_tables`), so a figure appears once and
always with its source.

Records are JSON lines in `results/<topic>.jsonl`, appended and never edited: a figure
measured again gets a new line, and the newest line of a name is the current figure.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import subprocess
import sys
from typing import Any, Iterable

REPO = pathlib.Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"
ENV = "TRANSFORMER_RESULTS_DIR"  # another folder to append to (tests, scratch measurements)


@dataclasses.dataclass(frozen=True)
class Record:
  """One measured figure and how it was measured.

  Attributes:
    name: what was measured, dotted, unique across the folder
      (`demo.cpu.test_sacrebleu`, `decoding.cpu.beam4.ctranslate2_best_ratio`).
    figure: the value.
    unit: `BLEU`, `s`, `sentences/s`, `x` (a ratio), `%`, ...
    command: the command line that measured it, as typed.
    commit: the commit it ran at (`-dirty` when the tree had changes).
    date: when it was measured (UTC, ISO 8601).
    device: where (`cpu:AMD EPYC 9B45, 2 cores x1`, `gpu:NVIDIA H200 x1`).
    config: the config file (with `:ARG`) and the overrides that matter, or "".
    seeds: the seeds the figure is over (one for a single run).
    extra: anything else worth keeping beside it (the peer's settings, a spread).
  """

  name: str
  figure: float
  unit: str
  command: str
  commit: str
  date: str
  device: str
  config: str = ""
  seeds: tuple[int, ...] = ()
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), sort_keys=True, ensure_ascii=False)

  @classmethod
  def from_dict(cls, d: dict) -> "Record":
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - fields
    if unknown:
      raise ValueError(f"unknown record keys {sorted(unknown)}")
    return cls(**{**d, "seeds": tuple(d.get("seeds", ()))})


def results_dir() -> pathlib.Path:
  """Where records are appended: $TRANSFORMER_RESULTS_DIR, else the repository's results/."""
  return pathlib.Path(os.environ.get(ENV) or RESULTS)


def current_commit(repo: pathlib.Path = REPO) -> str:
  """The checkout's commit, with `-dirty` when tracked files have changes; "unknown" outside
  a git checkout."""
  def git(*args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)

  head = git("rev-parse", "--short=12", "HEAD")
  if head.returncode:
    return "unknown"
  dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
  return head.stdout.strip() + ("-dirty" if dirty else "")


def command_line(argv: list[str] | None = None) -> str:
  """The command as it was typed: `python -m benchmarks ...` or `python train.py ...`."""
  argv = list(sys.argv if argv is None else argv)
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  if spec is not None and spec.name:  # python -m NAME
    head = ["python", "-m", spec.name.removesuffix(".__main__")]
  else:
    head = ["python", os.path.relpath(argv[0], REPO) if argv else "?"]
  return " ".join(head + argv[1:])


def make(name: str, figure: float, unit: str, *, device: str, config: str = "",
         seeds: Iterable[int] = (), command: str | None = None, **extra) -> Record:
  """A record of `figure` measured now, by this process's command, at this commit."""
  now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
  return Record(name=name, figure=float(figure), unit=unit,
                command=command if command is not None else command_line(),
                commit=current_commit(), date=now.isoformat(), device=device, config=config,
                seeds=tuple(int(s) for s in seeds), extra=dict(extra))


def append(topic: str, records: Iterable[Record],
           folder: pathlib.Path | None = None) -> pathlib.Path:
  """Appends `records` to `<folder>/<topic>.jsonl` (the results folder by default); returns
  the file's path."""
  folder = pathlib.Path(folder) if folder is not None else results_dir()
  folder.mkdir(parents=True, exist_ok=True)
  path = folder / f"{topic}.jsonl"
  lines = "".join(r.to_json() + "\n" for r in records)
  with open(path, "a", encoding="utf-8") as f:
    f.write(lines)
    f.flush()
    os.fsync(f.fileno())
  return path


def read(path: pathlib.Path) -> list[Record]:
  """Every record of one `.jsonl` file, in the order written; a bad line is a ValueError
  naming the file and line."""
  out = []
  for number, line in enumerate(pathlib.Path(path).read_text(encoding="utf-8").splitlines(), 1):
    if not line.strip():
      continue
    try:
      out.append(Record.from_dict(json.loads(line)))
    except (ValueError, TypeError) as e:
      raise ValueError(f"{path}:{number}: not a record ({e}); fix or remove the line") from None
  return out


def load(folder: pathlib.Path | None = None) -> dict[str, Record]:
  """The current record of each name in `folder` (the results folder by default): the newest
  by date, and of two with the same date the one written last."""
  folder = pathlib.Path(folder) if folder is not None else results_dir()
  current: dict[str, Record] = {}
  for path in sorted(folder.glob("*.jsonl")):
    for record in read(path):
      held = current.get(record.name)
      if held is None or record.date >= held.date:
        current[record.name] = record
  return current
