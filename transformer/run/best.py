"""The best checkpoint on the dev set: a parameter snapshot in `<workdir>/best/<step>/`.

Training writes it whenever the dev metric of `config.select` improves
(`transformer.training.selection`); it holds the parameters (as a checkpoint's `params`
item) and `record`, JSON naming the metric, its value and the step. Orbax keeps one (a new
best replaces the old); the rolling checkpoints' retention, in another folder, never touches
it. `evaluate.py --checkpoint=best` reads it; with `--num_average=k`, `averaging.averaged_to_best`
averages it with the k - 1 rolling checkpoints saved before its step (as fairseq's
`average_checkpoints.py --checkpoint-upper-bound`), which the rolling retention
(`keep_checkpoints`) must still hold.

A resumed run first removes a snapshot newer than the step it resumes from (made in the
stretch it trains again; it finds that best again there, from the same numbers).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from transformer import errors
from transformer.errors import ConfigError

FOLDER = "best"
_PARAMS, _RECORD = "params", "record"


class BestSnapshot:
  """Orbax's manager of `<workdir>/best`, keeping one step; a trainer's makes the folder at
  its first save."""

  def __init__(self, workdir: str, read_only: bool = False):
    self.directory = os.path.join(os.path.abspath(workdir), FOLDER)
    self.read_only = read_only
    self._manager = None

  @property
  def manager(self) -> ocp.CheckpointManager:
    if self._manager is None:
      self._manager = ocp.CheckpointManager(
          self.directory,
          options=ocp.CheckpointManagerOptions(max_to_keep=1, create=not self.read_only,
                                               read_only=self.read_only),
          item_names=(_PARAMS, _RECORD))
    return self._manager

  def step(self) -> int | None:
    return self.manager.latest_step() if os.path.isdir(self.directory) else None

  def forget_after(self, step: int) -> None:
    """Removes a snapshot made after `step` (the run resumes there and trains past it again)."""
    newest = self.step()
    if newest is not None and newest > step:
      self.manager.delete(newest)

  def save(self, step: int, params: Any, record: dict) -> None:
    """Saves `params` as the best, with `record`; returns once it is on disk."""
    with errors.writing("the best checkpoint", self.directory):
      self.manager.save(step, args=ocp.args.Composite(
          params=ocp.args.StandardSave(params), record=ocp.args.JsonSave(record)))
      self.manager.wait_until_finished()

  def record(self) -> dict:
    step = self._step_or_error()
    return self.manager.restore(step, args=ocp.args.Composite(
        record=ocp.args.JsonRestore()))[_RECORD]

  def restore_params(self) -> tuple[Any, int]:
    """`(params, step)`: the snapshot's parameters as host NumPy arrays, and its step."""
    step = self._step_or_error()
    host = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
    restored = self.manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(None, fallback_sharding=host)))
    return jax.tree.map(np.asarray, restored[_PARAMS]), step

  def _step_or_error(self) -> int:
    step = self.step()
    if step is None:
      raise ConfigError(_none_in(self.directory))
    return step

  def close(self) -> None:
    if self._manager is not None:
      self._manager.close()


def saved_step(workdir: str | os.PathLike) -> int | None:
  """The step of the best snapshot in `workdir`, None without one; reads the folder's names
  only (no orbax, no JAX backend), as a report over a sweep does."""
  folder = os.path.join(workdir, FOLDER)
  names = os.listdir(folder) if os.path.isdir(folder) else ()
  return max((int(name) for name in names if name.isdigit()), default=None)


def _none_in(directory: str) -> str:
  return (f"no best checkpoint in {directory}: training keeps one where config.select names a "
          "dev metric that an evaluation computed (config.bleu_every_steps for bleu and chrf, "
          "config.eval_every_steps for loss)")

