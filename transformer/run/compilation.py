"""Compilation out of the way: programs kept on disk, compiled ahead and in parallel, measured.

Compilation is a large share of a short run's wall time (a program per batch shape for
training, per batch shape and beam size for decoding), and a sweep of many runs, a resumed
run or a later `evaluate.py` compile the same programs again.
- `persistent_cache`: while training or evaluating, JAX keeps compiled programs in a folder,
  keyed by the program and the compiler settings, for `config.compilation_cache_dir`
  (default `~/.cache/transformer-xla`, shared by all workdirs; '' turns it off). A cache the
  caller chose (`JAX_COMPILATION_CACHE_DIR`, or jax.config's) takes precedence.
- `compile_ahead`: every program a loop will need, compiled before it starts, several at once
  (`steps.compile_batch_shapes` does this for the bucket shapes).
- `CompileMonitor`: the wall time spent compiling (or reading the cache) and the cache's hits
  and misses, for benchmarks and tests.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import os
import threading
import time
from typing import Callable, Iterator, Sequence

import jax
from jax.experimental.compilation_cache import compilation_cache as jax_cache
from absl import logging

from transformer.run import writable

# What train_lib logs once it has compiled the training and dev programs ahead of step 1 (in
# `compiled 22 programs (train and dev batch shapes) in 80.6 s`): a sweep reads it in a run's
# train.log to start the other seeds of its row (research/launch.py).
COMPILED_AHEAD = "programs (train and dev batch shapes)"


@contextlib.contextmanager
def persistent_cache(directory: str) -> Iterator[str | None]:
  """Within the block, JAX keeps compiled programs in `directory` (created if needed); yields
  the folder in use.

  A cache the caller chose is never overridden: with JAX_COMPILATION_CACHE_DIR in the
  environment, or `jax_compilation_cache_dir` set in jax.config before the block, that folder
  is used as it is. Otherwise the setting is put back as it was on leaving, and JAX's cache
  is reset on entry and exit so that compilations outside the block follow the caller's
  setting, not this one.

  Args:
    directory: the cache folder (`~` is expanded), or '' for no cache.

  Yields:
    The folder JAX caches in, or None when caching is off or the folder cannot be written
    (one warning; the run goes on compiling as usual).
  """
  chosen = jax.config.jax_compilation_cache_dir  # the environment's, or the caller's
  if chosen or not directory:
    yield chosen or None
    return
  directory = os.path.abspath(os.path.expanduser(directory))
  reason = writable.cannot_write(directory)
  if reason is not None:
    logging.warning("compilation cache %s cannot be written (%s): compiling without it; set "
                    "--config.compilation_cache_dir to a writable folder, or '' to silence "
                    "this", directory, reason)
    yield None
    return
  jax_cache.reset_cache()
  jax.config.update("jax_compilation_cache_dir", directory)
  try:
    yield directory
  finally:
    jax.config.update("jax_compilation_cache_dir", chosen)
    jax_cache.reset_cache()


def compile_ahead(calls: Sequence[tuple[Callable, tuple]]) -> list:
  """Compiles each `(jitted function, arguments)` before its first call, several at a time.

  The arguments may be arrays or `jax.ShapeDtypeStruct`s; a later call of the function on
  arguments of the same shapes, types and shardings runs the program compiled here (JAX keeps
  it in memory, and in the persistent cache when that is on). Tracing and lowering hold the
  GIL and run here one after another (in a fixed order, so each program's text, and so its
  persistent-cache key, is the same in every run); XLA releases the GIL while it compiles, so
  the programs then compile side by side, one per CPU core.

  Args:
    calls: `(jitted, args)` pairs; `jitted` has `.lower(*args)` (`jax.jit`, `jax.pmap`).

  Returns:
    The compiled executables, in the order of `calls`.
  """
  if not calls:
    return []
  lowered = [fn.lower(*args) for fn, args in calls]
  workers = min(len(calls), os.cpu_count() or 1)
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    return list(pool.map(lambda program: program.compile(), lowered))


_SPAN_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                "/jax/core/compile/jaxpr_to_mlir_module_duration",
                "/jax/core/compile/backend_compile_duration")
_CACHE_EVENTS = {"/jax/compilation_cache/cache_hits": "hits",
                 "/jax/compilation_cache/cache_misses": "misses"}


class _Recorder:
  """The `jax.monitoring` listeners that feed the open `CompileMonitor`s: one pair for the
  process however many monitors are open or were ever made, registered when a monitor opens
  and removed when the last open one closes (where jax can remove them; older releases keep
  them, idle, and they are never registered twice). Each event goes to the monitors open at
  that moment, so nothing is kept for a process that is not measuring."""

  def __init__(self):
    self.lock = threading.Lock()
    self.open: set[CompileMonitor] = set()
    self.registered = False

  def attach(self, monitor: "CompileMonitor") -> None:
    with self.lock:
      if not self.registered:
        jax.monitoring.register_event_time_span_listener(self._on_span)
        jax.monitoring.register_event_listener(self._on_event)
        self.registered = True
      self.open.add(monitor)

  def detach(self, monitor: "CompileMonitor") -> None:
    with self.lock:
      self.open.discard(monitor)
      if self.open or not hasattr(jax.monitoring, "unregister_event_listener"):
        return
      try:
        jax.monitoring.unregister_event_time_span_listener(self._on_span)
        jax.monitoring.unregister_event_listener(self._on_event)
      except (AssertionError, ValueError):  # removed already (jax.monitoring.clear_...)
        pass
      self.registered = False

  def _on_span(self, event: str, start: float, end: float, **kwargs) -> None:
    if event in _SPAN_EVENTS:
      with self.lock:
        for monitor in self.open:
          monitor.spans.append((start, end))

  def _on_event(self, event: str, **kwargs) -> None:
    if event in _CACHE_EVENTS:
      with self.lock:
        for monitor in self.open:
          monitor.cache[_CACHE_EVENTS[event]] += 1


_recorder = _Recorder()


class CompileMonitor:
  """What JAX spends on compilation while open: wall time and persistent-cache hits/misses.

  Compilation here is tracing, lowering and XLA compilation, or reading a compiled program
  from the persistent cache (`jax.monitoring` events). Spans that overlap (programs compiled
  in parallel) count once, so `seconds` is wall time. The figures stay readable after the
  monitor closes; only what happened while it was open counts.
  """

  def __init__(self):
    self.spans: list[tuple[float, float]] = []  # (start, end) in time.time() seconds
    self.cache = {"hits": 0, "misses": 0}
    self.start, self.end = math.inf, -math.inf

  def __enter__(self) -> "CompileMonitor":
    self.start, self.end = time.time(), math.inf
    _recorder.attach(self)
    return self

  def __exit__(self, *exc) -> None:
    _recorder.detach(self)
    self.end = time.time()

  @property
  def cache_hits(self) -> int:
    return self.cache["hits"]

  @property
  def cache_misses(self) -> int:
    return self.cache["misses"]

  def seconds(self, start: float = -math.inf, end: float = math.inf) -> float:
    """Wall seconds within [start, end] (time.time()) of the monitor's window during which
    something compiled."""
    start, end = max(start, self.start), min(end, self.end)
    with _recorder.lock:
      spans = sorted(self.spans)
    total, reach = 0.0, start
    for a, b in spans:
      a, b = max(a, reach), min(b, end)
      if b > a:
        total += b - a
        reach = b
    return total
