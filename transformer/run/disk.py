"""The disk that checkpoints take, known before they are written.

A full checkpoint holds the train state: the parameters and Adam's two moments (12 bytes per
float32 parameter) and a few counters; a parameter snapshot, kept only for averaging (paper
§6.1), the parameters alone (4 bytes per parameter). Orbax adds metadata per array (its
tree, shardings and index: under 1 KiB each, measured) and compresses the arrays a little
(trained float32 weights by about 6%, measured on the demo). The estimate counts the arrays'
bytes plus `_PER_ARRAY` each, so it errs high, never low: by 8-9% for the demo's checkpoints,
6-10% for a model of 147k parameters and 6-21% for one of 23k, where the metadata is a large
share (tests/run/test_disk.py). How many files orbax writes for one state varies from save to
save, and the bytes with it.

While a save is under way, the checkpoints kept so far stay on disk beside it: the most a run
holds is `keep_full + 1` full checkpoints and `keep - keep_full` snapshots (`peak_bytes`).
`report` logs both sizes and that peak when training starts, and warns once when the
workdir's filesystem has less room for it.
"""

from __future__ import annotations

import math
import os
import shutil
from typing import Any

import jax
import numpy as np
from absl import logging

from transformer.run import checkpoint_reads

# Orbax's metadata per array (tree metadata, sharding, index; 0.7 KiB measured on the tiny
# test models, more for longer parameter names), and per item (manifests, commit markers).
_PER_ARRAY = 1024
_PER_ITEM = 4096


def tree_bytes(tree: Any) -> int:
  """Bytes a checkpoint item holding `tree` (arrays or shape structs) takes on disk."""
  leaves = jax.tree.leaves(tree)
  data = sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in leaves)
  return data + _PER_ARRAY * len(leaves) + _PER_ITEM


def checkpoint_bytes(state: Any) -> tuple[int, int]:
  """`(full, snapshot)`: the bytes of one full checkpoint of train state `state` and of one
  parameter snapshot, from its shapes and dtypes."""
  params, opt_state = checkpoint_reads.split_state(state)
  snapshot = tree_bytes(params)
  return snapshot + tree_bytes(opt_state) + 2 * _PER_ITEM, snapshot  # + data, meta (JSON)


def peak_bytes(full: int, snapshot: int, keep: int, keep_full: int) -> int:
  """The most the checkpoints of a run hold: `keep_full` full ones and the one being written,
  and the snapshots that make up `keep`."""
  kept_full = min(keep_full, keep)
  return (kept_full + 1) * full + (keep - kept_full) * snapshot


def used_bytes(folder: str) -> int:
  """Bytes of the files under `folder` (0 when it does not exist), as `du -sb` counts them."""
  total = 0
  for root, _, files in os.walk(folder):
    for name in files:
      try:
        total += os.path.getsize(os.path.join(root, name))
      except OSError:  # removed meanwhile
        pass
  return total


def free_bytes(folder: str) -> int:
  """Bytes free for this user on the filesystem of `folder` (or of its nearest existing
  parent)."""
  while not os.path.exists(folder) and os.path.dirname(folder) != folder:
    folder = os.path.dirname(folder)
  return shutil.disk_usage(folder).free


def format_bytes(n: float) -> str:
  """`12.6 MB`, `15.1 GB`: decimal units, as `df -H` and `du --si` print them."""
  for unit in ("B", "kB", "MB", "GB", "TB"):
    if abs(n) < 1000 or unit == "TB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1000
  raise AssertionError("unreachable")


def report(directory: str, state: Any, keep: int, keep_full: int) -> None:
  """Logs what one full checkpoint and one snapshot of `state` take and what `keep` and
  `keep_full` need at most; warns once when the filesystem of `directory` (the checkpoints
  folder) has less free space than that beyond what its checkpoints already hold."""
  full, snapshot = checkpoint_bytes(state)
  peak = peak_bytes(full, snapshot, keep, keep_full)
  needed = max(peak - used_bytes(directory), 0)
  free = free_bytes(directory)
  kept_full = min(keep_full, keep)
  logging.info("checkpoints: %s full, %s parameters only; keep_checkpoints=%d with "
               "keep_full_checkpoints=%d hold up to %s (%d full while the next is written, "
               "%d snapshots); %s free in %s", format_bytes(full), format_bytes(snapshot),
               keep, keep_full, format_bytes(peak), kept_full + 1, keep - kept_full,
               format_bytes(free), directory)
  if free < needed:
    logging.warning("the filesystem of %s has %s free, but the checkpoints will need %s more "
                    "(%s per full checkpoint, %s per parameter snapshot); the run stops when "
                    "it fills: make room, or lower config.keep_checkpoints or "
                    "config.keep_full_checkpoints", directory, format_bytes(free),
                    format_bytes(needed), format_bytes(full), format_bytes(snapshot))
