"""Checkpoints in the workdir through orbax: train state, data-iterator position, metadata.

Layout of a workdir (config.json, the run's config, is `workdir.py`'s):
  checkpoints/<step>/    params (parameters and step), opt_state (Adam's moments and counts),
                         data (iterator state), meta (JSON: vocabulary, log window)

A checkpoint is full (all four items) or a parameter snapshot (`params` alone, a third of
the bytes). Training keeps the newest `keep_full` full, for resuming; each older one it keeps
(`keep` in all, for averaging, paper §6.1) becomes a snapshot once a newer full one is
complete, by removing its other items, `meta` first (renamed, then deleted): a kill at any
moment leaves a full checkpoint or a snapshot, whose leftovers the next trainer removes.
Nothing is rewritten. A checkpoint of the layout before snapshots (one `state` item, the
whole train state) is read as a full one and left whole.

Re-running the same command resumes from the newest full checkpoint that restores
(`restore_latest`): one that does not (a truncated file, a missing item, a half-written
folder from a kill during the save) is named in one warning and moved to
`checkpoints-set-aside/`, never deleted. Orbax writes each checkpoint into a temporary folder
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
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from transformer import errors
from transformer.errors import ConfigError
from transformer.run import coordination
from transformer.run import cpu_saves
from transformer.run import orbax_failures
from transformer.run import stored_trees


# Orbax saves into `<step>.orbax-checkpoint-tmp` and renames it when the save is complete.
_UNFINISHED = ".orbax-checkpoint-tmp"
# The items of a checkpoint folder. A parameter snapshot holds PARAMS alone; META marks a
# full checkpoint; a full-only item being removed from one carries _REMOVING.
PARAMS, OPT_STATE, DATA, META = "params", "opt_state", "data", "meta"
_REMOVING = ".removing"
# The one item that held the whole train state before snapshots: read, never written.
_WHOLE_STATE = "state"
# How a process's verdict on a checkpoint says that it holds another model (`gather`ed).
_ANOTHER_MODEL = "another model: "


def split_state(state: Any) -> tuple[dict, Any]:
  """`({'params', 'step'}, opt_state)` of a train state: a `TrainState`, or a dict with the
  same three fields."""
  field = state.get if isinstance(state, dict) else lambda name: getattr(state, name)
  return {"params": field("params"), "step": field("step")}, field("opt_state")


def _join(like: Any, params: dict, opt_state: Any) -> Any:
  """The train state of `like`'s kind (`TrainState` or dict) from `split_state`'s two parts."""
  fields = dict(params=params["params"], step=params["step"], opt_state=opt_state)
  return {**like, **fields} if isinstance(like, dict) else like.replace(**fields)


def _is_full(step_directory: str) -> bool:
  """Whether a checkpoint folder holds the full train state (resuming can start there)."""
  return os.path.isdir(os.path.join(step_directory, META))


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
        item_names=(PARAMS, OPT_STATE, DATA, META, _WHOLE_STATE))

  def _remove_unfinished(self) -> None:
    """Removes the temporary folders of saves that never completed (a kill mid-save), and
    what a kill left of making a checkpoint a snapshot (its full-only items)."""
    for leftover in glob.glob(os.path.join(glob.escape(self.directory), f"*{_UNFINISHED}*")):
      shutil.rmtree(leftover, ignore_errors=True)
      logging.info("removed %s, an unfinished save", leftover)
    for step in saved_steps(os.path.dirname(self.directory)):
      folder = os.path.join(self.directory, str(step))
      if not _is_full(folder) and os.path.isdir(os.path.join(folder, PARAMS)):
        for item in (OPT_STATE, DATA, META + _REMOVING):
          shutil.rmtree(os.path.join(folder, item), ignore_errors=True)

  def steps(self) -> list[int]:
    """Every checkpoint's step, full or parameter snapshot, oldest first."""
    return sorted(self.manager.all_steps())

  def full_steps(self) -> list[int]:
    """The steps of the full checkpoints (those a run can resume from), oldest first."""
    return [s for s in self.steps() if _is_full(os.path.join(self.directory, str(s)))]

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
    params, opt_state = split_state(state)
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
    if not os.path.isdir(os.path.join(folder, PARAMS)):
      return  # the layout before snapshots: its parameters are inside its whole state
    os.rename(os.path.join(folder, META), os.path.join(folder, META + _REMOVING))
    for item in (OPT_STATE, DATA, META + _REMOVING):
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
    args, assemble = self._restore_plan(step, abstract_state)
    return assemble(self.manager.restore(step, args=args))

  def _restore_plan(self, step: int, abstract_state: Any) -> tuple[Any, Callable]:
    """`(args, assemble)`: orbax's restore arguments for a full checkpoint, and the function
    that makes `(state, data_state, meta)` of what orbax returns."""
    if os.path.isdir(os.path.join(self.directory, str(step), _WHOLE_STATE)):
      args = ocp.args.Composite(**{_WHOLE_STATE: ocp.args.StandardRestore(abstract_state)},
                                data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore())
      return args, lambda restored: (restored[_WHOLE_STATE], restored.data, restored.meta)
    params, opt_state = split_state(abstract_state)
    args = ocp.args.Composite(params=ocp.args.StandardRestore(params),
                              opt_state=ocp.args.StandardRestore(opt_state),
                              data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore())
    return args, lambda restored: (_join(abstract_state, restored.params, restored.opt_state),
                                   restored.data, restored.meta)

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
      restored, reason = self._restore_checked(step, abstract_state)
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

  def _restore_checked(self, step: int, abstract_state: Any) -> tuple[tuple | None, str]:
    """`((state, data_state, meta), '')` of checkpoint `step`, or `(None, why it is
    damaged)`; raises `ConfigError` when its stored trees are another model's.

    Across processes the verdict is one: each process reads its own part of the arrays (under
    FSDP or tensor sharding, its own chunks), so a damaged file may fail one process's read
    alone. Every process's verdict is gathered before any acts on it: damaged for one is
    damaged for all, and only then is finiteness checked, together."""
    local, reason = self._read_checked(step, abstract_state)
    verdicts = coordination.gather(f"checkpoint {step}", reason)
    for verdict in verdicts:
      if verdict.startswith(_ANOTHER_MODEL):
        raise ConfigError(verdict[len(_ANOTHER_MODEL):])
    damaged = [(p, v) for p, v in enumerate(verdicts) if v]
    if damaged:
      if len(verdicts) == 1:
        return None, damaged[0][1]
      return None, "; ".join(f"process {p}: {v}" for p, v in damaged)
    params = split_state(local[0])[0]["params"]
    if not all_finite(params):
      return None, "its parameters are not all finite"
    return local, ""

  def _read_checked(self, step: int, abstract_state: Any) -> tuple[tuple | None, str]:
    """This process's read of checkpoint `step`: `(restored, '')`, `(None, why it is
    damaged)`, or `(None, _ANOTHER_MODEL + the error)` when its stored trees are another
    model's."""
    folder = os.path.join(self.directory, str(step))
    if os.path.isdir(os.path.join(folder, _WHOLE_STATE)):
      stored = stored_trees.compare(folder, {_WHOLE_STATE: abstract_state})
    else:
      params, opt_state = split_state(abstract_state)
      stored = stored_trees.compare(folder, {PARAMS: params, OPT_STATE: opt_state})
    if stored.another_model:
      return None, (f"{_ANOTHER_MODEL}checkpoint {step} in {self.directory} holds a model of "
                    f"another shape than the config's ({stored.reason}); use the config it was "
                    "trained with, or a new workdir")
    if stored.reason:  # its trees cannot be read
      return None, stored.reason
    return self._read(step, abstract_state)

  def _read(self, step: int, abstract_state: Any) -> tuple[tuple | None, str]:
    """`((state, data_state, meta), '')`, or `(None, reason)` when orbax's read fails
    (what it abandons of a failed read is kept quiet). Only orbax's call is caught."""
    args, assemble = self._restore_plan(step, abstract_state)
    folder = os.path.join(self.directory, str(step))
    restored, failure = orbax_failures.read_quietly(folder, lambda: _read_items(folder, args))
    if failure is not None:
      return None, failure.reason
    return assemble(restored), ""

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
    item = PARAMS
    if not os.path.isdir(os.path.join(self.directory, str(step), PARAMS)):
      item = _WHOLE_STATE  # the layout before snapshots
    restored = self.manager.restore(step, args=ocp.args.Composite(
        **{item: ocp.args.StandardRestore(None, fallback_sharding=host)}))
    return jax.tree.map(np.asarray, restored[item]["params"])

  def wait(self) -> None:
    """Blocks until the save under way is on disk (see `save` for what it raises)."""
    self._finish_pending()

  def close(self) -> None:
    self._finish_pending()
    self.manager.close()


def _read_items(folder: str, args: ocp.args.Composite) -> ocp.args.Composite:
  """Each item of the checkpoint in `folder` through its orbax handler, as
  `CheckpointManager.restore` reads them but without the barrier across processes that ends
  it: a process whose read fails never reaches that barrier, and the others would wait there
  for it. The verdicts are gathered instead (`Checkpointer._restore_checked`)."""
  restored = {}
  for name, arg in args.items():
    handler = (ocp.JsonCheckpointHandler() if isinstance(arg, ocp.args.JsonRestore)
               else ocp.StandardCheckpointHandler())
    try:
      restored[name] = handler.restore(epath.Path(folder) / name, args=arg)
    finally:
      if hasattr(handler, "close"):
        handler.close()
  return ocp.args.Composite(**restored)


@jax.jit
def _finite(leaves: list[jax.Array]) -> jax.Array:
  return jnp.stack([jnp.isfinite(x).all() for x in leaves]).all()


def all_finite(tree: Any) -> bool:
  """Whether every floating-point value in `tree` is finite. The check runs where the arrays
  are, as one jitted reduction to a replicated boolean: no process fetches an array that
  spans another's devices (a state sharded over several hosts)."""
  leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  return not leaves or bool(_finite(leaves))


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


def unfinished_steps(workdir: str) -> list[int]:
  """The steps of the saves under way in `workdir` (or abandoned: orbax's temporary folders),
  oldest first; reads only, like `saved_steps`."""
  folder = os.path.join(workdir, "checkpoints")
  names = os.listdir(folder) if os.path.isdir(folder) else ()
  return sorted({int(name.split(".")[0]) for name in names
                 if _UNFINISHED in name and name.split(".")[0].isdigit()})


def resume_step(workdir: str) -> int | None:
  """The step of the newest complete full checkpoint in `workdir` (where a run resumes, if it
  restores), None when there is none; reads only, like `saved_steps`."""
  folder = os.path.join(workdir, "checkpoints")
  full = [s for s in saved_steps(workdir) if _is_full(os.path.join(folder, str(s)))]
  return max(full, default=None)
