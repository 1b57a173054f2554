"""Measured figures, one record each, in the repository's `results/` folder.

A benchmark or research command appends a record for every figure it measures: the figure,
its unit, and how it was measured (the command line, the commit, the date, the device, the
config and its seeds). The README's and the docs' tables are generated from the newest record
of each name (`python -m transformer.research.docs_tables`), so a figure appears once and
always with its source.

Records are JSON lines in `results/<topic>.jsonl`, appended and never edited: a figure
measured again gets a new line, and the newest line of a name is the current figure. A name
says what was measured and where: `<command>.<config>.<device tag>.<row>.<figure>`
(`time_to_bleu.tatoeba_small.cpu.steps1500.run1.test_sacrebleu`,
`decoding.base.gpu-h100-80gb-hbm3.flax_examples_wmt.project_over_flax`; `device_tag`,
`flatten`), so that one device's figure never stands for another's.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import pathlib
import platform
import re
import subprocess
import sys
from typing import Any, Iterable

REPO = pathlib.Path(__file__).resolve().parents[1]
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


def device_tag(device: str) -> str:
  """The part of a record's name that says where it ran: `cpu` for any CPU, else the platform
  and the device's model (`gpu:NVIDIA H200 x1` -> `gpu-h200`), so that a figure of one
  accelerator never stands for another's."""
  platform, _, kind = device.partition(":")
  if platform == "cpu" or not kind:
    return platform or "unknown"
  kind = kind.rsplit(" x", 1)[0]
  words = [w for w in re.split(r"[^0-9a-z]+", kind.lower()) if w and w not in _VENDORS]
  return "-".join([platform, *words])


_VENDORS = ("nvidia", "amd", "google", "intel")


def device_name() -> str:
  """This process's device as records name it: `gpu:NVIDIA H200 x1`, or on the CPU (whose
  `device_kind` is only "cpu") the processor and the cores this process may use,
  `cpu:AMD EPYC, 2 cores x1`. Imports JAX, and starts its backend."""
  import jax  # here: reading and writing records needs no JAX

  d = jax.devices()[0]
  kind = d.device_kind
  if d.platform == "cpu":
    kind = f"{cpu_model()}, {len(os.sched_getaffinity(0))} cores"
  return f"{d.platform}:{kind} x{jax.device_count()}"


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
  """The processor's model name (Linux), or the platform's processor string elsewhere.

  A name that names no model (a cloud VM's `AMD EPYC`) gets the processor's family and model
  numbers and its widest vector instructions beside it, `AMD EPYC (family 25 model 1, AVX2)`:
  two hosts behind the same name can differ in speed and, through XLA's code for their
  instructions, in a long run's numbers."""
  try:
    with open(cpuinfo) as f:
      fields = dict(_cpuinfo_fields(f))
  except OSError:
    fields = {}
  name = fields.get("model name")
  if not name:
    return platform.processor() or "unknown processor"
  if re.search(r"\d", name) or "cpu family" not in fields:
    return name
  flags = fields.get("flags", "").split()
  vector = next((isa.upper() for isa in ("avx512f", "avx2", "avx") if isa in flags), "")
  details = [f"family {fields['cpu family']} model {fields.get('model', '?')}",
             vector.replace("AVX512F", "AVX-512")]
  return f"{name} ({', '.join(d for d in details if d)})"


def _cpuinfo_fields(lines):
  """`(key, value)` of the first processor's block of /proc/cpuinfo."""
  for line in lines:
    if not line.strip():
      return
    key, _, value = line.partition(":")
    yield key.strip(), value.strip()


# Fields that tell the rows of a suite apart, in the order a row's name joins them; integers
# carry a short key (`b32`, `chunk0`), booleans their key or `no_` and their key.
_ROW_KEYS = {"name": "", "model": "", "variant": "", "mode": "", "corpus": "", "layout": "",
             "code": "", "start": "", "tree": "", "dtype": "", "attention_impl": "",
             "dropout_rng_impl": "", "loss_chunk_tokens": "chunk",
             "cpu_workarounds": "cpu_workarounds", "run": "run", "round": "round",
             "seed": "seed", "batch_size": "b", "beam_size": "beam", "source_length": "s",
             "target_length": "t", "output_length": "out"}
# A figure's unit from its key (the last part of its name, else the whole name): the first
# pattern that matches counts.
_UNITS = ((r"(_share|^mfu)$", "fraction"), (r"(ratio|_over_)", "x"), (r"^us_per_", "µs"),
          (r"(^ms_|_ms_|_ms$)", "ms"), (r"(_per_sec|_per_s)$", "/s"), (r"_gib$", "GiB"),
          (r"(_s|seconds)$", "s"), (r"bleu", "BLEU"), (r"chrf", "chrF"), (r"comet", "COMET"),
          (r"perplexity", "perplexity"))


def row_label(row: dict) -> str:
  """The name of one row of a suite's list: its identifying fields joined by `-`
  (`base-bfloat16-reference-threefry2x32-chunk0-b390-s64-t64`)."""
  parts = []
  for key, short in _ROW_KEYS.items():
    value = row.get(key)
    if isinstance(value, bool):
      parts.append(short if value else f"no_{short}")
    elif isinstance(value, int):
      parts.append(f"{short}{value}")
    elif isinstance(value, str) and value:
      parts.append(re.sub(r"[^0-9A-Za-z_@-]+", "_", value).strip("_"))
  return "-".join(parts)


def flatten(figures, path: str = "") -> list[tuple[str, float, str]]:
  """Every number of a benchmark's figures (nested dicts and lists, as its JSON) as `(dotted
  name, value, unit)`: dicts by their keys, lists of rows by `row_label` (or their position);
  the identifying fields of a row, strings and non-finite numbers left out."""
  out = []
  if isinstance(figures, dict):
    for key, value in figures.items():
      if key in _ROW_KEYS or key in ("suite", "device"):
        continue
      out += flatten(value, f"{path}.{key}" if path else str(key))
  elif isinstance(figures, list):
    labels = [row_label(r) if isinstance(r, dict) else "" for r in figures]
    if len(set(labels)) < len(labels) or "" in labels:
      labels = [str(i) for i in range(len(figures))]
    for label, value in zip(labels, figures):
      out += flatten(value, f"{path}.{label}")
  elif isinstance(figures, (int, float)) and not isinstance(figures, bool):
    if math.isfinite(figures):
      out.append((path, float(figures), unit_of(path)))
  return out


def unit_of(name: str) -> str:
  """The unit of the figure named `name` (`runs.run1.total_s` -> `s`), "" where none fits."""
  for text in (name.rsplit(".", 1)[-1], name):
    for pattern, unit in _UNITS:
      if re.search(pattern, text):
        return unit
  return ""


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
