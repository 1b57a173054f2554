"""Multi-device execution: `jax.jit` over a named device mesh (the default) or `jax.pmap`.

Both runners give train_lib one interface: `rows_multiple`, `axis_name`, `init_state`,
`abstract_init`, `abstract_state`, `place_batch`, `compile_train_step`, `compile_eval_step`,
`host_state`.
The state they hold is a tree of global `jax.Array`s, so a checkpoint written under one
strategy restores under the other.

- `JitParallel` (config.parallelism='jit'): a mesh with axes `data`, `fsdp`, `tensor`
  (config.mesh; -1 means "the rest of the devices"). Batches are split along their rows over
  `data` × `fsdp`. Parameters and Adam moments are stored as `PARAM_RULES` say: large
  matrices split along `fsdp` on their d_model side (FSDP: each step gathers them whole for
  compute, and their gradients and Adam updates stay split) and along `tensor` on heads, d_ff
  and the vocabulary (Megatron-style tensor parallelism). One jitted program; XLA inserts
  the collectives.
- `PmapParallel` (config.parallelism='pmap'): the state is replicated, each device gets its
  own slice of the batch, and the step (built with `axis_name`) adds the token-summed loss
  and gradients over devices with `lax.psum` before the update, which gives the jit path's
  numbers. Dropout masks are drawn per device (`fold_in` of the device index), so with
  dropout on, pmap and jit runs are statistically, not bitwise, alike.

Every size that must divide another is checked when a runner is built or a batch is placed,
before anything compiles, and a mismatch is one `ConfigError` line naming what would fit.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from transformer.run.config_checks import MESH_AXES
from transformer.errors import ConfigError

BATCH_AXES = ("data", "fsdp")
PMAP_AXIS = "devices"

# Where each kind of parameter lives, keyed by (module name, parameter name) at the end of its
# path; optimizer moments share their parameter's path suffix and so its placement. Anything
# not listed (LayerNorm scales/biases, the wo bias, step counters) is small and replicated.
PARAM_RULES = {
    ("shared_embedding", "embedding"): P("tensor", "fsdp"),  # [V, D]
    ("position_embedding", "embedding"): P(None, "fsdp"),  # [max_len, D]
    ("query", "kernel"): P("fsdp", "tensor", None),  # [D, H, K]
    ("key", "kernel"): P("fsdp", "tensor", None),  # [D, H, K]
    ("value", "kernel"): P("fsdp", "tensor", None),  # [D, H, V_]
    ("out", "kernel"): P("tensor", None, "fsdp"),  # [H, V_, D]
    ("wi", "kernel"): P("fsdp", "tensor"),  # [D, F]
    ("wi", "bias"): P("tensor"),  # [F]
    ("wo", "kernel"): P("tensor", "fsdp"),  # [F, D]
}


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, ...]:
  """Resolves config.mesh (at most one -1) to a shape whose product is `num_devices`."""
  sizes = [int(mesh_config[a]) for a in MESH_AXES]  # positive, or one -1 (validated)
  named = dict(zip(MESH_AXES, sizes))
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ConfigError(f"config.mesh={named}: the fixed axes ({known} devices) do not divide "
                        f"the {num_devices} devices; fixed axes whose product is one of "
                        f"{', '.join(map(str, _divisors(num_devices)))} would fit")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ConfigError(f"config.mesh={named} uses {math.prod(sizes)} devices but {num_devices} "
                      f"are present; make the product {num_devices} or set one axis to -1")
  return tuple(sizes)


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def check_model_fits(model_config, tensor: int, fsdp: int, num_devices: int) -> None:
  """Raises `ConfigError` if a sharded dimension does not divide by its mesh axis."""
  for key, axis, size in (("num_heads", "tensor", tensor), ("d_ff", "tensor", tensor),
                          ("vocab_size", "tensor", tensor), ("d_model", "fsdp", fsdp)):
    value = int(model_config[key])
    if value % size:
      fits = [d for d in _divisors(num_devices) if value % d == 0]
      raise ConfigError(f"config.model.{key}={value} is not divisible by config.mesh.{axis}="
                        f"{size}; {axis} sizes that fit {value} and {num_devices} devices: "
                        f"{', '.join(map(str, fits))}")


def param_spec(path: tuple[str, ...], ndim: int) -> P:
  """The mesh placement of a parameter (or optimizer moment) from its tree path."""
  spec = PARAM_RULES.get(tuple(path[-2:]), P())
  return spec if len(spec) <= ndim else P()


def _dict_path(path) -> tuple[str, ...]:
  return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def _check_rows(batch: dict[str, np.ndarray], multiple: int, devices: int, accum: int) -> None:
  rows = {len(v) for v in batch.values()}
  if len(rows) != 1:
    raise ValueError(f"batch arrays have different numbers of rows: {sorted(rows)}")
  (n,) = rows
  if n % multiple:
    lower, upper = n // multiple * multiple, (n // multiple + 1) * multiple
    raise ConfigError(
        f"a batch of {n} rows per process does not split over {devices} data-parallel "
        f"device(s) x config.grad_accum_steps={accum}; use a multiple of {multiple} "
        f"(e.g. {lower or upper} or {upper} rows)")


def _contiguous(slices: list[slice], total: int) -> slice:
  starts = [s.start or 0 for s in slices]
  stops = [total if s.stop is None else s.stop for s in slices]
  start, stop = min(starts), max(stops)
  if sum(b - a for a, b in sorted(set(zip(starts, stops)))) != stop - start:
    raise ValueError(f"this process's rows {sorted(set(zip(starts, stops)))} are not one block")
  return slice(start, stop)


class JitParallel:
  """State and batches as global arrays on a mesh; steps compiled with `jax.jit`."""

  axis_name = None  # the step needs no collective of its own: XLA inserts them

  def __init__(self, config, devices=None):
    devices = jax.devices() if devices is None else list(devices)
    shape = mesh_shape(config.mesh, len(devices))
    sizes = dict(zip(MESH_AXES, shape))
    check_model_fits(config.model, sizes["tensor"], sizes["fsdp"], len(devices))
    self.mesh = jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(shape),
                              devices=devices)
    self.replicated = NamedSharding(self.mesh, P())
    self.batch_sharding = NamedSharding(self.mesh, P(BATCH_AXES))
    # This process's share of the batch shards (all of them in a single process).
    shards = sizes["data"] * sizes["fsdp"]
    local = {idx[0].start for idx in
             self.batch_sharding.addressable_devices_indices_map((shards,)).values()}
    self.local_shards = len(local)
    self.grad_accum_steps = config.grad_accum_steps
    # Each micro-batch must split over the devices too (train_lib takes rows i, i+k, ...).
    self.rows_multiple = self.local_shards * config.grad_accum_steps

  def process_rows(self, global_rows: int) -> slice:
    """The rows of a global batch of `global_rows` that this process feeds to `place_batch`."""
    indices = self.batch_sharding.addressable_devices_indices_map((global_rows,)).values()
    return _contiguous([idx[0] for idx in indices], global_rows)

  def state_shardings(self, abstract_state: Any) -> Any:
    """NamedShardings for a state tree, from each leaf's path (`PARAM_RULES`)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(self.mesh, param_spec(_dict_path(path), x.ndim)),
        abstract_state)

  def init_state(self, init_fn: Callable[[], Any]) -> Any:
    """Runs `init_fn` compiled so the state is created directly with its shardings."""
    shardings = self.state_shardings(jax.eval_shape(init_fn))
    return jax.jit(init_fn, out_shardings=shardings)()

  def abstract_init(self, init_fn: Callable[[], Any]) -> Any:
    """What `init_state(init_fn)` would return as shapes, dtypes and shardings, computing
    nothing (`jax.eval_shape`): what a checkpoint is restored into."""
    return self.abstract_state(jax.eval_shape(init_fn))

  def abstract_state(self, state: Any) -> Any:
    """Shapes, dtypes and shardings of a state (arrays or `jax.eval_shape`'s structs), for
    restoring a checkpoint into place."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        state, self.state_shardings(state))

  def place_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """This process's rows of the batch -> global arrays split over the data axes."""
    _check_rows(batch, self.rows_multiple, self.local_shards, self.grad_accum_steps)
    return {k: jax.make_array_from_process_local_data(self.batch_sharding, v)
            for k, v in batch.items()}

  def _gathered(self, params: Any) -> Any:
    """`params` constrained to their compute layout: whole along fsdp, split along tensor.

    Without this, XLA may keep a matmul's weight split along d_model and move activations
    instead ("involuntary full rematerialization"); with it, each step all-gathers the fsdp
    shards once and the gradients come back split like the stored parameters.
    """
    def spec(path, x):
      stored = param_spec(_dict_path(path), x.ndim)
      return NamedSharding(self.mesh, P(*(None if a == "fsdp" else a for a in stored)))

    return jax.lax.with_sharding_constraint(
        params, jax.tree_util.tree_map_with_path(spec, params))

  def compile_train_step(self, step_fn: Callable, state: Any) -> Callable:
    """`step_fn(state, batch, rng) -> (state, metrics)`, jitted with the state donated."""
    shardings = jax.tree.map(lambda x: x.sharding, state)

    def step(state, batch, rng):
      return step_fn(state.replace(params=self._gathered(state.params)), batch, rng)

    return jax.jit(step, donate_argnums=(0,), out_shardings=(shardings, self.replicated))

  def compile_eval_step(self, eval_fn: Callable) -> Callable:
    """`eval_fn(params, batch) -> sums`, jitted."""
    return jax.jit(lambda params, batch: eval_fn(self._gathered(params), batch),
                   out_shardings=self.replicated)

  def host_state(self, state: Any) -> Any:
    """The state as checkpointed (global arrays as they are)."""
    return state


class PmapParallel:
  """Replicated state, per-device batches, steps compiled with `jax.pmap` over all devices.

  The step must be built with `axis_name=runner.axis_name` (train_lib does this) so that it
  sums token counts and gradients over devices. In a multi-process run each process passes
  its local devices' rows and `jax.pmap` joins them; the state is then host-local between
  steps and `host_state` rewraps it as one global array for orbax.
  """

  axis_name = PMAP_AXIS

  def __init__(self, config, devices=None):
    # pmap's own device order: all devices grouped by process. Explicit devices (a subset, in
    # one process) are passed to pmap as they are.
    self._pmap_devices = None if devices is None else list(devices)
    if devices is None:
      devices = [d for p in range(jax.process_count()) for d in jax.local_devices(p)]
    devices = list(devices)
    mesh_shape(config.mesh, len(devices))  # a fixed config.mesh.data must match the devices
    self.mesh = Mesh(np.asarray(devices), (PMAP_AXIS,))
    self.replicated = NamedSharding(self.mesh, P())
    self.local_devices = [d for d in devices if d.process_index == jax.process_index()]
    self._per_device = NamedSharding(Mesh(np.asarray(self.local_devices), (PMAP_AXIS,)),
                                     P(PMAP_AXIS))
    self.grad_accum_steps = config.grad_accum_steps
    self.rows_multiple = len(self.local_devices) * config.grad_accum_steps

  def process_rows(self, global_rows: int) -> slice:
    """The rows of a global batch of `global_rows` that this process feeds to `place_batch`."""
    per_device = global_rows // len(self.mesh.devices)
    positions = [i for i, d in enumerate(self.mesh.devices) if d in self.local_devices]
    return _contiguous([slice(i * per_device, (i + 1) * per_device) for i in positions],
                       global_rows)

  def _pmap(self, fn: Callable, in_axes, out_axes, donate_argnums=()) -> Callable:
    return jax.pmap(fn, axis_name=PMAP_AXIS, in_axes=in_axes, out_axes=out_axes,
                    donate_argnums=donate_argnums, devices=self._pmap_devices)

  def state_shardings(self, abstract_state: Any) -> Any:
    """Every leaf replicated over all devices (of all processes)."""
    return jax.tree.map(lambda _: self.replicated, abstract_state)

  def init_state(self, init_fn: Callable[[], Any]) -> Any:
    """Runs `init_fn` compiled so the state is created replicated on every device."""
    return jax.jit(init_fn, out_shardings=self.replicated)()

  def abstract_init(self, init_fn: Callable[[], Any]) -> Any:
    """What `init_state(init_fn)` would return as shapes, dtypes and (replicated)
    shardings, computing nothing (`jax.eval_shape`): what a checkpoint is restored into."""
    return self.abstract_state(jax.eval_shape(init_fn))

  def abstract_state(self, state: Any) -> Any:
    """Shapes, dtypes and (replicated) shardings of a state (arrays or `jax.eval_shape`'s
    structs), for restoring a checkpoint into place."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.replicated), state)

  def place_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """This process's rows -> `[local devices, rows / local devices, ...]`, one slice each."""
    _check_rows(batch, self.rows_multiple, len(self.local_devices), self.grad_accum_steps)
    n = len(self.local_devices)
    return {k: jax.device_put(v.reshape(n, v.shape[0] // n, *v.shape[1:]), self._per_device)
            for k, v in batch.items()}

  def compile_train_step(self, step_fn: Callable, state: Any) -> Callable:
    """`step_fn(state, batch, rng)` pmapped: state and rng broadcast, batch per device.

    The state and metrics come back unmapped (`out_axes=None`): after the psum in the step
    every device holds the same values.
    """
    del state  # shardings are fixed: replicated
    return self._pmap(step_fn, in_axes=(None, 0, None), out_axes=(None, None),
                      donate_argnums=(0,))

  def compile_eval_step(self, eval_fn: Callable) -> Callable:
    """`eval_fn(params, batch) -> sums`, pmapped; sums are added over devices."""

    def eval_step(params, batch):
      return jax.lax.psum(eval_fn(params, batch), PMAP_AXIS)

    return self._pmap(eval_step, in_axes=(None, 0), out_axes=None)

  def host_state(self, state: Any) -> Any:
    """The state as one global replicated array per leaf (what orbax writes)."""
    if jax.process_count() == 1:
      return state

    def to_global(x):
      if not x.is_fully_addressable:
        return x
      return jax.make_array_from_single_device_arrays(
          x.shape, self.replicated, [s.data for s in x.addressable_shards])

    return jax.tree.map(to_global, state)


RUNNERS = {"jit": JitParallel, "pmap": PmapParallel}


def create(config, devices=None) -> JitParallel | PmapParallel:
  """The execution strategy named by config.parallelism (validated), over `devices` (default:
  all)."""
  return RUNNERS[config.parallelism](config, devices)
