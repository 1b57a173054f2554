"""Reading one checkpoint of the train state, with a verdict every process shares: the
state, or why the checkpoint is damaged, or that it holds another model.

A checkpoint's train state is saved as two items, `params` (parameters and step) and
`opt_state` (`split_state`); one of the layout before snapshots holds it whole (`state`).
`read_checked` compares the stored trees with the wanted ones before reading an array
(`stored_trees`), reads through orbax with its failures kept quiet (`orbax_failures`), gathers
every process's verdict (`coordination`) and checks that the parameters are finite.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath

from transformer.errors import ConfigError
from transformer.run import checkpoint_layout as layout
from transformer.run import coordination
from transformer.run import orbax_failures
from transformer.run import stored_trees

# How a process's verdict on a checkpoint says that it holds another model (`gather`ed).
_ANOTHER_MODEL = "another model: "


def split_state(state: Any) -> tuple[dict, Any]:
  """`({'params', 'step'}, opt_state)` of a train state: a `TrainState`, or a dict with the
  same three fields."""
  field = state.get if isinstance(state, dict) else lambda name: getattr(state, name)
  return {"params": field("params"), "step": field("step")}, field("opt_state")


def join(like: Any, params: dict, opt_state: Any) -> Any:
  """The train state of `like`'s kind (`TrainState` or dict) from `split_state`'s two parts."""
  fields = dict(params=params["params"], step=params["step"], opt_state=opt_state)
  return {**like, **fields} if isinstance(like, dict) else like.replace(**fields)


def restore_plan(folder: str, abstract_state: Any) -> tuple[Any, Callable]:
  """`(args, assemble)`: orbax's restore arguments for a full checkpoint, and the function
  that makes `(state, data_state, meta)` of what orbax returns."""
  if os.path.isdir(os.path.join(folder, layout.WHOLE_STATE)):
    args = ocp.args.Composite(**{layout.WHOLE_STATE: ocp.args.StandardRestore(abstract_state)},
                              data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore())
    return args, lambda restored: (restored[layout.WHOLE_STATE], restored.data, restored.meta)
  params, opt_state = split_state(abstract_state)
  args = ocp.args.Composite(params=ocp.args.StandardRestore(params),
                            opt_state=ocp.args.StandardRestore(opt_state),
                            data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore())
  return args, lambda restored: (join(abstract_state, restored.params, restored.opt_state),
                                 restored.data, restored.meta)


def read_checked(directory: str, step: int, abstract_state: Any) -> tuple[tuple | None, str]:
  """`((state, data_state, meta), '')` of checkpoint `step` in `directory`, or `(None, why it is
  damaged)`; raises `ConfigError` when its stored trees are another model's.

  Across processes the verdict is one: each process reads its own part of the arrays (under
  FSDP or tensor sharding, its own chunks), so a damaged file may fail one process's read
  alone. Every process's verdict is gathered before any acts on it: damaged for one is
  damaged for all, and only then is finiteness checked, together."""
  local, reason = _read_here(directory, step, abstract_state)
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


def _read_here(directory: str, step: int, abstract_state: Any) -> tuple[tuple | None, str]:
  """This process's read of checkpoint `step`: `(restored, '')`, `(None, why it is
  damaged)`, or `(None, _ANOTHER_MODEL + the error)` when its stored trees are another
  model's."""
  folder = os.path.join(directory, str(step))
  if os.path.isdir(os.path.join(folder, layout.WHOLE_STATE)):
    stored = stored_trees.compare(folder, {layout.WHOLE_STATE: abstract_state})
  else:
    params, opt_state = split_state(abstract_state)
    stored = stored_trees.compare(folder, {layout.PARAMS: params, layout.OPT_STATE: opt_state})
  if stored.another_model:
    return None, (f"{_ANOTHER_MODEL}checkpoint {step} in {directory} holds a model of another "
                  f"shape than the config's ({stored.reason}); use the config it was trained "
                  "with, or a new workdir")
  if stored.reason:  # its trees cannot be read
    return None, stored.reason
  return _read(folder, abstract_state)


def _read(folder: str, abstract_state: Any) -> tuple[tuple | None, str]:
  """`((state, data_state, meta), '')`, or `(None, reason)` when orbax's read fails
  (what it abandons of a failed read is kept quiet). Only orbax's call is caught."""
  args, assemble = restore_plan(folder, abstract_state)
  restored, failure = orbax_failures.read_quietly(folder, lambda: _read_items(folder, args))
  if failure is not None:
    return None, failure.reason
  return assemble(restored), ""


def _read_items(folder: str, args: ocp.args.Composite) -> ocp.args.Composite:
  """Each item of the checkpoint in `folder` through its orbax handler, as
  `CheckpointManager.restore` reads them but without the barrier across processes that ends
  it: a process whose read fails never reaches that barrier, and the others would wait there
  for it. The verdicts are gathered instead (`read_checked`)."""
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
