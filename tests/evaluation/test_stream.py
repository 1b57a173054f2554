"""Standard input in batches as lines come (transformer/evaluation/stream.py), through real
pipes; and evaluate.py answering each line of a pipe before the next is written."""

import os
import select
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import REPO
from transformer.errors import ConfigError
from transformer.evaluation import stream


def _pipe_with(*writes, pause_s=0.0):
  """A pipe's read end, the `writes` (bytes) written to it one after another with `pause_s`
  between them by a thread, then closed."""
  read, write = os.pipe()

  def writer():
    with os.fdopen(write, "wb") as f:
      for i, data in enumerate(writes):
        if i:
          time.sleep(pause_s)
        f.write(data)
        f.flush()

  threading.Thread(target=writer, daemon=True).start()
  return os.fdopen(read, "rb")


def test_lines_written_together_share_a_batch_and_full_batches_end_at_once():
  lines = _pipe_with(b"a\nb\n\nc\r\nd\ne")  # a blank line, a CRLF, no newline at the end
  assert list(stream.batches(lines, batch_size=4)) == [["a", "b", "", "c"], ["d", "e"]]


def test_a_pause_ends_a_batch():
  lines = _pipe_with(b"one\ntwo\n", b"three\n", pause_s=20 * stream.WAIT_S)
  assert list(stream.batches(lines, batch_size=8)) == [["one", "two"], ["three"]]


def test_invalid_utf8_names_the_line():
  lines = _pipe_with(b"ok\n", b"\xff bad\n", pause_s=20 * stream.WAIT_S)
  batches = stream.batches(lines, batch_size=8)
  assert next(batches) == ["ok"]
  with pytest.raises(ConfigError, match=r"<stdin>:2: invalid UTF-8 \(byte 0xff at column 1\)"):
    next(batches)


def _read_line(process, timeout_s: float) -> str:
  ready, _, _ = select.select([process.stdout], [], [], timeout_s)
  assert ready, f"no translation within {timeout_s} s"
  return process.stdout.readline()


def test_evaluate_py_answers_each_line_of_a_pipe_before_the_next_comes(trained):
  config, workdir = trained
  process = subprocess.Popen(
      [sys.executable, "evaluate.py", f"--workdir={workdir}", "--input=-", "--num_average=1"],
      cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  try:
    answers = []
    for line in (b"ba lo\n", b"\n", b"ki ne ba\n"):
      process.stdin.write(line)
      process.stdin.flush()
      answers.append(_read_line(process, 60))  # before the next line is written
    process.stdin.close()
    assert process.wait(timeout=60) == 0, process.stderr.read()[-2000:]
  finally:
    process.kill()
  assert answers[1] == b"\n" and answers[0].strip() and answers[2].strip(), answers
  assert process.stdout.read() == b""  # one line out per line in
