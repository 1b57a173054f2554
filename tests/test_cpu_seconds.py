"""tests/cpu_seconds.py counts a test's own CPU and its subprocesses' and sums them by group."""

import json
import os
import subprocess
import sys

from tests import cpu_seconds
from tests.conftest import REPO

_TESTS = '''
import subprocess, sys, time

def _spin(seconds):
  end = time.process_time() + seconds
  while time.process_time() < end:
    pass

def test_in_process():
  _spin(0.3)

def test_in_a_subprocess():
  subprocess.run([sys.executable, "-c",
                  "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass"],
                 check=True)
'''


def test_cpu_seconds_of_a_test_and_its_subprocesses_by_group(tmp_path):
  (tmp_path / "test_spin.py").write_text(_TESTS)
  (tmp_path / "pytest.ini").write_text("[pytest]\n")
  report = tmp_path / "cpu.jsonl"
  report.write_text('{"a line": "of an earlier session"}\n')
  run = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "tests.cpu_seconds", "-p", "no:cacheprovider",
       f"--cpu_seconds={report}", "test_spin.py"], cwd=tmp_path, capture_output=True, text=True,
      env=dict(os.environ, PYTHONPATH=str(REPO)))
  assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
  lines = {r["test"]: r for r in map(json.loads, report.read_text().splitlines())}
  assert sorted(lines) == ["test_spin.py::test_in_a_subprocess", "test_spin.py::test_in_process"]
  own, sub = lines["test_spin.py::test_in_process"], lines["test_spin.py::test_in_a_subprocess"]
  assert own["self"] >= 0.3 and own["children"] < 0.1, own
  assert sub["children"] >= 0.6 and sub["self"] < 0.3, sub
  ((group, cpu, _, tests),) = cpu_seconds.summarize(report)
  assert group == "test_spin.py" and tests == 2 and cpu >= 0.9
  assert "CPU seconds by group" in run.stdout and "test_spin.py" in run.stdout.split(
      "CPU seconds by group")[1], run.stdout
