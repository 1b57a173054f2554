"""Whether a checkpoint holds the model a run expects, told from what orbax stored of its
trees, before any array is read.

Beside each item's arrays orbax writes the item's tree: every leaf's path, shape and dtype
(`_METADATA`). Comparing it with the run's abstract state separates the two ways a restore
can fail without looking at an error's text:
  * the trees differ: the checkpoint holds another model (a model key changed), and the run
    must stop, leaving it where it is;
  * the trees match, or cannot be read at all (an empty metadata file, a missing item): the
    checkpoint is what the run expects, so an array that then does not read means damage.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from transformer.run import orbax_failures

_SHOWN = 3  # differences named in the message; the rest are counted


@dataclasses.dataclass(frozen=True)
class Verdict:
  """What a checkpoint's stored trees say: `another_model` with the differences in `reason`;
  or, when they cannot be read, `reason` says why; or they match (no reason)."""

  another_model: bool = False
  reason: str = ""


def compare(folder: str, expected: dict[str, Any]) -> Verdict:
  """Compares the stored trees of a checkpoint's items with the expected abstract trees.

  Args:
    folder: the checkpoint's step folder.
    expected: item name -> the tree the run would restore into it (arrays or
      `jax.ShapeDtypeStruct`s; only paths, shapes and dtypes are compared).
  """
  differences = []
  for item, tree in expected.items():
    # Orbax reads each array's metadata concurrently and abandons the others when one fails
    # (a missing item, an empty or cut metadata file, ...).
    stored, failure = orbax_failures.read_quietly(
        folder, lambda: ocp.StandardCheckpointHandler().metadata(epath.Path(folder) / item))
    if failure is not None:
      return Verdict(reason=f"the tree of its {item} cannot be read: {failure.reason}")
    differences += _differences(item, ocp.tree.to_flat_dict(stored.tree),
                                ocp.tree.to_flat_dict(tree))
  if not differences:
    return Verdict()
  more = len(differences) - _SHOWN
  return Verdict(another_model=True, reason="; ".join(differences[:_SHOWN])
                 + (f"; {more} more" if more > 0 else ""))


def _differences(item: str, stored: dict, expected: dict) -> list[str]:
  """One phrase per difference between two flat trees (path -> leaf)."""
  name = lambda path: "/".join((item, *map(str, path)))
  out = []
  for path in sorted(expected.keys() - stored.keys()):
    out.append(f"{name(path)} is not in the checkpoint")
  for path in sorted(stored.keys() - expected.keys()):
    out.append(f"{name(path)} is in the checkpoint only")
  for path in sorted(stored.keys() & expected.keys()):
    there, here = (_shape_dtype(stored[path]), _shape_dtype(expected[path]))
    if there != here:
      out.append(f"{name(path)} is {_fmt(there)} there and {_fmt(here)} here")
  return out


def _shape_dtype(leaf) -> tuple[tuple[int, ...] | None, str | None]:
  shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
  return (None if shape is None else tuple(shape),
          None if dtype is None else np.dtype(dtype).name)


def _fmt(shape_dtype) -> str:
  shape, dtype = shape_dtype
  return f"{dtype}{list(shape) if shape is not None else ''}"
