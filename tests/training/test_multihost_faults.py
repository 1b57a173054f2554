"""A fault on one process of a multi-host run ends every process, each with one line.

What a cluster produces is one-sided: only process 0 writes metrics, each process writes its
own checkpoint shards and reads its own data, Ctrl-C reaches one terminal, a read fails on one
host. Each case runs 2 local processes (2 CPU devices each, mesh 1×2×2, checkpoints every 2
steps; `tests/multihost_driver.py --fault`) and checks what a user sees: every process exits
non-zero within the heartbeat timeout (or the step timeout) + 30 s, the project's line is the
last thing each prints (the failed process's own, the others' naming it, its host and its
error), no JAX abort, and the checkpoint the others' lines name is where the same command
resumes. Process 0, which serves JAX's coordination service, is tested on its own too: Ctrl-C
(SIGINT) in its terminal ends both with one line each; SIGKILL ends the other with JAX's
abort, which no public JAX option prevents (docs/failures.md).
"""

import logging
import os
import re
import signal
import sys
import threading
import time
import types

import jax
import pytest

from tests.training.test_multihost import (HEARTBEAT_S, _launch, _lines,
                                           _matches_reference, _resume_steps_named, _succeeds,
                                           _wait, _when_logged, reference)  # noqa: F401 - a fixture
from transformer.errors import ConfigError
from transformer.run import checkpoint
from transformer.run import checkpoint_layout
from transformer.training import peer_watch

# config.step_timeout_seconds of the stuck-loader case. Process 0's step clock starts after
# its first step; on CPU only process 0 writes JAX's persistent cache and process 1's keys
# differ, so process 1 still compiles the programs of later steps (the log's sums, the save)
# while process 0 waits on it: 6 s was passed on busy cores (process 0 named itself stuck).
STEP_TIMEOUT_S = 12
# One process alone waits on no one: its stuck-step case ends sooner.
SINGLE_STEP_TIMEOUT_S = 6
# (fault, process, the failed process's exit status, what its own last line says, the error
# the others' lines name). Each kind of fault once, on process 0 or 1: either process failing
# is covered (process 0's failure by the loader error and Ctrl-C, another's by the others), and
# a failed save on process 1, whose part of a checkpoint alone fails, is the one-sided case.
FAULTS = [
    ("disk_full", 1, 2, r"error: No space left on device while writing checkpoint 4 to ",
     "No space left on device while writing checkpoint 4 to "),
    ("config_error", 1, 2, r"error: /data/train.de line 7: invalid UTF-8",
     "/data/train.de line 7: invalid UTF-8"),
    ("loader_error", 0, 1, r"error: process 0 of 2 failed: RuntimeError: the data loader "
                           r"broke; every process of the run stops",
     "RuntimeError: the data loader broke"),
    ("sigint", 0, 130, r"error: process 0 of 2 failed: interrupted \(SIGINT\); every process "
                       r"of the run stops", "interrupted (SIGINT)"),
    ("loader_hang", 1, 1, r"error: process 1 of 2 is stuck: no training step completed for "
                          rf"{STEP_TIMEOUT_S} s \(config.step_timeout_seconds\); its main "
                          r"thread waits in __next__ \(tests/multihost_driver.py:\d+\)",
     f"no training step completed for {STEP_TIMEOUT_S} s"),
]


def _when_saved(workdir, step: int, procs) -> None:
  """Returns once checkpoint `step` is complete: where the same command would resume."""
  deadline = time.monotonic() + 60
  while (checkpoint_layout.resume_step(str(workdir)) or 0) < step:
    if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
      pytest.fail(f"the run ended or stalled before checkpoint {step} was complete:\n"
                  + "\n".join(p.communicate()[0][-2000:] for p in procs))
    time.sleep(0.05)


@pytest.mark.parametrize("fault, failing, status, own_line, error", FAULTS,
                         ids=[f"{f} on process {p}" for f, p, *_ in FAULTS])
def test_a_fault_on_one_process_ends_every_process_with_one_line(reference, tmp_path, fault,
                                                                 failing, status, own_line,
                                                                 error):
  workdir = tmp_path / "run"
  flags = dict(heartbeat_timeout=HEARTBEAT_S, checkpoint_every=2)
  if fault != "sigint":
    flags.update(fault=fault, fault_process=failing, fault_step=4)
  if fault == "loader_hang":
    flags.update(step_timeout=STEP_TIMEOUT_S)
  procs = _launch(workdir, 100_000, **flags)
  _when_logged(workdir, 3, procs)
  if fault == "sigint":
    # Step 3 logged says nothing of checkpoint 2's save, which runs beside the steps: a signal
    # sent before it completes leaves no checkpoint to resume from.
    _when_saved(workdir, 2, procs)
    procs[failing].send_signal(signal.SIGINT)
  start = time.monotonic()
  outputs = _wait(procs, timeout=max(HEARTBEAT_S, STEP_TIMEOUT_S) + 30)
  assert time.monotonic() - start < (STEP_TIMEOUT_S if fault == "loader_hang" else
                                     HEARTBEAT_S) + 30
  resume_at = checkpoint_layout.resume_step(str(workdir))
  assert resume_at is not None and resume_at >= 2
  for i, (p, out) in enumerate(zip(procs, outputs)):
    last = _lines(out)[-1]
    assert "Check failure stack trace" not in out, out[-3000:]  # no JAX abort
    if i == failing:
      assert p.returncode == status, out[-3000:]
      assert re.match(own_line, last), out[-3000:]
    else:
      assert p.returncode == 1, out[-3000:]
      assert last.startswith(f"error: process {failing} (host "), out[-3000:]
      assert f" of 2 failed: " in last and f"process {i} stops too" in last, last
      assert error in last, last
    if fault not in ("disk_full", "config_error") or i != failing:
      assert resume_at in _resume_steps_named(last), (last, resume_at)
  if fault == "loader_error":  # anything but a user's error shows its traceback first
    assert "Traceback (most recent call last)" in outputs[failing], outputs[failing][-3000:]
  if fault == "loader_hang":  # every thread's stack went to the log first: the main thread's
    # and the peer watch's at least
    assert outputs[failing].count("(most recent call first)") >= 2, outputs[failing][-3000:]
  if (fault, failing) == ("disk_full", 1):
    # Process 1's part of checkpoint 4 failed: both resume from checkpoint 2 and end as an
    # uninterrupted run.
    assert resume_at == 2
    _succeeds(_launch(workdir, 8, checkpoint_every=2))
    _matches_reference(workdir, reference)


# What JAX's client prints, in every process but 0, once process 0 and the coordination service
# it serves are gone (jax 0.10), and what it says of the service.
JAX_ABORT = "Terminating process because the JAX distributed service detected fatal errors"
SERVICE_GONE = "Failed to send RPC to coordination service"


def test_a_killed_coordinator_ends_the_others_and_the_run_resumes_past_a_damaged_shard(
    reference, tmp_path):
  """SIGKILL of process 0 takes JAX's coordination service with it: the other process's JAX
  client aborts at once (SIGABRT, exit status 134 in a shell), and nothing public in JAX keeps
  it alive (docs/failures.md). What the project keeps: JAX's line and its C++ stack are the end
  of the output, with faulthandler's two lines and no Python stack of every thread after them.
  The peer watch can read the lost service in the same instant as JAX's abort starts; the
  process then ends first, with exit 1 and the project's line last (seen on 2 busy cores,
  after JAX's line). Either way the last complete checkpoint restores, and the same command
  resumes (process 0's lock, left by a killed process, is taken over).

  The one resume also shows a shard only one process reads damaged for all: under FSDP and
  tensor sharding each process reads its own chunks, so a truncated file of process 1's, in
  the checkpoint the kill left, fails its read alone. Both set that checkpoint aside together
  and go back to the one before, ending as an uninterrupted run."""
  workdir = tmp_path / "run"
  procs = _launch(workdir, 100_000, heartbeat_timeout=HEARTBEAT_S, checkpoint_every=2)
  _when_logged(workdir, 5, procs)
  _when_saved(workdir, 4, procs)  # two complete checkpoints: one to damage, one before it
  procs[0].send_signal(signal.SIGKILL)
  try:
    (output,) = _wait([procs[1]], timeout=HEARTBEAT_S + 30)
  finally:
    procs[0].wait()
  lines = _lines(output)
  if procs[1].returncode == 1:  # the peer watch ended the process before JAX's abort did
    assert re.fullmatch(r"error: process 0 of 2 was lost: the coordination service at process "
                        r"0 cannot be reached \(.*\); process 1 stops too; the next run "
                        r"resumes from checkpoint \d+ \(the same command on every host\)",
                        lines[-1]), output[-3000:]
  else:
    assert procs[1].returncode == -signal.SIGABRT, output[-3000:]
    (fatal,) = [i for i, l in enumerate(lines) if JAX_ABORT in l]
    assert SERVICE_GONE in lines[fatal], lines[fatal]
    assert "*** Check failure stack trace: ***" in lines[fatal:], output[-3000:]
    assert lines[-2] == "Fatal Python error: Aborted", output[-3000:]
    assert lines[-1].startswith("Extension modules: "), output[-3000:]
  assert "(most recent call first)" not in output, output[-3000:]  # no thread's Python stack
  damaged = checkpoint_layout.resume_step(str(workdir))
  assert damaged is not None and damaged >= 4
  stored = checkpoint.Checkpointer(str(workdir), read_only=True)
  previous = [s for s in stored.steps() if s < damaged][-1]
  assert stored.restore_params(damaged)  # what the kill left restores, both processes' shards

  # The damaged shard.
  aside_folder = workdir / "checkpoints-set-aside"
  set_aside = set(aside_folder.iterdir()) if aside_folder.exists() else set()
  shards = list((workdir / "checkpoints" / str(damaged) / "params" / "ocdbt.process_1" /
                 "d").iterdir())
  assert shards
  for shard in shards:
    shard.write_bytes(shard.read_bytes()[:10])
  procs = _launch(workdir, damaged + 3, checkpoint_every=2, heartbeat_timeout=HEARTBEAT_S)
  for i, (p, out) in enumerate(zip(procs, _wait(procs))):
    assert p.returncode == 0, out[-3000:]
    (warning,) = [l for l in _lines(out) if "cannot be restored" in l]
    assert f"checkpoint {damaged} cannot be restored (process 1: " in warning, warning
    # Both went back, past the lock the killed process left.
    assert f"process {i}/2: resumed at step {previous}" in _lines(out), out[-3000:]
  (aside,) = set(aside_folder.iterdir()) - set_aside
  assert aside.name.startswith(f"{damaged}-")
  _matches_reference(workdir, reference)


def test_a_stuck_step_in_a_single_process_ends_it_with_its_stacks_and_one_line(tmp_path):
  workdir = tmp_path / "run"
  (proc,) = _launch(workdir, 100_000, processes=1, checkpoint_every=2, fault="loader_hang",
                    fault_process=0, fault_step=4, step_timeout=SINGLE_STEP_TIMEOUT_S)
  (output,) = _wait([proc], timeout=SINGLE_STEP_TIMEOUT_S + 60)
  assert proc.returncode == 1, output[-3000:]
  assert output.count("(most recent call first)") >= 2, output[-3000:]
  assert re.fullmatch(rf"error: training is stuck: no training step completed for "
                      rf"{SINGLE_STEP_TIMEOUT_S} s \(config.step_timeout_seconds\); its main "
                      r"thread waits in __next__ \(tests/multihost_driver.py:\d+\); the next run "
                      r"resumes from checkpoint 4", _lines(output)[-1]), output[-3000:]
  assert checkpoint_layout.resume_step(str(workdir)) == 4


def test_the_step_clock_leaves_out_the_first_step_and_evaluation(capfd, monkeypatch):
  """A stuck step is measured between training steps only: not before the first step has
  completed (it compiles), nor inside `not_stepping` (dev-set evaluation, decoding), after
  which the clock starts again."""
  clock = [1000.0]  # the watch's clock, moved by the test alone
  monkeypatch.setattr(peer_watch, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
  timeout = 0.5
  watch = peer_watch.PeerWatch(timeout=100, step_timeout=timeout)
  watch.me, watch.count, watch._client = 0, 1, None
  watch._main = threading.main_thread()
  ended = []
  watch._end = lambda processes, what: ended.append(what)
  clock[0] += 2 * timeout
  watch._check_steps()
  assert not ended  # the first step, still compiling
  watch.step_done()
  with watch.not_stepping():
    clock[0] += 2 * timeout
    watch._check_steps()
  assert not ended  # evaluating
  watch._check_steps()
  assert not ended  # the clock started again when evaluation ended
  clock[0] += 2 * timeout
  watch._check_steps()
  assert len(ended) == 1 and ended[0].startswith(
      f"is stuck: no training step completed for {timeout:g} s"), ended
  assert "(most recent call first)" in capfd.readouterr().err


class _Store:
  """The coordination store's calls a failing process makes, recorded."""

  def __init__(self):
    self.written = []

  def key_value_set(self, key, value, allow_overwrite=False):
    self.written.append(key)


@pytest.mark.parametrize("error", [jax.errors.JaxRuntimeError("a collective failed"),
                                   ConfigError("/data/train.de line 7: invalid UTF-8")],
                         ids=["a collective broken by the peer", "an error of its own"])
def test_an_error_after_the_watch_has_ended_the_run_says_nothing_after_its_line(caplog, capfd,
                                                                               error):
  """The watch has found another process failed, printed its line and is ending this process
  (`_end` stops the watch first); an error reaching the main thread meanwhile adds no line
  after it and tells the store nothing: it waits for the end (seen once in a whole-suite run:
  process 0's warning about a broken collective printed after the watch's line)."""
  watch = peer_watch.PeerWatch(timeout=0.3)
  watch.me, watch.count, watch.interval = 0, 2, 0.01
  watch._client = store = _Store()
  watch._stop.set()  # as `_end` does before it prints
  start = time.monotonic()
  with caplog.at_level(logging.INFO):
    watch.fail(error)
  assert time.monotonic() - start >= watch.timeout  # waited for the watch to end the process
  assert not caplog.records and not capfd.readouterr().err
  assert not store.written and watch.failed_alone() is None


class _StoreOfAGoneCoordinator(_Store):
  """What a process other than 0 meets once it has marked that it is leaving: process 0 may
  go at once, and JAX's client then reports it on the process's output."""

  def key_value_set(self, key, value, allow_overwrite=False):
    super().key_value_set(key, value)
    os.write(2, b"F client.h:80] Terminating process because the JAX distributed service "
                b"detected fatal errors.\n")
    os.write(1, b"stdout after the line\n")


def test_a_leaving_process_prints_nothing_after_its_line(capfd, monkeypatch):
  """Its line printed, a failing process's output goes nowhere before it tells process 0 it
  is leaving (seen once in a whole-suite run: a stuck process's line followed by JAX's
  report that process 0 had gone)."""
  watch = peer_watch.PeerWatch(timeout=0.3)
  watch.me, watch.count, watch._prefix = 1, 2, "watch"
  watch._client = store = _StoreOfAGoneCoordinator()
  exits = []
  monkeypatch.setattr(peer_watch.os, "_exit", exits.append)
  line = "error: process 1 of 2 is stuck: no training step completed for 6 s"
  print(line, file=sys.stderr, flush=True)
  watch._leave(1)
  assert exits == [1] and store.written == ["watch/left/1"]
  out, err = capfd.readouterr()
  assert err.splitlines()[-1] == line and not out, (out, err)


class _StoreOfLeavingPeers(_Store):
  """Process 0's store, where process 1's mark that it is leaving appears on the third read."""

  def __init__(self, events):
    super().__init__()
    self.events, self.reads = events, 0

  def key_value_dir_get(self, prefix):
    self.reads += 1
    if self.reads < 3:
      return []
    self.events.append("mark read")
    return [(f"{prefix}left/1", "1")]


def test_process_0_leaves_last_and_stays_a_grace_after_the_others_marks(monkeypatch):
  """The other side of the ending: process 0, whose going takes the store with it, exits
  only once every other process has marked that it is leaving, and `_GRACE_S` after that,
  the time their exits take on busy cores."""
  events, clock = [], [0.0]

  def sleep(seconds):
    clock[0] += seconds
    events.append(seconds)

  monkeypatch.setattr(peer_watch, "time",
                      types.SimpleNamespace(monotonic=lambda: clock[0], sleep=sleep))
  monkeypatch.setattr(peer_watch, "_silence_output", lambda: None)
  monkeypatch.setattr(peer_watch.os, "_exit", lambda status: events.append(f"exit {status}"))
  watch = peer_watch.PeerWatch(timeout=5)
  watch.me, watch.count, watch._prefix = 0, 2, "watch"
  watch._client = _StoreOfLeavingPeers(events)
  watch._leave(1)
  assert events[-3:] == ["mark read", peer_watch._GRACE_S, "exit 1"], events
  assert watch._client.written == []  # process 0 marks nothing: it holds the store
