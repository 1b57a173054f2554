"""Checkpoints in the workdir through orbax: train state, data-iterator position, metadata.

Each checkpoint is a folder `checkpoints/<step>/` of the workdir, its items named in
`checkpoint_layout` (which also reads the folder's progress without orbax). A checkpoint is full (all four items) or a parameter snapshot (`params` alone, a third of
the bytes). Training keeps the newest `keep_full` full, for resuming; each older one it keeps
(`keep` in all, for averaging, paper §6.1) becomes a snapshot once a newer full one is
complete, by removing its other items, `meta` first (renamed, then deleted): a kill at any
moment leaves a full checkpoint or a snapshot, whose leftovers the next trainer removes.
Nothing is rewritten. A checkpoint of the layout before snapshots (one `state` item, the
whole train state) is read as a full one and left whole.

Re-running the same command resumes from the newest full checkpoint that restores
(`restore_latest`): one that does not (a truncated file, a missing item, a half-written
folder from a kill during the save; `checkpoint_reads` gives the verdict) is named in one
warning and moved to `checkpoints-set-aside/`, never deleted. Orbax writes each checkpoint into a temporary folder
and renames it when complete; a trainer removes leftover temporary folders at start.
A save that fails for want of disk space (or quota) raises `errors.DiskFull`, its one line,
instead of orbax's pages of tracebacks (`orbax_failures`); the checkpoints before it stay as
they were.
On the CPU each replicated array is saved whole from one replica (`cpu_saves`).
`transformer.run.averaging` averages the parameters of the last k checkpoints of either kind,
as the paper does before evaluation (§6.1).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import time
from typing import Any, Callable, Iterator

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from transformer import errors
from transformer.errors import ConfigError
from transformer.run import checkpoint_layout as layout
from transformer.run import checkpoint_reads as reads
from transformer.run import coordination
from transformer.run import cpu_saves
from transformer.run import orbax_failures


class Checkpointer:
  """An orbax `CheckpointManager` over `<workdir>/checkpoints`, keeping the last `keep`, of
  which the newest `keep_full` hold the full train state and the others the parameters only
  (while a save is under way, and until `wait`, `poll` or the next save sees it complete, one
  more is full).

  A reader (`read_only=True`: evaluation, reports) creates nothing and removes nothing, so it
  can run beside a trainer that is writing a checkpoint.
  """

  def __init__(self, workdir: str, *, keep: int = 5, keep_full: int = 2,
               read_only: bool = False):
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    if read_only and not os.path.isdir(self.directory):
      raise ConfigError(f"no checkpoint in {self.directory}; train one first: "
                        f"python train.py --config=<config> --workdir={workdir}")
    self.read_only, self.keep, self.keep_full = read_only, keep, keep_full
    self._pending: tuple[int, orbax_failures.QuietFailedSave] | None = None  # under way
    if not read_only:
      cpu_saves.save_replicated_arrays_whole()
    if not read_only and jax.process_index() == 0:
      self._remove_unfinished()
    self.manager = self._open_manager()

  def _open_manager(self, create: bool = True) -> ocp.CheckpointManager:
    """Orbax's manager of the checkpoints folder; `create` makes the folder if need be (a
    barrier across processes)."""
    return ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=self.keep,
                                             create=create and not self.read_only,
                                             read_only=self.read_only),
        item_names=(layout.PARAMS, layout.OPT_STATE, layout.DATA, layout.META, layout.WHOLE_STATE))

  def _remove_unfinished(self) -> None:
    """Removes the temporary folders of saves that never completed (a kill mid-save), and
    what a kill left of making a checkpoint a snapshot (its full-only items)."""
    for leftover in glob.glob(os.path.join(glob.escape(self.directory), f"*{layout.UNFINISHED}*")):
      shutil.rmtree(leftover, ignore_errors=True)
      logging.info("removed %s, an unfinished save", leftover)
    for step in layout.saved_steps(os.path.dirname(self.directory)):
      folder = os.path.join(self.directory, str(step))
      if not layout.is_full(folder) and os.path.isdir(os.path.join(folder, layout.PARAMS)):
        for item in (layout.OPT_STATE, layout.DATA, layout.META + layout.REMOVING):
          shutil.rmtree(os.path.join(folder, item), ignore_errors=True)

  def steps(self) -> list[int]:
    """Every checkpoint's step, full or parameter snapshot, oldest first."""
    return sorted(self.manager.all_steps())

  def full_steps(self) -> list[int]:
    """The steps of the full checkpoints (those a run can resume from), oldest first."""
    return [s for s in self.steps() if layout.is_full(os.path.join(self.directory, str(s)))]

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, data_state: dict | None, meta: dict) -> None:
    """Saves the full state asynchronously; `wait()` blocks until it is on disk.

    The save before it is complete first, and the checkpoints beyond the newest `keep_full`
    full ones become parameter snapshots.

    Raises:
      errors.DiskFull: the save before this one, or this one's start, ran out of disk space
        or quota (the checkpoints before it are as they were).
    """
    self._finish_pending()
    params, opt_state = reads.split_state(state)
    self._pending = (step, orbax_failures.QuietFailedSave(self.directory, step).start())
    self._run_pending(lambda: self.manager.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params),
        opt_state=ocp.args.StandardSave(opt_state),
        data=ocp.args.JsonSave(data_state or {}),
        meta=ocp.args.JsonSave(meta))))

  def save_params(self, step: int, params: Any) -> None:
    """Saves `params` alone as checkpoint `step`, a parameter snapshot, and waits for it: a
    model imported from elsewhere, which `restore_params`, `averaging.average_params` and
    `config.init_from` read and no run resumes from."""
    self._finish_pending()
    self.manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(
        {"params": params, "step": np.asarray(step, np.int32)})))
    self.manager.wait_until_finished()

  def _run_pending(self, action: Callable[[], Any]) -> None:
    """Runs `action` (the pending save's start, or the wait for its end): if it fails for want
    of disk space, the save ends with `DiskFull` (`_end_pending`); any other failure ends it
    and is raised as it is."""
    try:
      action()
      return
    except Exception as e:  # orbax and TensorStore raise many kinds
      if errors.disk_full_reason(e) is None:
        self._pending[1].stop()
        self._pending = None
        raise
      self._pending[1].fail(e)
    self._end_pending()  # outside the except clause, which held the exception (and orbax's)

  def _end_pending(self) -> None:
    """Ends the pending save: raises `DiskFull` if it failed for want of disk space.

    After such a failure orbax's `CheckpointManager` holds the failure, and through its
    traceback the writes orbax abandoned: the manager is closed and replaced while the
    quieting is still on, so that they are collected, and their reports dropped, inside it
    (`orbax_failures.QuietFailedSave`) rather than at exit."""
    step, quiet = self._pending
    self._pending = None
    if quiet.failure is None:
      quiet.stop()
      return
    if not self.manager.is_saving_in_progress():
      with contextlib.suppress(Exception):  # the failure again, known already
        self.manager.close()
      self.manager = self._open_manager(create=False)  # no barrier across processes
      quiet.stop()
    # Else this process's part failed while orbax's thread waits for the other processes,
    # holding the abandoned writes until the process ends, as the run now does: the
    # quieting stays on until then.
    raise errors.DiskFull(f"checkpoint {step}", self.directory, quiet.failure.disk_full)

  def _finish_pending(self) -> None:
    """Waits for the save under way, if any (raising `DiskFull` if it failed for want of disk
    space), then makes the complete full checkpoints beyond the newest `keep_full` parameter
    snapshots."""
    if self._pending is not None:
      quiet = self._pending[1]
      if jax.process_count() > 1:
        # Across processes, orbax reports a failed part of the save only after waiting for
        # the other processes at a barrier (ten minutes), and they wait for this one: the
        # failure orbax has logged is taken at once instead.
        while quiet.seen is None and self.manager.is_saving_in_progress():
          time.sleep(0.05)
        quiet.failure = quiet.seen
      if quiet.failure is None:
        self._run_pending(lambda: self.manager.wait_until_finished())
      if self._pending is not None:
        self._end_pending()
    if not self.read_only and jax.process_index() == 0:
      for step in self.full_steps()[:-self.keep_full]:
        self._keep_params_only(step)

  def _keep_params_only(self, step: int) -> None:
    """Makes checkpoint `step` a parameter snapshot: removes its full-only items, `meta`
    (renamed first, so a kill leaves a snapshot, not a damaged full checkpoint) last."""
    folder = os.path.join(self.directory, str(step))
    if not os.path.isdir(os.path.join(folder, layout.PARAMS)):
      return  # the layout before snapshots: its parameters are inside its whole state
    meta = os.path.join(folder, layout.META)
    os.rename(meta, meta + layout.REMOVING)
    for item in (layout.OPT_STATE, layout.DATA, layout.META + layout.REMOVING):
      shutil.rmtree(os.path.join(folder, item), ignore_errors=True)
    logging.info("checkpoint %d now holds the parameters only (kept for averaging)", step)

  def poll(self) -> None:
    """Ends a save that has finished in the background: one that ran out of disk space stops
    the run now (`DiskFull`) rather than at the next save, and the full checkpoint it
    replaces becomes a snapshot."""
    own_part_failed = jax.process_count() > 1 and self._pending and self._pending[1].seen
    if self._pending is not None and (own_part_failed
                                      or not self.manager.is_saving_in_progress()):
      self._finish_pending()

  @contextlib.contextmanager
  def finishing_on_error(self) -> Iterator[None]:
    """Around the training loop: an error leaving it (a full disk while metrics are written,
    say) waits for the save under way, so that orbax's threads are not cut off at exit and
    where the next run resumes is known; that save's own `DiskFull` is dropped."""
    try:
      yield
    except BaseException:
      try:
        self._finish_pending()
      except errors.DiskFull:
        pass
      raise

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict, dict]:
    """Restores `(state, data_state, meta)` of a full checkpoint; `abstract_state` gives
    shapes and shardings."""
    folder = os.path.join(self.directory, str(step))
    args, assemble = reads.restore_plan(folder, abstract_state)
    return assemble(self.manager.restore(step, args=args))

  def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict, dict] | None:
    """`(step, state, data_state, meta)` of the newest full checkpoint that restores with
    finite parameters, or None when there is none (parameter snapshots are never resumed
    from). The state comes back with `abstract_state`'s shardings, whatever mesh and number
    of processes wrote it.

    Each checkpoint is first compared with `abstract_state` through what orbax stored of its
    trees (structure, shapes, dtypes), without reading an array: one that differs holds
    another model and stops the run. One whose stored trees match but whose arrays do not
    read (a truncated file, a missing manifest), whose trees cannot be read at all (an empty
    metadata file, a missing item), or whose parameters are not all finite is damaged: it is
    named in one warning and set aside (moved to `checkpoints-set-aside/<step>-<time>`, by
    process 0), and the one before is tried. Only orbax's reads are caught: an error in this
    project's own code passes as it is and sets nothing aside.

    Raises:
      ConfigError: when a checkpoint holds another model (its trees differ from
        `abstract_state`), or when none restores.
    """
    failed = []
    for step in reversed(self.full_steps()):
      restored, reason = reads.read_checked(self.directory, step, abstract_state)
      if restored is not None:
        return (step, *restored)
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
    """The metadata (JSON) of the newest full checkpoint whose metadata reads, or None."""
    for step in reversed(self.full_steps()):
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
    target = coordination.gather(f"checkpoint {step} set aside", target)[0]  # process 0's
    if jax.process_index() == 0:
      os.makedirs(self.set_aside_directory, exist_ok=True)
      shutil.move(os.path.join(self.directory, str(step)), target)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices(f"checkpoint {step} set aside")
    self.manager.reload()
    return target

  def restore_params(self, step: int) -> Any:
    """The parameters of one checkpoint, full or snapshot, as host NumPy arrays, whatever
    devices wrote it (a run sharded over 8 GPUs or 2 hosts evaluates on one machine)."""
    host = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
    item = layout.PARAMS
    if not os.path.isdir(os.path.join(self.directory, str(step), layout.PARAMS)):
      item = layout.WHOLE_STATE  # the layout before snapshots
    restored = self.manager.restore(step, args=ocp.args.Composite(
        **{item: ocp.args.StandardRestore(None, fallback_sharding=host)}))
    return jax.tree.map(np.asarray, restored[item]["params"])

  def wait(self) -> None:
    """Blocks until the save under way is on disk (see `save` for what it raises)."""
    self._finish_pending()

  def close(self) -> None:
    self._finish_pending()
    self.manager.close()
