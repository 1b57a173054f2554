"""The parameters that evaluation and export read from a workdir's checkpoints: the mean of
the last k (paper §6.1), the mean of the k ending at the best checkpoint on dev, and the
`WORKDIR` / `WORKDIR:STEP` names of a checkpoint that `--ensemble` and `config.init_from`
take."""

from __future__ import annotations

import os
import re
from typing import Any

import jax
import numpy as np
from absl import logging

from transformer.errors import ConfigError
from transformer.run import best as best_lib
from transformer.run import checkpoint
from transformer.run import checkpoint_layout
from transformer.run import orbax_failures


def parse_spec(spec: str) -> tuple[str, int | None]:
  """`'WORKDIR'` or `'WORKDIR:STEP'` -> `(workdir, step or None)`."""
  if re.fullmatch(r".+:\d+", spec):
    workdir, step = spec.rsplit(":", 1)
    return workdir, int(step)
  return spec, None


def average_params(workdir: str, num: int, steps: list[int] | None = None
                   ) -> tuple[Any, list[int]]:
  """The mean of the parameters of the last `num` checkpoints in `workdir` (paper §6.1), or
  of the checkpoints of `steps`.

  Returns:
    `(params, steps)`: the averaged float32 parameters and the steps that were averaged.
  """
  if num < 1:
    raise ConfigError(f"--num_average={num} must be at least 1 (1 = the latest checkpoint "
                      "alone)")
  ckpt = checkpoint.Checkpointer(workdir, read_only=True)
  saved = ckpt.steps()
  if not saved:
    raise ConfigError(f"no checkpoint in {ckpt.directory}; train one first: "
                      f"python train.py --config=<config> --workdir={workdir}")
  if steps is None and num > len(saved):
    raise ConfigError(f"--num_average={num} but {ckpt.directory} holds only {len(saved)} "
                      f"checkpoint(s) (steps {saved}); use --num_average={len(saved)} or fewer")
  chosen = list(steps) if steps is not None else saved[-num:]
  total = None
  for step in chosen:
    params, failure = orbax_failures.read_quietly(os.path.join(ckpt.directory, str(step)),
                                                  lambda: ckpt.restore_params(step))
    if failure is not None:
      raise ConfigError(f"checkpoint {step} in {ckpt.directory} cannot be restored "
                        f"({failure.reason}); resuming training there sets damaged "
                        "checkpoints aside, or average fewer with --num_average")
    params = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    total = params if total is None else jax.tree.map(np.add, total, params)
  logging.info("averaged the parameters of steps %s", chosen)
  ckpt.close()
  return jax.tree.map(lambda x: (x / len(chosen)).astype(np.float32), total), chosen


def averaged_to_best(workdir: str, num: int) -> tuple[Any, list[int]]:
  """`(params, steps)`: the mean of the best snapshot's parameters and those of the `num - 1`
  checkpoints saved last before its step, and the steps averaged (the best's last).

  Raises:
    ConfigError: one line, when there is no best snapshot or fewer checkpoints before it.
  """
  snapshot = best_lib.BestSnapshot(workdir, read_only=True)
  best, step = snapshot.restore_params()
  snapshot.close()
  if num <= 1:
    return best, [step]
  before = [s for s in checkpoint_layout.saved_steps(workdir) if s < step][-(num - 1):]
  if len(before) < num - 1:
    raise ConfigError(f"--checkpoint=best --num_average={num}: {workdir} keeps "
                      f"{len(before)} checkpoint(s) before the best step {step} ({before}); "
                      f"average at most {len(before) + 1}, or keep more "
                      "(config.keep_checkpoints) in the next run")
  others, _ = average_params(workdir, num - 1, steps=before)
  mean = jax.tree.map(lambda o, b: ((o.astype(np.float64) * (num - 1) + b) / num)
                      .astype(np.float32), others, best)
  return mean, [*before, step]
