"""Reading and writing aligned UTF-8 text, one sentence per line.

Invalid UTF-8 is reported as a `ConfigError` naming the file, line and column, whether the
file is streamed (corpora, `check_lines`) or read whole (`read_lines`).
"""

from __future__ import annotations

import functools
import os
import pathlib
import stat
import sys
import tempfile
from typing import Sequence

from transformer.errors import ConfigError


def invalid_utf8(path, data: bytes, e: UnicodeDecodeError,
                 lines_before: int = 0) -> ConfigError:
  """The one-line error for bytes of `path` that are not UTF-8 (`e`), naming the line (after
  `lines_before`) and the column."""
  line = lines_before + data.count(b"\n", 0, e.start) + 1
  column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
  return ConfigError(f"{path}:{line}: invalid UTF-8 (byte {data[e.start]:#04x} at column "
                     f"{column}); re-encode the file as UTF-8, e.g. with iconv")


def check_lines(path: str | os.PathLike) -> int:
  """Number of lines of `path`, streamed in blocks; `ConfigError` on invalid UTF-8."""
  lines = 0
  tail = b""
  with open(path, "rb") as f:
    while True:
      chunk = f.read(1 << 24)
      data = tail + chunk
      cut = len(data) if not chunk else data.rfind(b"\n") + 1
      block, tail = data[:cut], data[cut:]
      try:
        block.decode("utf-8")
      except UnicodeDecodeError as e:
        raise invalid_utf8(path, block, e, lines) from None
      lines += block.count(b"\n")
      if not chunk:
        return lines + (1 if block and not block.endswith(b"\n") else 0)


def strip_newline(line: str) -> str:
  """A line without its '\n' or '\r\n' ending."""
  return line[:-1].removesuffix("\r") if line.endswith("\n") else line.removesuffix("\r")


def read_lines(path: str | os.PathLike) -> list[str]:
  """Lines of a UTF-8 text file ('-' = standard input), without their line ends.

  Raises:
    ConfigError: naming the file and line, if the file is not valid UTF-8.
  """
  if str(path) == "-":
    path, data = "<stdin>", sys.stdin.buffer.read()
  else:
    data = pathlib.Path(path).read_bytes()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise invalid_utf8(path, data, e) from None
  lines = text.split("\n")  # not splitlines(): it also splits on \x0b, \x1c, U+2028, ...
  if lines and lines[-1] == "":
    lines.pop()
  return [line.removesuffix("\r") for line in lines]


def write_lines(path: str | os.PathLike, lines: Sequence[str]) -> pathlib.Path:
  """Writes one line per item, UTF-8, '\\n'-terminated, whole or not at all
  (`write_text_atomically`); returns the path."""
  return write_text_atomically(path, "".join(f"{line}\n" for line in lines))


def write_text_atomically(path: str | os.PathLike, text: str) -> pathlib.Path:
  """Writes `text` (UTF-8) to `path` whole or not at all (`write_bytes_atomically`)."""
  return write_bytes_atomically(path, text.encode("utf-8"))


def write_bytes_atomically(path: str | os.PathLike, data: bytes) -> pathlib.Path:
  """Writes `data` to `path` through a temporary file in the same folder, flushed to disk and
  then renamed: a crash or a full disk leaves the file as it was, never half written, and no
  temporary file behind. The file keeps its permissions (a new one gets what `open` would
  give it). A link, a device or a pipe (`/dev/stdout`), or a file that can be written in a
  folder that cannot, is written in place, as asked. Returns the path."""
  path = pathlib.Path(path)
  if path.is_symlink() or (path.exists() and not path.is_file()):
    return _write_in_place(path, data)
  mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o666 & ~_umask()
  try:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  except PermissionError:
    if not path.exists():
      raise
    return _write_in_place(path, data)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fchmod(f.fileno(), mode)
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  return path


def _write_in_place(path: pathlib.Path, data: bytes) -> pathlib.Path:
  with open(path, "wb") as f:
    f.write(data)
  return path


@functools.cache
def _umask() -> int:
  mask = os.umask(0o022)  # read by setting it: there is no other portable way
  os.umask(mask)
  return mask
