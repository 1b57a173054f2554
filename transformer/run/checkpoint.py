"""Checkpoints in the workdir through orbax: train state, data-iterator position, metadata.

Layout of a workdir (config.json, the run's config, is `workdir.py`'s):
  checkpoints/<step>/    state (params, optimizer, step), data (iterator state), meta (JSON)

Re-running the same command resumes from the newest checkpoint that restores
(`restore_latest`): one that does not (a truncated file, a missing item, a half-written
folder from a kill during the save) is named in one warning and moved to
`checkpoints-set-aside/`, never deleted. Orbax writes each checkpoint into a temporary folder
and renames it when complete; a trainer removes leftover temporary folders at start.
`average_params` averages the parameters of the last k checkpoints, as the paper does before
evaluation (§6.1).
"""

from __future__ import annotations

import gc
import glob
import logging as std_logging
import os
import shutil
import sys
import time
import warnings
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from transformer.errors import ConfigError


# Orbax saves into `<step>.orbax-checkpoint-tmp` and renames it when the save is complete.
_UNFINISHED = ".orbax-checkpoint-tmp"
# Orbax's messages for a checkpoint of another model (not a damaged one): a leaf of another
# shape, a tree of another structure. Orbax raises a plain ValueError for both, as TensorStore
# does for damaged files, so only the message tells them apart.
_OTHER_MODEL = ("is not compatible with the stored shape", "Structure mismatch")
# How long no orphaned read must have ended before a failed restore is over (seconds), and
# the most it waits for that.
_QUIET_SECONDS, _SETTLE_SECONDS = 0.2, 30.0


def _holds_another_model(e: Exception) -> bool:
  return isinstance(e, ValueError) and any(m in str(e) for m in _OTHER_MODEL)


class _Failure:
  """A failed restore, kept as text: holding the exception would keep its traceback, and with
  it orbax's abandoned reads, alive."""

  def __init__(self, e: Exception):
    self.reason = _first_line(e)
    self.other_model = _holds_another_model(e)


class _QuietOrphanedReads:
  """Around one restore of a step folder: if it fails, the tracebacks of the reads orbax
  abandoned are dropped, and everything else passes as before.

  Orbax reads a checkpoint's arrays concurrently in an event loop of its own, and closes that
  loop as soon as one read fails while the others are still under way. Those others then end
  in tracebacks on stderr: each read completing calls into the closed loop ("Event loop is
  closed", raised in TensorStore's threads), and each abandoned read's error is reported when
  its coroutine is collected (or as asyncio's "exception was never retrieved"). Pages of them
  would follow the one warning that names the damaged checkpoint. While open, this wraps
  `sys.unraisablehook` and filters the `asyncio` logger; a failed restore is reported with
  `fail(e)` inside the block, and on leaving the block the abandoned reads are collected and
  waited for (until none has ended for `_QUIET_SECONDS`) before both are put back as they
  were. The caller must hold no reference to the exception by then (`except ... as e` drops
  its own at the end of the clause).

  What is dropped is recognised by message, as neither has a type of its own: asyncio's
  plain RuntimeError "Event loop is closed", and orbax's read errors (a plain `Exception`)
  whose message names this step's folder (in the TensorStore spec it quotes).
  """

  def __init__(self, step_directory: str):
    self.path = os.path.join(step_directory, "")
    self.failure: _Failure | None = None
    self._last_orphan = 0.0
    self._hook = self._unraisable  # one bound method, to tell whether it is still installed

  def fail(self, e: Exception) -> None:
    """Records that the restore failed with `e` (as text)."""
    self.failure = _Failure(e)

  def _is_orphaned_read(self, exc: BaseException | None) -> bool:
    if exc is None:
      return False
    text = str(exc)
    if (isinstance(exc, RuntimeError) and text == "Event loop is closed") or self.path in text:
      self._last_orphan = time.monotonic()
      return True
    return False

  def _unraisable(self, unraisable) -> None:
    if not self._is_orphaned_read(unraisable.exc_value):
      self._previous_hook(unraisable)

  def filter(self, record: std_logging.LogRecord) -> bool:
    """The `asyncio` logger's filter: drops records of an orphaned read's exception."""
    return not (record.exc_info and self._is_orphaned_read(record.exc_info[1]))

  def __enter__(self) -> "_QuietOrphanedReads":
    self._previous_hook = sys.unraisablehook
    sys.unraisablehook = self._hook
    std_logging.getLogger("asyncio").addFilter(self)
    return self

  def __exit__(self, *exc) -> None:
    try:
      if self.failure is not None:
        self._settle()
    finally:
      std_logging.getLogger("asyncio").removeFilter(self)
      if sys.unraisablehook is self._hook:  # else someone replaced it since: theirs stays
        sys.unraisablehook = self._previous_hook

  def _settle(self) -> None:
    """Collects the abandoned reads (their errors are reported now, not at some later
    collection) and waits until those still under way have ended. The reads orbax never
    started are coroutines, which Python warns about ("never awaited") when collected: those
    warnings are dropped too."""
    with warnings.catch_warnings():
      warnings.filterwarnings("ignore", r"coroutine .* was never awaited", RuntimeWarning)
      gc.collect()
      start = self._last_orphan = time.monotonic()
      while (time.monotonic() - self._last_orphan < _QUIET_SECONDS
             and time.monotonic() - start < _SETTLE_SECONDS):
        time.sleep(_QUIET_SECONDS / 4)
      gc.collect()


def _first_line(e: Exception) -> str:
  """A short reason for a log line: the first line of the message, without TensorStore's
  spec dump."""
  text = str(e).strip().split(" See full TensorStore details")[0]
  return text.splitlines()[0][:200] if text else type(e).__name__


class Checkpointer:
  """An orbax `CheckpointManager` over `<workdir>/checkpoints`, keeping the last `keep`.

  A reader (`read_only=True`: evaluation, reports) creates nothing and removes nothing, so it
  can run beside a trainer that is writing a checkpoint.
  """

  def __init__(self, workdir: str, *, keep: int = 5, read_only: bool = False):
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    if read_only and not os.path.isdir(self.directory):
      raise ConfigError(f"no checkpoint in {self.directory}; train one first: "
                        f"python train.py --config=<config> --workdir={workdir}")
    if not read_only and jax.process_index() == 0:
      self._remove_unfinished()
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only,
                                             read_only=read_only),
        item_names=("state", "data", "meta"))

  def _remove_unfinished(self) -> None:
    """Removes the temporary folders of saves that never completed (a kill mid-save)."""
    for leftover in glob.glob(os.path.join(glob.escape(self.directory), f"*{_UNFINISHED}*")):
      shutil.rmtree(leftover, ignore_errors=True)
      logging.info("removed %s, an unfinished save", leftover)

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, data_state: dict | None, meta: dict) -> None:
    """Saves asynchronously; `wait()` blocks until it is on disk."""
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave(data_state or {}),
        meta=ocp.args.JsonSave(meta)))

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict, dict]:
    """Restores `(state, data_state, meta)`; `abstract_state` gives shapes and shardings."""
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        data=ocp.args.JsonRestore(),
        meta=ocp.args.JsonRestore()))
    return restored.state, restored.data, restored.meta

  def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict, dict] | None:
    """`(step, state, data_state, meta)` of the newest checkpoint that restores with finite
    parameters, or None when there is no checkpoint.

    Each newer one that fails is named in one warning and set aside (moved to
    `checkpoints-set-aside/<step>-<time>`, by process 0).

    Raises:
      ConfigError: when a checkpoint holds another model (shapes or structure differ from
        `abstract_state`), or when none restores.
    """
    failed = []
    for step in reversed(self.steps()):
      with _QuietOrphanedReads(os.path.join(self.directory, str(step))) as quiet:
        try:
          state, data_state, meta = self.restore(step, abstract_state)
          params = state["params"] if isinstance(state, dict) else state.params
          if not all(bool(np.isfinite(x).all()) for x in jax.tree.leaves(params)):
            raise ValueError("its parameters are not all finite")
        except Exception as e:  # orbax, tensorstore and JSON raise many kinds
          quiet.fail(e)
      if quiet.failure is None:
        return step, state, data_state, meta
      reason = quiet.failure.reason
      if quiet.failure.other_model:
        raise ConfigError(f"checkpoint {step} in {self.directory} holds a model of another "
                          f"shape than the config's ({reason}); use the config it was "
                          "trained with, or a new workdir")
      aside = self._set_aside(step)
      logging.warning("checkpoint %d cannot be restored (%s): moved to %s; trying the one "
                      "before", step, reason, aside)
      failed.append(step)
    if failed:
      raise ConfigError(f"no checkpoint in {self.directory} can be restored (steps {failed} "
                        f"were moved to {self.set_aside_directory}); to start over, use a new "
                        "workdir or move the checkpoints folder away")
    return None

  def latest_meta(self) -> dict | None:
    """The metadata (JSON) of the newest checkpoint whose metadata reads, or None."""
    for step in reversed(self.steps()):
      try:
        return self.manager.restore(step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore())).meta
      except Exception:  # a damaged checkpoint; restore_latest names it
        continue
    return None

  @property
  def set_aside_directory(self) -> str:
    return os.path.join(os.path.dirname(self.directory), "checkpoints-set-aside")

  def _set_aside(self, step: int) -> str:
    target = os.path.join(self.set_aside_directory,
                          f"{step}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    if jax.process_index() == 0:
      os.makedirs(self.set_aside_directory, exist_ok=True)
      shutil.move(os.path.join(self.directory, str(step)), target)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices(f"checkpoint {step} set aside")
    self.manager.reload()
    return target

  def restore_params(self, step: int) -> Any:
    """The parameters of one checkpoint as host NumPy arrays, whatever devices wrote it (a
    run sharded over 8 GPUs or 2 hosts evaluates on one machine)."""
    host = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(None, fallback_sharding=host)))
    return jax.tree.map(np.asarray, restored.state["params"])

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()


def average_params(workdir: str, num: int) -> tuple[Any, list[int]]:
  """The mean of the parameters of the last `num` checkpoints in `workdir` (paper §6.1).

  Returns:
    `(params, steps)`: the averaged float32 parameters and the steps that were averaged.
  """
  if num < 1:
    raise ConfigError(f"--num_average={num} must be at least 1 (1 = the latest checkpoint "
                      "alone)")
  ckpt = Checkpointer(workdir, read_only=True)
  steps = ckpt.steps()
  if not steps:
    raise ConfigError(f"no checkpoint in {ckpt.directory}; train one first: "
                      f"python train.py --config=<config> --workdir={workdir}")
  if num > len(steps):
    raise ConfigError(f"--num_average={num} but {ckpt.directory} holds only {len(steps)} "
                      f"checkpoint(s) (steps {steps}); use --num_average={len(steps)} or fewer")
  chosen = steps[-num:]
  total = None
  for step in chosen:
    with _QuietOrphanedReads(os.path.join(ckpt.directory, str(step))) as quiet:
      try:
        params = ckpt.restore_params(step)
      except Exception as e:  # orbax, tensorstore and JSON raise many kinds
        quiet.fail(e)
    if quiet.failure is not None:
      raise ConfigError(f"checkpoint {step} in {ckpt.directory} cannot be restored "
                        f"({quiet.failure.reason}); resuming training there sets damaged "
                        "checkpoints aside, or average fewer with --num_average")
    params = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    total = params if total is None else jax.tree.map(np.add, total, params)
  logging.info("averaged the parameters of steps %s", chosen)
  ckpt.close()
  return jax.tree.map(lambda x: (x / num).astype(np.float32), total), chosen


def saved_steps(workdir: str) -> list[int]:
  """The steps of the complete checkpoints in `workdir`, oldest first; reads only, and starts
  neither orbax nor a JAX backend (a sweep checks its variants' progress with it).

  A complete checkpoint is a folder named by its step: orbax saves under a temporary name
  (`<step>.orbax-checkpoint-tmp...`) and renames it when the save is done.
  """
  folder = os.path.join(workdir, "checkpoints")
  names = os.listdir(folder) if os.path.isdir(folder) else ()
  return sorted(int(name) for name in names if name.isdigit())


def latest_saved_step(workdir: str) -> int:
  """The step of the newest complete checkpoint in `workdir`, 0 when there is none."""
  return max(saved_steps(workdir), default=0)
