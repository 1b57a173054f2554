"""The tests marked `reference_numerics`, run in one child pytest process that compiles at XLA's
defaults (TRANSFORMER_TEST_COMPILE=xla_defaults), in the background of the session.

The child starts as soon as a session has collected its tests (the first worker to finish
collecting starts it), at a lower scheduling priority (nice 10): it takes a core whenever a
worker waits (a heartbeat timeout, a subprocess's start, a sleep) and little of one while both
workers compute. The item that stands for it, `reference_numerics_at_xla_defaults`, goes out
last and waits for the child's exit status: it passes when every one of the child's tests
passes, and fails showing the child's report (docs/testing.md, "Compile settings").

The child runs under a small Python wrapper that records the child's exit status in a file of
the session's folder (`ENV`), so that the item can wait for it in any worker, whether or not
the worker that started it is still running (pytest-xdist ends a worker once no work is left
for it). The session's main process stops a child still running when the session ends.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

ENV = "TRANSFORMER_TEST_REFERENCE_DIR"  # the session's folder, made by its main process
NICE = 10  # CFS gives a nice-10 process about a tenth of a core beside a nice-0 one
START_TIMEOUT_S = 60  # how long a wait gives a claimed folder to name its child's process

# Runs argv[2:] at a lower priority; writes its exit status (a negative one for a signal) to
# argv[1] when it ends; SIGTERM ends the child first.
_WRAPPER = """\
import os, signal, subprocess, sys
os.nice(int(os.environ.pop("TRANSFORMER_TEST_REFERENCE_NICE")))
children, stopped = [], []
def stop(*_):
  stopped.append(True)
  for child in children:
    child.terminate()
signal.signal(signal.SIGTERM, stop)
children.append(subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL))
if stopped:
  children[0].terminate()
status = children[0].wait()
with open(sys.argv[1] + ".tmp", "w") as f:
  f.write(str(status))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
"""


def _folder() -> pathlib.Path:
  return pathlib.Path(os.environ[ENV]) / "child"


class ReferenceNumerics(pytest.Item):
  """Stands for the session's tests marked `reference_numerics`: `start` starts their child,
  `runtest` waits for it."""

  def __init__(self, *, nodeids, repo, xla_flags, **kwargs):
    super().__init__(**kwargs)
    self.nodeids, self.repo, self.xla_flags = nodeids, repo, xla_flags
    self.add_marker(pytest.mark.reference_numerics)
    self.add_marker(pytest.mark.xdist_group("reference_numerics"))

  def start(self) -> None:
    """Starts the child, unless another worker of the session has."""
    folder = _folder()
    try:
      folder.mkdir()
    except FileExistsError:
      return
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(TRANSFORMER_TEST_COMPILE="xla_defaults", XLA_FLAGS=self.xla_flags)
    # A compilation cache and a folder of its own, removed when it ends.
    del env["TRANSFORMER_TEST_XLA_CACHE"], env[ENV]
    launch(folder, [sys.executable, "-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider",
                    "-rfE", *self.nodeids], env, self.repo)

  def runtest(self):
    folder = _folder()
    status = wait_for_status(folder)
    stdout = (folder / "stdout").read_text(errors="replace")
    self.add_report_section("call", "child", stdout[-3000:])
    if status != 0:
      stderr = (folder / "stderr").read_text(errors="replace")
      raise ReferenceNumericsFailed(f"exit status {status}\n" + stdout[-12000:]
                                    + stderr[-3000:])

  def repr_failure(self, excinfo, style=None):
    if isinstance(excinfo.value, ReferenceNumericsFailed):
      return f"{len(self.nodeids)} tests at XLA's defaults, in a child process:\n" + str(
          excinfo.value)
    return super().repr_failure(excinfo, style)

  def reportinfo(self):
    return self.repo / "tests/reference_numerics.py", None, (
        f"{self.name} ({len(self.nodeids)} tests)")


class ReferenceNumericsFailed(Exception):
  pass


def launch(folder: pathlib.Path, argv: list[str], env: dict, cwd) -> None:
  """Starts `argv` at nice +NICE under the wrapper, its output and status in `folder`."""
  with open(folder / "stdout", "w") as out, open(folder / "stderr", "w") as err:
    wrapper = subprocess.Popen(
        [sys.executable, "-c", _WRAPPER, str(folder / "status"), *argv], cwd=cwd,
        env=dict(env, TRANSFORMER_TEST_REFERENCE_NICE=str(NICE)), stdin=subprocess.DEVNULL,
        stdout=out, stderr=err)
  (folder / "pid.tmp").write_text(str(wrapper.pid))
  (folder / "pid.tmp").replace(folder / "pid")


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  try:  # ended, and not yet reaped by the worker that started it ("Z"), where /proc says so
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
  except OSError:
    return True


def wait_for_status(folder: pathlib.Path) -> int:
  """The child's exit status, once it has one; fails if it was never started or its wrapper
  ended without writing one."""
  status, pid, since = folder / "status", folder / "pid", time.monotonic()
  while not status.exists():
    if not pid.exists():
      if not folder.exists() or time.monotonic() - since > START_TIMEOUT_S:
        raise ReferenceNumericsFailed(f"no child process was started in {folder}")
    elif not _alive(int(pid.read_text())) and not status.exists():
      raise ReferenceNumericsFailed(f"the child's wrapper in {folder} ended without an exit "
                                    "status")
    time.sleep(0.1)
  return int(status.read_text())


def start_if_collected(session: pytest.Session) -> None:
  """Starts the child of a session that will run its item (not one that only collects)."""
  if session.config.option.collectonly or session.config.option.setupplan:
    return
  for item in session.items:
    if isinstance(item, ReferenceNumerics):
      item.start()


def stop_if_running(folder: pathlib.Path | None = None) -> None:
  """Ends a child still running (the session stopped early); its wrapper writes its status."""
  folder = folder or _folder()
  if (folder / "pid").exists() and not (folder / "status").exists():
    try:
      os.kill(int((folder / "pid").read_text()), signal.SIGTERM)
    except ProcessLookupError:
      return
    deadline = time.monotonic() + 10
    while not (folder / "status").exists() and time.monotonic() < deadline:
      time.sleep(0.1)
