"""A multi-process run ends as one: a process that fails, is lost or is stuck ends them all.

The processes of a run wait for each other in every collective: on GPUs (NCCL) for ever, on
CPUs (gloo) until an error, after which JAX's shutdown waits for the missing process too, and
JAX's coordination service ends everything once a process has missed its heartbeats, with a
C++ abort and pages of logs that say nothing of what happened. A fault is rarely one that
every process meets together: only process 0 writes metrics, each process writes its own
checkpoint shards and reads its own data, and Ctrl-C reaches one terminal.

`PeerWatch`, open around training, turns each into one line on every process. A thread writes
a beat into the coordination service's key-value store every `timeout / 10` seconds and reads
what the others wrote there:

- **A process fails.** Any exception leaving the run, other than an agreed stop (preemption,
  a non-finite loss that every process sees), is published as `failed/<process>` with one
  line (`describe`) before the process does anything that could wait for the others. The
  others see it within a tenth of the timeout, print

    error: process 1 of 2 (host node-17) failed: No space left on device while writing ...;
    process 0 stops too; the next run resumes from checkpoint 3000 (the same command on every
    host)

  and exit with status 1. The failed process leaves with its own line: the watch hands its
  failure on as `errors.FailedAlone` (`failed_alone`), which the launcher (`cli.run`) prints
  and ends the process with.
- **A process is lost** (killed, its host down, or hung so that even its beats stop): a
  process whose beat has not moved for `timeout` seconds, or the coordinator when the store
  cannot be reached, is named the same way ("was lost: nothing from it for 100 s").
- **A step is stuck** (`step_timeout`, any number of processes): when no training step has
  completed for that long, outside the parts of the run that are not steps (the first step,
  which compiles, evaluation and decoding: `not_stepping`), every thread's Python stack goes
  to stderr (`faulthandler`), the process publishes its failure naming where its main thread
  waits, and exits 1 with one line. A process whose main thread waits on the devices (for
  another process, in a collective) gives the others a few rounds (at least 5 s) more to say
  they are stuck, and then names that one instead.

Every process that ends this way leaves with `os._exit`, past JAX's shutdown barrier, which
would wait minutes for the processes that are already gone (`errors.FailedAlone.leave`), and
process 0 last: it serves the store, and the other processes' JAX clients abort the moment it
is gone, before they could print their line. `distributed.initialize` gives JAX's own
heartbeat timeout a margin beyond `timeout`, so JAX ends the processes should the watch
itself be unable to.
"""

from __future__ import annotations

import contextlib
import faulthandler
import itertools
import os
import socket
import sys
import threading
import time
from typing import Callable, Iterator

import jax
from absl import logging

from transformer import errors
from transformer.run import coordination
from transformer.training import thread_stacks

EXIT_STATUS = 1
# What every process raises together on purpose: nobody failed alone.
_AGREED = (errors.Stopped, errors.Diverged)
# What a process says of its own failure in one line: the message alone.
_ONE_LINE_ERRORS = (errors.ConfigError, errors.DiskFull, FileNotFoundError)
_PREFIX = "transformer/peer_watch"
_opened = itertools.count()  # each process opens its watches in the same order
# How long process 0, the last to leave, stays after every other process has marked that it
# is leaving: their exits follow their marks at once, but a busy core can hold one back.
_GRACE_S = 0.5
# The least a process waiting on the devices gives the others, past its own step timeout, to
# say that they are stuck (`_others_grace`).
_OTHERS_GRACE_S = 5.0


def _silence_output() -> None:
  """Points this process's standard output and error at /dev/null, once what it has
  written is flushed: its last line is printed."""
  sys.stdout.flush()
  sys.stderr.flush()
  devnull = os.open(os.devnull, os.O_WRONLY)
  for fd in (1, 2):
    os.dup2(devnull, fd)


def describe(exc: BaseException) -> str:
  """One line for the failure `exc`: its message where it is written for a user, else its
  type and the first line of its message."""
  if isinstance(exc, KeyboardInterrupt):
    return "interrupted (SIGINT)"
  text = (str(exc).strip().splitlines() or [""])[0][:300]
  return text if isinstance(exc, _ONE_LINE_ERRORS) and text else (
      f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


class PeerWatch:
  """Around the part of a multi-process run in which all processes work together; in a
  single process it only watches the step clock (and only when `step_timeout` > 0).

  Args:
    timeout: seconds without a beat after which a process is lost.
    on_end: called when this process is about to end because of a lost, failed or stuck
      process: tidies up (a lock file) and returns the end of the line (e.g. which
      checkpoint the next run resumes from).
    step_timeout: seconds without a completed training step after which the run is stuck
      (0: never).
  """

  def __init__(self, timeout: float, on_end: Callable[[], str] = lambda: "",
               step_timeout: float = 0):
    self.timeout, self.on_end, self.step_timeout = float(timeout), on_end, float(step_timeout)
    self.interval = min(max(self.timeout / 10, 0.2), 10.0)
    if self.step_timeout:
      self.interval = min(self.interval, max(self.step_timeout / 10, 0.2))
    self._stop = threading.Event()
    self._ending = threading.Lock()
    self._rounds = 0  # rounds of reading the store, completed
    self._round_done = threading.Condition()
    self._thread: threading.Thread | None = None
    self._client = None
    self._failed = False  # this process published its failure
    self._line = ""  # what it published
    self._lost: list[int] = []  # processes found lost: they never leave
    # The step clock: armed once the first step completes; paused while not stepping.
    self._last_step: float | None = None
    self._paused = 0

  # -- the main thread's side ----------------------------------------------------------------

  def __enter__(self) -> "PeerWatch":
    self.me, self.count = jax.process_index(), jax.process_count()
    self._client = coordination.client()
    if self._client is None and not self.step_timeout:
      return self
    self._main = threading.current_thread()
    self._last_round = time.monotonic()
    if self._client is not None:
      self._prefix = f"{_PREFIX}/{next(_opened)}"
      self._client.key_value_set(f"{self._prefix}/host/{self.me}", socket.gethostname())
      threading.Thread(target=self._deadline, name="peer-watch-deadline", daemon=True).start()
    self._thread = threading.Thread(target=self._watch, name="peer-watch", daemon=True)
    self._thread.start()
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if self._thread is None:
      return
    if exc is not None and not isinstance(exc, _AGREED):
      self.fail(exc)
    elif self._client is not None:
      try:
        self._client.key_value_set(f"{self._prefix}/finished/{self.me}", "1")
      except Exception:  # the coordinator is gone: nobody is left to mislead
        pass
    self._stop.set()

  def step_done(self) -> None:
    """Called after every training step: the step clock starts again."""
    self._last_step = time.monotonic()

  def steps_over(self) -> None:
    """Called when the last step has completed: the step clock stops for good."""
    self._last_step = None

  @contextlib.contextmanager
  def not_stepping(self) -> Iterator[None]:
    """Around work that is not a training step (evaluation, decoding, compiling): the step
    clock stops meanwhile and starts again after it."""
    self._paused += 1
    try:
      yield
    finally:
      self._paused -= 1
      if self._last_step is not None:
        self._last_step = time.monotonic()

  @contextlib.contextmanager
  def failing_together(self) -> Iterator[None]:
    """Around the training loop: an exception leaving it is published at once, before the
    contexts around it (a checkpoint save to finish, say) wait on anything."""
    try:
      yield
    except BaseException as e:
      if not isinstance(e, _AGREED):
        self.fail(e)
      raise

  def fail(self, exc: BaseException) -> None:
    """Tells the other processes that this one fails with `exc` (once), and waits until they
    have read it; the caller then raises `exc` as it is."""
    if self._client is None or self._failed:
      return
    with self._ending:  # `_end` takes it too: nothing said here can follow the watch's line
      ended = self._stop.is_set()
      if not ended and isinstance(exc, jax.errors.JaxRuntimeError):
        logging.warning("%s: waiting up to %g s to learn whether another process failed or "
                        "was lost", type(exc).__name__, self.timeout)
    if ended:
      # The watch has found another process failed or lost (this error most likely follows
      # from it), printed its line and is ending this process: its line stays the last one.
      time.sleep(self.timeout + 10 * self.interval)  # it leaves within the timeout
      return
    if isinstance(exc, jax.errors.JaxRuntimeError):
      # A collective that failed because a process failed or was lost: the watch names it
      # (and ends this process) within the timeout; a failure of this process's own after.
      self._wait_rounds(after=time.monotonic() + self.timeout)
    self._publish_failure(describe(exc))

  def failed_alone(self) -> errors.FailedAlone | None:
    """None, or once this process has told the others that it failed (`fail`), that failure
    to raise: its line (what it told them, and what follows) and the way out at once."""
    if not self._failed:
      return None
    hint = self.on_end()
    return errors.FailedAlone(f"process {self.me} of {self.count} failed: {self._line}; every "
                              f"process of the run stops{'; ' + hint if hint else ''}",
                              self._leave)

  # -- the watch thread ----------------------------------------------------------------------

  def _publish_failure(self, line: str) -> None:
    with self._ending:
      if self._stop.is_set() or self._failed:
        return
      self._failed, self._line = True, line
    try:
      self._client.key_value_set(f"{self._prefix}/failed/{self.me}", line)
    except Exception:  # the coordinator is gone: the others end on their own
      pass

  def _leave(self, status: int) -> None:
    """Ends this process with `status`, once it has said why. Process 0 holds the store and
    goes last: the others' JAX clients abort the moment it is gone, before they could say
    anything. So each other process marks that it is leaving, and process 0 waits for that
    (at most `timeout`; a lost process never will), then `_GRACE_S` more for their exits.

    Its line printed, the process prints nothing more: its standard output and error go to
    /dev/null before it tells process 0 it is leaving. Else a process slow to reach its exit
    (on busy cores) printed, after its own line, JAX's client's report that process 0 is gone
    (seen once in a whole-suite run, after a stuck process's line)."""
    logging.flush()
    _silence_output()
    if self._client is not None and 0 not in self._lost:  # a lost process 0: no store
      try:
        if self.me:
          self._client.key_value_set(f"{self._prefix}/left/{self.me}", "1")
        else:
          self._wait_for_others_to_leave()
      except Exception:  # the store is gone
        pass
    os._exit(status)

  def _wait_for_others_to_leave(self) -> None:
    deadline = time.monotonic() + self.timeout
    others = set(range(1, self.count)) - set(self._lost)
    while time.monotonic() < deadline:
      keys = self._client.key_value_dir_get(f"{self._prefix}/")
      gone = {int(k.rsplit("/", 1)[1]) for k, _ in keys
              if k.startswith((f"{self._prefix}/left/", f"{self._prefix}/finished/"))}
      if gone >= others:
        time.sleep(_GRACE_S)  # from their mark to their exit
        return
      time.sleep(0.02)

  def _wait_rounds(self, after: float) -> None:
    """Waits until the watch has read the store once after time `after` (or has stopped)."""
    with self._round_done:
      target = None
      while self._thread.is_alive() and not self._stop.is_set():
        if target is None and time.monotonic() >= after:
          target = self._rounds + 2  # one that began after `after`
        if target is not None and self._rounds >= target:
          return
        self._round_done.wait(self.interval)

  def _watch(self) -> None:
    last_beat: dict[int, str] = {}
    last_change = {p: time.monotonic() for p in range(self.count)}
    for beat in itertools.count():
      if self._stop.wait(self.interval if beat else 0) or self._failed:
        return
      if self._client is not None and not self._read_peers(beat, last_beat, last_change):
        return
      self._check_steps()
      with self._round_done:
        self._rounds += 1
        self._last_round = time.monotonic()
        self._round_done.notify_all()

  def _read_peers(self, beat: int, last_beat: dict, last_change: dict) -> bool:
    """One round: beats, then whether another process failed or fell silent; False once the
    watch is over."""
    try:
      self._client.key_value_set(f"{self._prefix}/beat/{self.me}", str(beat),
                                 allow_overwrite=True)
      keys = dict(self._client.key_value_dir_get(f"{self._prefix}/"))
    except Exception as e:  # the store is process 0's: it cannot be reached
      if not self._stop.is_set() and not self._failed:
        self._end([0], f"was lost: the coordination service at process 0 cannot be reached "
                       f"({str(e).strip().splitlines()[0][:120]})")
      return False
    failed = {int(k.rsplit("/", 1)[1]): v for k, v in keys.items()
              if k.startswith(f"{self._prefix}/failed/")}
    failed.pop(self.me, None)
    if failed and not self._failed:
      first = min(failed)
      self._end([first], f"failed: {failed[first]}")
      return False
    now = time.monotonic()
    for p in range(self.count):
      value = keys.get(f"{self._prefix}/beat/{p}")
      if value is not None and value != last_beat.get(p):
        last_beat[p], last_change[p] = value, now
    silent = [p for p in range(self.count) if p != self.me
              and now - last_change[p] > self.timeout
              and f"{self._prefix}/finished/{p}" not in keys]
    if silent and not self._stop.is_set():
      self._end(silent, f"{'was' if len(silent) == 1 else 'were'} lost: nothing from "
                        f"{'it' if len(silent) == 1 else 'them'} for {self.timeout:g} s")
      return False
    return True

  def _check_steps(self) -> None:
    """Ends the run when no step has completed for `step_timeout` seconds while stepping."""
    if not self.step_timeout or self._paused or self._last_step is None:
      return
    waited = time.monotonic() - self._last_step
    if waited <= self.step_timeout:
      return
    if (self._client is not None and waited <= self.step_timeout + self._others_grace()
        and thread_stacks.in_jax(self._main)):
      # Waiting on the devices: most likely for another process, stuck in its own work,
      # whose clock ran out first (its last step ended before this one's). It has a few
      # rounds to say so, and this process then names it instead of itself.
      return
    print(f"no training step completed for {waited:.0f} s; the stacks of every thread of "
          f"process {self.me}:", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    line = (f"no training step completed for {self.step_timeout:g} s "
            f"(config.step_timeout_seconds); its main thread waits in "
            f"{thread_stacks.own_frame(self._main)}")
    if self._client is not None:
      self._publish_failure(line)
    self._end([self.me], f"is stuck: {line}")

  def _others_grace(self) -> float:
    """How long past its own step timeout a process waiting on the devices gives the others
    to say they are stuck: three rounds of the watch, and at least `_OTHERS_GRACE_S`, as a
    busy core can hold back the round in which the stuck process publishes."""
    return max(3 * self.interval, _OTHERS_GRACE_S)

  def _deadline(self) -> None:
    """Ends the run when the store stops answering (process 0 hung: its calls then block)."""
    while not self._stop.wait(self.interval) and not self._failed:
      if time.monotonic() - self._last_round > self.timeout + 2 * self.interval:
        self._end([0], f"was lost: the coordination service at process 0 has not answered "
                       f"for {self.timeout:g} s")

  def _host(self, process: int) -> str:
    try:
      return f" (host {self._client.key_value_try_get(f'{self._prefix}/host/{process}')})"
    except Exception:
      return ""

  def _end(self, processes: list[int], what: str) -> None:
    """Prints the one line naming `processes` and `what` happened to them, and ends this
    process with exit status 1."""
    with self._ending:  # once, from whichever thread finds it first
      if self._stop.is_set():
        return
      self._stop.set()
    if processes == [self.me]:
      who = "training" if self.count == 1 else f"process {self.me} of {self.count}"
      also = ""
    else:
      # The store is process 0's: while process 0 is the one lost, it cannot be asked.
      askable = lambda p: p != 0 or what.startswith("failed")
      who = ", ".join(f"process {p}{self._host(p) if askable(p) else ''}" for p in processes)
      who, also = f"{who} of {self.count}", f"; process {self.me} stops too"
    hint = self.on_end()
    print(f"error: {who} {what}{also}{'; ' + hint if hint else ''}", file=sys.stderr,
          flush=True)
    if processes != [self.me]:
      self._lost = [p for p in processes if "failed" not in what]
    self._leave(EXIT_STATUS)
