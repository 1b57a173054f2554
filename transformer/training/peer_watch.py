"""A multi-process run stops as one when a process is lost (killed, its host down or hung).

The other processes would otherwise wait in their next collective: on GPUs (NCCL) for ever,
on CPUs (gloo) until an error, after which JAX's shutdown waits for the lost process too.
JAX's coordination service ends every process once one has missed its heartbeats for
`heartbeat_timeout_seconds`, with a C++ abort and pages of logs that do not say which
process was lost.

`PeerWatch`, open around training, says it in one line first: every process writes a beat
into the coordination service's key-value store every `timeout / 10` seconds and reads the
others'. A process whose beat has not moved for `timeout` seconds (or the coordinator,
process 0, when the store cannot be reached) is lost: each remaining process prints

  error: process 1 of 2 (host node-17) was lost: nothing from it for 100 s; ...

and ends with exit status 1 (`os._exit`: its main thread may be blocked in a collective for
good). `distributed.initialize` gives JAX's own heartbeat timeout a margin beyond `timeout`,
so JAX ends the processes should the watch itself be unable to.

A process that leaves the watch normally, or stops on a signal, marks itself finished first,
so the others do not take its end for a loss. One that leaves it with an error first gives
the watch time to name a lost process (a collective that failed because a peer is gone),
then raises the error as it is.
"""

from __future__ import annotations

import itertools
import os
import socket
import sys
import threading
import time
from typing import Callable

import jax
from absl import logging

from transformer import errors

EXIT_STATUS = 1
# What every process raises together on purpose: no process was lost.
_DELIBERATE = (errors.ConfigError, errors.Stopped, errors.Diverged, errors.DiskFull,
               KeyboardInterrupt)
_PREFIX = "transformer/peer_watch"
_opened = itertools.count()  # each process opens its watches in the same order


def _client():
  """JAX's coordination-service client, or None in a single-process run."""
  from jax._src import distributed  # the client JAX's own multihost utilities use

  return distributed.global_state.client


class PeerWatch:
  """Around the part of a multi-process run in which all processes work together (a no-op in
  a single process).

  Args:
    timeout: seconds without a beat after which a process is lost.
    on_lost: called when a process is lost, before this one ends: tidies up (a lock file) and
      returns the end of the line (e.g. which checkpoint the next run resumes from).
  """

  def __init__(self, timeout: float, on_lost: Callable[[], str] = lambda: ""):
    self.timeout, self.on_lost = float(timeout), on_lost
    self.interval = min(max(self.timeout / 10, 0.2), 10.0)
    self._stop = threading.Event()
    self._ending = threading.Lock()
    self._rounds = 0  # rounds of reading the beats, completed
    self._round_done = threading.Condition()
    self._thread: threading.Thread | None = None

  def __enter__(self) -> "PeerWatch":
    self._client = _client() if jax.process_count() > 1 else None
    if self._client is None:
      return self
    self.me, self.count = jax.process_index(), jax.process_count()
    self._prefix = f"{_PREFIX}/{next(_opened)}"
    self._client.key_value_set(f"{self._prefix}/host/{self.me}", socket.gethostname())
    self._last_round = time.monotonic()
    self._thread = threading.Thread(target=self._watch, name="peer-watch", daemon=True)
    self._thread.start()
    threading.Thread(target=self._deadline, name="peer-watch-deadline", daemon=True).start()
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if self._thread is None:
      return
    if exc is not None and not isinstance(exc, _DELIBERATE):
      # A collective that failed because a process was lost: the watch names it (and ends
      # this process) within the timeout; any other error is raised as it is after that.
      logging.warning("%s: waiting up to %g s to learn whether a process was lost",
                      exc_type.__name__, self.timeout)
      self._wait_rounds(after=time.monotonic() + self.timeout)
    try:
      self._client.key_value_set(f"{self._prefix}/finished/{self.me}", "1")
    except Exception:  # the coordinator is gone: nobody is left to mislead
      pass
    self._stop.set()

  def _wait_rounds(self, after: float) -> None:
    """Waits until the watch has read the beats once after time `after` (or has stopped)."""
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
      if self._stop.wait(self.interval if beat else 0):
        return
      try:
        self._client.key_value_set(f"{self._prefix}/beat/{self.me}", str(beat),
                                   allow_overwrite=True)
        beats = dict(self._client.key_value_dir_get(f"{self._prefix}/beat/"))
      except Exception as e:  # the store is process 0's: it cannot be reached
        if not self._stop.is_set():
          self._lost([0], f"the coordination service at process 0 cannot be reached "
                          f"({str(e).strip().splitlines()[0][:120]})")
        return
      now = time.monotonic()
      for p in range(self.count):
        value = beats.get(f"{self._prefix}/beat/{p}")
        if value is not None and value != last_beat.get(p):
          last_beat[p], last_change[p] = value, now
      silent = [p for p in range(self.count) if p != self.me
                and now - last_change[p] > self.timeout and not self._finished(p)]
      if silent and not self._stop.is_set():
        self._lost(silent, f"nothing from it for {self.timeout:g} s")
      with self._round_done:
        self._rounds += 1
        self._last_round = time.monotonic()
        self._round_done.notify_all()

  def _deadline(self) -> None:
    """Ends the run when the store stops answering (process 0 hung: its calls then block)."""
    while not self._stop.wait(self.interval):
      if time.monotonic() - self._last_round > self.timeout + 2 * self.interval:
        self._lost([0], f"the coordination service at process 0 has not answered for "
                        f"{self.timeout:g} s")

  def _finished(self, process: int) -> bool:
    try:
      return bool(self._client.key_value_try_get(f"{self._prefix}/finished/{process}"))
    except Exception:  # not set
      return False

  def _host(self, process: int) -> str:
    try:
      return f" (host {self._client.key_value_try_get(f'{self._prefix}/host/{process}')})"
    except Exception:
      return ""

  def _lost(self, processes: list[int], why: str) -> None:
    """Prints the one line naming the lost processes and ends this one."""
    with self._ending:  # once, from whichever thread finds it first
      if self._stop.is_set():
        return
      # The store is process 0's: while process 0 is the one lost, it cannot be asked.
      names = ", ".join(f"process {p}{self._host(p) if p else ''}" for p in processes)
      hint = self.on_lost()
      print(f"error: {names} of {self.count} {'was' if len(processes) == 1 else 'were'} "
            f"lost: {why}; process {self.me} stops too{'; ' + hint if hint else ''}",
            file=sys.stderr, flush=True)
      logging.flush()
      os._exit(EXIT_STATUS)
