"""Generated blocks in Markdown pages: tables of figures drawn from records, and their checks.

A page holds a generated table between two HTML comments, which Markdown does not show:

  <!-- table: NAME -->
  | ... the table, then a footnote per source: command, commit, date, device ...
  <!-- end table -->

`docs_tables.TABLES` defines each NAME once. A table is a header and rows of cells; a cell is
literal text, a figure (`fig`: the record of that name, rendered with its unit), the device a
record was measured on (`device`), a number kept beside a figure (`extra`), or text around
figures (`text`). Each row ends with the marks of the footnotes that give its figures'
command, commit, date and device. Rendering a table whose record is missing is an error
naming the record, so a page can never quote a figure that no record holds.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from typing import Callable, Mapping, Sequence

from transformer import records

START = re.compile(r"^<!-- table: (\S+) -->$")
END = "<!-- end table -->"
_MARKS = "¹²³⁴⁵⁶⁷⁸⁹"
_UNITS = {"s": " s", "ms": " ms", "x": "×", "%": "%", "GiB": " GiB", "M": "M"}


class Sources:
  """The footnotes of one table: each distinct (command, commit, date, device) once, numbered
  in order of first use, and the numbers the row being rendered uses."""

  def __init__(self):
    self.keys: list[tuple[str, str, str, str]] = []
    self.row: list[int] = []

  def use(self, record: records.Record) -> records.Record:
    """Notes that the row being rendered shows a figure of `record`; returns it."""
    key = (record.command, record.commit, record.date[:10], short_device(record.device))
    if key not in self.keys:
      self.keys.append(key)
    if self.keys.index(key) + 1 not in self.row:
      self.row.append(self.keys.index(key) + 1)
    return record

  def marks(self) -> str:
    """The marks of the row just rendered (` ¹ ²`), "" for a table of one source."""
    return "" if len(self.keys) < 2 else "".join(" " + superscript(n) for n in self.row)

  def lines(self) -> list[str]:
    if len(self.keys) == 1:
      return ["Measured by `{}` at {}, {}, {}.".format(*self.keys[0])]
    return [f"- {superscript(i)} `{command}` at {commit}, {date}, {device}"
            for i, (command, commit, date, device) in enumerate(self.keys, 1)]


def superscript(n: int) -> str:
  """1 -> ¹, 12 -> ¹²."""
  return "".join(_MARKS[int(d) - 1] if d != "0" else "⁰" for d in str(n))


def short_device(device: str) -> str:
  """`cpu:AMD EPYC, 2 cores x1` -> `CPU, AMD EPYC, 2 cores`; `gpu:NVIDIA H200 x1` -> `NVIDIA
  H200`; more than one device keeps its count (`8 × NVIDIA H100`)."""
  platform, _, kind = device.partition(":")
  kind, _, count = kind.rpartition(" x") if " x" in kind else (kind, "", "1")
  kind = f"CPU, {kind}" if platform == "cpu" else kind
  return kind if count in ("", "1") else f"{count} × {kind}"


def number(value: float, digits: int, signed: bool = False) -> str:
  """`1511.3` -> `1,511.3` (thousands apart, `digits` decimals); `signed`: `+0.79`, `−0.19`."""
  text = f"{value:{'+' if signed else ''},.{digits}f}"
  return text.replace("-", "−") if signed else text


Cell = Callable[[Mapping[str, records.Record], Sources], str]


def fig(name: str, digits: int = 2, unit: bool = True, sd: bool = False, flag: str = "",
        scale: float = 1.0, signed: bool = False) -> Cell:
  """The figure of record `name`: its value (times `scale`) in `digits` decimals, its unit
  unless `unit` is False (the column's header names it), `± sd` from the record's
  `extra["sd"]` when `sd` (over more than one run), `†` where the record's `extra[flag]` is
  true. A fraction is shown as a percentage; `signed` writes a difference's sign."""

  def render(held, sources):
    record = sources.use(lookup(held, name))
    value = record.figure * scale
    if record.unit == "fraction":
      value *= 100
    out = number(value, digits, signed)
    if record.unit == "fraction":
      out += "%" if unit else ""
    elif unit and record.unit in _UNITS:
      out += _UNITS[record.unit]
    elif unit and record.unit not in ("", "BLEU", "chrF", "perplexity"):
      out += f" {record.unit}"
    if sd and record.extra.get("runs", 2) > 1:
      out += f" ± {number(record.extra['sd'] * scale, digits)}"
    if flag and record.extra.get(flag):
      out += "†"
    return out

  return render


def extra(name: str, key: str, digits: int = 2, significant: int = 0) -> Cell:
  """A number the record `name` keeps beside its figure (`extra[key]`): a p-value (to
  `significant` digits), a lowest seed; a pair is an interval, `[−0.23, +1.92]`."""

  def render(held, sources):
    value = sources.use(lookup(held, name)).extra[key]
    if isinstance(value, (list, tuple)):
      return "[" + ", ".join(number(v, digits, signed=True) for v in value) + "]"
    return f"{value:.{significant}g}" if significant else number(value, digits)

  return render


def device(name: str) -> Cell:
  """The device record `name` was measured on, as `short_device` writes it."""
  return lambda held, sources: short_device(sources.use(lookup(held, name)).device)


def text(template: str, **cells: Cell) -> Cell:
  """`template` with each `{key}` replaced by its cell: `text("{a} ({b} + {c})", a=fig(...))`."""
  return lambda held, sources: template.format(
      **{k: cell(held, sources) for k, cell in cells.items()})


def lookup(held: Mapping[str, records.Record], name: str) -> records.Record:
  if name not in held:
    raise KeyError(f"no record named {name!r} in the results folder; measure it (the command "
                   "of its table's footnote) or take its row out of the table")
  return held[name]


@dataclasses.dataclass(frozen=True)
class Table:
  """A generated table: its header, and its rows of cells (a `str` is literal text)."""

  header: Sequence[str]
  rows: Sequence[Sequence[str | Cell]]

  def render(self, held: Mapping[str, records.Record]) -> str:
    """The table, each row ending with the marks of its sources, and their footnotes (one
    source: one line under the table, no marks)."""
    sources = Sources()
    self._lines(held, sources)  # numbers the sources
    return "\n".join(self._lines(held, sources) + [""] + sources.lines())

  def _lines(self, held, sources) -> list[str]:
    lines = ["| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
    for row in self.rows:
      if len(row) != len(self.header):
        raise ValueError(f"a row of {len(row)} cells under {len(self.header)} headers: {row}")
      sources.row = []
      cells = [c if isinstance(c, str) else c(held, sources) for c in row]
      cells[-1] += sources.marks()
      lines.append("| " + " | ".join(cells) + " |")
    return lines


@dataclasses.dataclass(frozen=True)
class Block:
  """One generated block of a page: its table's name and the lines between its markers."""

  name: str
  start: int  # the line of the start marker
  end: int  # the line of the end marker
  body: str


def blocks(page: str, path: str = "page") -> list[Block]:
  """The generated blocks of `page`, in order; a start marker without its end (or an end
  without a start) is a ValueError naming the line."""
  found, open_at, name = [], None, ""
  lines = page.split("\n")
  for i, line in enumerate(lines):
    match = START.match(line.strip())
    if match:
      if open_at is not None:
        raise ValueError(f"{path}:{i + 1}: a table starts inside table {name!r} "
                         f"(line {open_at + 1}); close it with {END}")
      open_at, name = i, match.group(1)
    elif line.strip() == END:
      if open_at is None:
        raise ValueError(f"{path}:{i + 1}: {END} without a table before it")
      found.append(Block(name, open_at, i, "\n".join(lines[open_at + 1:i]).strip("\n")))
      open_at = None
  if open_at is not None:
    raise ValueError(f"{path}:{open_at + 1}: table {name!r} has no {END}")
  return found


def regenerate(page: str, tables: Mapping[str, Table], held: Mapping[str, records.Record],
               path: str = "page") -> tuple[str, list[str]]:
  """`page` with every generated block rendered afresh, and the names of the blocks that
  changed. An unknown table name is a ValueError naming the line and the known names."""
  lines = page.split("\n")
  stale = []
  for block in reversed(blocks(page, path)):
    if block.name not in tables:
      raise ValueError(f"{path}:{block.start + 1}: no table named {block.name!r}; known: "
                       f"{', '.join(sorted(tables))}")
    body = tables[block.name].render(held)
    if body != block.body:
      stale.append(block.name)
    lines[block.start + 1:block.end] = [""] + body.split("\n") + [""]
  return "\n".join(lines), stale[::-1]


def pages(repo: pathlib.Path = records.REPO) -> list[pathlib.Path]:
  """The pages that may hold generated blocks: README.md and docs/*.md."""
  return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]
