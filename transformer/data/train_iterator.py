"""The training batches' iterator and its position, as checkpoints keep it.

The batch at step k is a pure function of the pipeline that makes it (`Pipeline`: the seed,
the tokenized training data, the batch shapes, packing and the number of processes) and of k
(`input_pipeline`). A checkpoint stores the next step's number with that pipeline's
description, so a resumed run with the same pipeline continues with exactly the batches an
uninterrupted run sees.

A resumed run whose pipeline differs cannot continue that order. The usual cause is another
number of processes or of local data-parallel devices: process p owns every P-th pair, the
buckets of each process cycle through that process's pairs in orders of its own, and the
batch shapes follow the rows per process, so no step of the new pipeline holds the pairs the
old one had left for the epoch in progress (carrying them over exactly is not attempted: even
an uninterrupted epoch shows a few pairs twice, where a bucket's last batch wraps around).
`set_state` refuses such a position in one line that names what changed and how to resume
exactly (`ConfigError`), unless the config opts into a new order
(`config.data.allow_new_order_on_resume`): then the run goes on from the same step number in
its own order, with a warning. Other devices that leave the batch shapes as they were change
nothing, and are accepted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys

import grain
import numpy as np
from absl import logging

from transformer.errors import ConfigError

OPT_IN = "config.data.allow_new_order_on_resume"


@dataclasses.dataclass(frozen=True)
class Pipeline:
  """What the order of the training batches depends on, besides the step."""

  seed: int
  cache: str  # the tokenized training split's cache file: names the data and vocabulary
  kept: int  # training pairs kept by the length filter
  shapes: tuple  # [rows, source, target] of each batch shape, per process
  packing: bool
  processes: int
  rows_multiple: int  # local data-parallel devices × grad_accum_steps; orders through `shapes`

  def fingerprint(self) -> str:
    """A short hash of what decides the order (`rows_multiple` acts through `shapes`)."""
    fields = dict(seed=self.seed, cache=self.cache, kept=self.kept,
                  shapes=[list(s) for s in self.shapes], packing=self.packing,
                  processes=self.processes)
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]

  def record(self) -> dict:
    """JSON-able fields, as a checkpoint's data item holds them."""
    return dict(dataclasses.asdict(self), shapes=[list(s) for s in self.shapes])


def _layout(record: dict) -> str:
  return f"{record['processes']} × {record['rows_multiple']}"


def describe_change(saved: dict | None, now: Pipeline) -> tuple[str, str]:
  """(what differs, how to resume exactly) between the pipeline of a saved position
  (`Pipeline.record()`, or None for a position saved without one) and this run's."""
  if not saved:
    return ("the checkpoint's data position was saved by another input pipeline (config.seed, "
            "the training data, its batch shapes, packing or the number of processes differ)",
            "resume with the settings it was saved with")
  current = now.record()
  changes, fixes = [], []
  if (saved["processes"], saved["rows_multiple"]) != (now.processes, now.rows_multiple):
    changes.append(f"belongs to {_layout(saved)} (processes × batch rows per process in "
                   "multiples of: local data-parallel devices × config.grad_accum_steps), this "
                   f"run has {_layout(current)}")
    fixes.append(f"on {_layout(saved)} as it was saved")
  if saved["seed"] != now.seed:
    changes.append(f"belongs to config.seed={saved['seed']}, this run has {now.seed}")
    fixes.append(f"with config.seed={saved['seed']}")
  if (saved["cache"], saved["kept"]) != (now.cache, now.kept):
    changes.append(f"belongs to the training data {saved['cache']} ({saved['kept']} pairs "
                   f"kept), this run reads {now.cache} ({now.kept} pairs kept)")
    fixes.append("with the same training data")
  if saved["packing"] != now.packing:
    changes.append(f"belongs to config.data.packing={saved['packing']}, this run has "
                   f"{now.packing}")
    fixes.append(f"with config.data.packing={saved['packing']}")
  if not changes:
    changes.append(f"belongs to batch shapes {saved['shapes']}, this run makes "
                   f"{current['shapes']}")
    fixes.append("with the data settings it was saved with")
  return ("the checkpoint's data position " + "; it ".join(changes),
          "resume " + " and ".join(fixes))


class TrainIterator:
  """Infinite training batches; `get_state()`/`set_state()` save and restore the position."""

  def __init__(self, batch, pipeline: Pipeline, *, threads: int, prefetch: int,
               allow_new_order: bool = False):
    """
    Args:
      batch: step number -> this process's batch (a layout's `batch`).
      pipeline: what `batch` depends on besides the step.
      threads, prefetch: grain's reader threads and batches read ahead.
      allow_new_order: `set_state` accepts a position saved by another pipeline.
    """
    self.pipeline, self.fingerprint = pipeline, pipeline.fingerprint()
    self.allow_new_order = allow_new_order
    ds = grain.MapDataset.range(sys.maxsize).map(batch)
    self._ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads,
                                                    prefetch_buffer_size=prefetch))
    self._it = iter(self._ds)

  def __iter__(self) -> "TrainIterator":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._it)

  def get_state(self) -> dict:
    """JSON-able position: the next step's number and the pipeline it belongs to."""
    return {"next_index": int(self._it.get_state()["next_index"]),
            "fingerprint": self.fingerprint, "pipeline": self.pipeline.record()}

  def set_state(self, state: dict) -> None:
    """Continues from a saved position.

    Raises:
      ConfigError: the position belongs to another pipeline (another number of processes or
        devices, seed or data) and the config does not opt into a new order (`OPT_IN`).
    """
    step = int(state["next_index"])
    if state.get("fingerprint") != self.fingerprint:
      change, fix = describe_change(state.get("pipeline"), self.pipeline)
      if not self.allow_new_order:
        raise ConfigError(
            f"{change}: from step {step} on, this run's batches would not be the ones an "
            f"uninterrupted run sees. To continue that order, {fix}; to go on in this run's "
            f"order (the epoch in progress then repeats some pairs and skips others), pass "
            f"--{OPT_IN}=True")
      logging.warning("%s; %s=True: going on from step %d in this run's data order (the epoch "
                      "in progress repeats some pairs and skips others)", change, OPT_IN, step)
    self._it.set_state({"next_index": step})
