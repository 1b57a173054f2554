"""Aligned UTF-8 text: line splitting that keeps empty lines, errors naming file and line, and
files written whole or not at all."""

import errno
import os
import stat
import subprocess
import sys
import tempfile
import threading

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


def test_a_write_that_fails_leaves_the_file_as_it_was_and_nothing_beside_it(tmp_path,
                                                                           monkeypatch):
  path = textio.write_lines(tmp_path / "hyp.txt", ["erste", "zweite"])

  def disk_full(fd):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "fsync", disk_full)
  with pytest.raises(OSError, match="No space left"):
    textio.write_lines(path, ["neu"] * 1000)
  assert textio.read_lines(path) == ["erste", "zweite"]
  assert os.listdir(tmp_path) == ["hyp.txt"]


def test_a_file_written_keeps_its_permissions_and_a_new_one_gets_open_s(tmp_path):
  new = textio.write_lines(tmp_path / "new.txt", ["a"])
  with open(tmp_path / "plain.txt", "w"):
    pass
  assert stat.S_IMODE(new.stat().st_mode) == stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode)
  new.chmod(0o640)
  textio.write_lines(new, ["b"])
  assert stat.S_IMODE(new.stat().st_mode) == 0o640 and textio.read_lines(new) == ["b"]


def test_links_and_devices_are_written_through(tmp_path):
  target = textio.write_lines(tmp_path / "target.txt", ["old"])
  link = tmp_path / "link.txt"
  link.symlink_to(target)
  textio.write_lines(link, ["new"])
  assert link.is_symlink() and textio.read_lines(target) == ["new"]
  pipe = tmp_path / "pipe"  # as /dev/stdout can be: read as it is written, never replaced
  os.mkfifo(pipe)
  read = []
  reader = threading.Thread(target=lambda: read.append(pipe.read_text()))
  reader.start()
  textio.write_lines(pipe, ["through"])
  reader.join(timeout=10)
  assert read == ["through\n"] and stat.S_ISFIFO(os.stat(pipe).st_mode)


def test_a_file_in_a_folder_that_cannot_be_written_is_written_in_place(tmp_path, monkeypatch):
  """As `--output` allows (run.writable): the file opens for writing, its folder does not
  take a temporary file."""
  path = textio.write_lines(tmp_path / "out.txt", ["old"])

  def read_only_folder(**kwargs):
    raise PermissionError(13, "Permission denied")

  monkeypatch.setattr(tempfile, "mkstemp", read_only_folder)
  textio.write_lines(path, ["new"])
  assert textio.read_lines(path) == ["new"]
  with pytest.raises(PermissionError):
    textio.write_lines(tmp_path / "absent.txt", ["new"])
