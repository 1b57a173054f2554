"""Aligned UTF-8 text: line splitting that keeps empty lines, and errors naming file and line."""

import subprocess
import sys

import pytest

from transformer.data import textio


def test_invalid_utf8_names_file_and_line(tmp_path):
  path = tmp_path / "bad.de"
  path.write_bytes("erste Zeile\nzweite Zeile\ndritte \xff Zeile\n".encode("latin-1"))
  with pytest.raises(ValueError, match=r"bad\.de:3: invalid UTF-8 \(byte 0xff at column 8\)"):
    textio.read_lines(path)


def test_read_lines_keeps_empty_lines_and_only_splits_on_newlines(tmp_path):
  path = tmp_path / "x.txt"
  path.write_bytes("a\r\n\nb\u2028c\nd".encode("utf-8"))
  assert textio.read_lines(path) == ["a", "", "b\u2028c", "d"]


def test_importing_textio_loads_no_jax():
  """Text I/O (and its error type) is usable without the numerical stack."""
  code = "import sys, transformer.data.textio; print(sorted({'jax', 'flax'} & set(sys.modules)))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"
