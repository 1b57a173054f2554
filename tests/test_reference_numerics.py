"""The wrapper of the reference child (tests/reference_numerics.py): it runs its command at a
lower priority, leaves the exit status where any worker can wait for it, and ends the command
when the session stops early."""

import os
import pathlib
import subprocess
import sys
import time

import pytest

from tests import reference_numerics

REPO = pathlib.Path(__file__).resolve().parents[1]


def _launch(tmp_path, code: str):
  folder = tmp_path / "child"
  folder.mkdir()
  reference_numerics.launch(folder, [sys.executable, "-c", code], dict(os.environ), tmp_path)
  return folder


def test_the_command_runs_at_a_lower_priority_and_its_status_is_left_to_wait_for(tmp_path):
  folder = _launch(tmp_path, "import os, sys; print(os.nice(0)); sys.exit(3)")
  assert reference_numerics.wait_for_status(folder) == 3
  niceness = min(os.nice(0) + reference_numerics.NICE, 19)
  assert (folder / "stdout").read_text() == f"{niceness}\n"


def test_the_status_reaches_a_waiter_in_another_process_after_the_starter_has_ended(tmp_path):
  """As under pytest-xdist, which ends a worker once no work is left for it: the worker that
  started the child may be gone before the item waits for it in the other worker."""
  folder = tmp_path / "child"
  folder.mkdir()
  child = "import sys, time; time.sleep(1); sys.exit(4)"
  starter = ("import os, pathlib, sys; from tests import reference_numerics; "
             f"reference_numerics.launch(pathlib.Path({str(folder)!r}), "
             f"[sys.executable, '-c', {child!r}], dict(os.environ), {str(tmp_path)!r})")
  subprocess.run([sys.executable, "-c", starter], check=True, cwd=REPO,
                 env=dict(os.environ, PYTHONPATH=str(REPO)))
  assert not (folder / "status").exists()  # the starter is gone, its child still runs
  assert reference_numerics.wait_for_status(folder) == 4


def test_a_session_stopped_early_ends_the_command(tmp_path):
  folder = _launch(tmp_path, "import os, time; print(os.getpid(), flush=True); time.sleep(60)")
  deadline = time.monotonic() + 30
  while not (folder / "stdout").read_text() and time.monotonic() < deadline:
    time.sleep(0.01)
  reference_numerics.stop_if_running(folder)
  assert reference_numerics.wait_for_status(folder) == -15  # SIGTERM
  with pytest.raises(ProcessLookupError):
    os.kill(int((folder / "stdout").read_text()), 0)


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "not yet reaped"])
def test_a_wrapper_gone_without_a_status_fails_the_wait(tmp_path, reaped):
  gone = subprocess.Popen([sys.executable, "-c", ""])
  # Ended; reaped, or left for its parent to reap (a zombie), as by the worker that started it.
  os.waitid(os.P_PID, gone.pid, os.WEXITED | (0 if reaped else os.WNOWAIT))
  (tmp_path / "pid").write_text(str(gone.pid))
  with pytest.raises(reference_numerics.ReferenceNumericsFailed, match="without an exit"):
    reference_numerics.wait_for_status(tmp_path)
  if not reaped:
    gone.wait()
