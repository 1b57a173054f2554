"""Checkpoints in the workdir through orbax: train state, data-iterator position, metadata.

Layout of a workdir (config.json, the run's config, is `workdir.py`'s):
  checkpoints/<step>/    state (params, optimizer, step), data (iterator state), meta (JSON)

Re-running the same command resumes from the latest step. `average_params` averages the
parameters of the last k checkpoints, as the paper does before evaluation (§6.1).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from transformer.errors import ConfigError


class Checkpointer:
  """An orbax `CheckpointManager` over `<workdir>/checkpoints`, keeping the last `keep`."""

  def __init__(self, workdir: str, *, keep: int = 5):
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        item_names=("state", "data", "meta"))

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


def saved_steps(workdir: str | os.PathLike) -> list[int]:
  """Steps of the checkpoints in `workdir`, from the folder names alone.

  Nothing is created (a `Checkpointer` creates its folder), so a tool can check a workdir
  before it touches it. Orbax writes a checkpoint under a temporary name and renames it to its
  step once complete, so an interrupted save is not listed.
  """
  directory = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(directory):
    return []
  return sorted(int(name) for name in os.listdir(directory)
                if name.isdigit() and os.path.isdir(os.path.join(directory, name)))


def require_checkpoint(workdir: str | os.PathLike) -> list[int]:
  """`saved_steps(workdir)`, or a `FileNotFoundError` (one line) saying to train first."""
  steps = saved_steps(workdir)
  if not steps:
    raise FileNotFoundError(
        f"no checkpoint in {os.path.join(os.path.abspath(workdir), 'checkpoints')}; train one "
        f"first: python train.py --config=<config> --workdir={workdir}")
  return steps


def average_params(workdir: str, num: int) -> tuple[Any, list[int]]:
  """The mean of the parameters of the last `num` checkpoints in `workdir` (paper §6.1).

  Returns:
    `(params, steps)`: the averaged float32 parameters and the steps that were averaged.
  """
  require_checkpoint(workdir)
  ckpt = Checkpointer(workdir, keep=max(num, 1))
  steps = ckpt.steps()
  if num > len(steps):
    raise ConfigError(f"--num_average={num} but {ckpt.directory} holds only {len(steps)} "
                     f"checkpoint(s) (steps {steps}); use --num_average={len(steps)} or fewer")
  chosen = steps[-num:]
  total = None
  for step in chosen:
    params = jax.tree.map(lambda x: np.asarray(x, np.float64), ckpt.restore_params(step))
    total = params if total is None else jax.tree.map(np.add, total, params)
  logging.info("averaged the parameters of steps %s", chosen)
  ckpt.close()
  return jax.tree.map(lambda x: (x / num).astype(np.float32), total), chosen

