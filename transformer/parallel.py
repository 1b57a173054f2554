"""Data-parallel execution: `jax.jit` over a named device mesh (the default path).

The mesh has axes `data`, `fsdp` and `tensor` (config.mesh; -1 means "the rest of the
devices"). Batches are split along their first dimension over `data` × `fsdp`.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from transformer.config_checks import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, ...]:
  """Resolves config.mesh (with at most one -1) to a shape whose product is `num_devices`."""
  sizes = [int(mesh_config[a]) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ConfigError(f"config.mesh={dict(zip(MESH_AXES, sizes))}: at most one axis may be -1")
  if any(s == 0 or s < -1 for s in sizes):
    raise ConfigError(f"config.mesh={dict(zip(MESH_AXES, sizes))}: sizes must be positive "
                      "or -1 (the rest)")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ConfigError(f"config.mesh={dict(zip(MESH_AXES, sizes))}: the fixed axes ({known}) "
                        f"do not divide the {num_devices} devices")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ConfigError(f"config.mesh={dict(zip(MESH_AXES, sizes))} uses {math.prod(sizes)} "
                      f"devices but {num_devices} are present; make the product "
                      f"{num_devices} or set one axis to -1")
  return tuple(sizes)


class JitParallel:
  """State and batches as global arrays on a mesh; steps compiled with `jax.jit`."""

  def __init__(self, config, devices=None):
    devices = jax.devices() if devices is None else devices
    shape = mesh_shape(config.mesh, len(devices))
    self.mesh = Mesh(np.asarray(devices).reshape(shape), MESH_AXES)
    data_parallel = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
    # Rows of each process's batch are split over its share of the data-parallel devices.
    self.rows_multiple = max(data_parallel // jax.process_count(), 1)
    self.replicated = NamedSharding(self.mesh, P())
    self.batch_sharding = NamedSharding(self.mesh, P(BATCH_AXES))

  def state_shardings(self, abstract_state: Any) -> Any:
    """Replicated parameters and optimizer state."""
    return jax.tree.map(lambda _: self.replicated, abstract_state)

  def init_state(self, init_fn: Callable[[], Any]) -> Any:
    """Runs `init_fn` compiled so the state is created directly with its shardings."""
    shardings = self.state_shardings(jax.eval_shape(init_fn))
    return jax.jit(init_fn, out_shardings=shardings)()

  def abstract_state(self, state: Any) -> Any:
    """Shapes, dtypes and shardings of `state`, for restoring a checkpoint into place."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)

  def place_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """This process's rows of the batch -> global arrays split over the data axes."""
    return {k: jax.make_array_from_process_local_data(self.batch_sharding, v)
            for k, v in batch.items()}

  def compile_train_step(self, step_fn: Callable, state: Any) -> Callable:
    """`step_fn(state, batch, rng) -> (state, metrics)`, jitted with the state donated."""
    shardings = jax.tree.map(lambda x: x.sharding, state)
    return jax.jit(step_fn, donate_argnums=(0,), out_shardings=(shardings, self.replicated))

  def compile_eval_step(self, eval_fn: Callable) -> Callable:
    """`eval_fn(params, batch) -> sums`, jitted."""
    return jax.jit(eval_fn, out_shardings=self.replicated)

  def host_state(self, state: Any) -> Any:
    """The state as checkpointed (global arrays as they are)."""
    return state


def create(config) -> JitParallel:
  """The execution strategy named by config.parallelism."""
  if config.parallelism == "jit":
    return JitParallel(config)
  raise ConfigError(f"config.parallelism={config.parallelism!r} is not one of 'jit', 'pmap'")
