"""Weights & Biases, beside TensorBoard and `metrics.jsonl` (`config.wandb`; the optional
extra: `pip install -e '.[wandb]'`).

One workdir is one W&B run. Its id is drawn at the run's first start and kept in
`WORKDIR/wandb_run_id`, so a resumed run continues the same W&B run; the x-axis is the
training step (`step`), logged with every line: the steps a resume trains again (past its
checkpoint, logged by the stopped run) appear twice, with the same values. Only
process 0 logs. The run's group is `config.wandb.group`, or the config's variant (a Table 3 or
modern row: in a sweep, each row a group and each seed a run in it; a sweep's grid point is
given as the group by `transformer.research.sweep`); its name is the workdir's
last two folders (`A1/seed0`); its config is the whole config. W&B's own settings (e.g.
`WANDB_MODE=offline`, `WANDB_API_KEY`) come from the environment as W&B documents them; its
files go to `WORKDIR/wandb/`.
"""

from __future__ import annotations

import os
import secrets

import jax

from transformer import errors
from transformer.data import textio
from transformer.errors import ConfigError

RUN_ID_FILE = "wandb_run_id"


def run_id(workdir: str) -> str:
  """The workdir's W&B run id: the one kept there, or a new one (8 characters of [0-9a-f]),
  kept for the next start."""
  path = os.path.join(workdir, RUN_ID_FILE)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      return f.read().strip()
  new = secrets.token_hex(4)
  with errors.writing("the W&B run id", path):
    textio.write_text_atomically(path, new + "\n")
  return new


class Tracker:
  """A W&B run that takes the scalars `MetricWriter` writes."""

  def __init__(self, run):
    self.run = run
    run.define_metric("step")
    run.define_metric("*", step_metric="step")

  def log(self, step: int, scalars: dict[str, float]) -> None:
    self.run.log({"step": step, **scalars})

  def finish(self) -> None:
    self.run.finish()


def create(config, workdir: str) -> Tracker | None:
  """The run's tracker, or None: without `config.wandb.project`, and on processes but 0.

  Raises:
    ConfigError: one line, when a project is named and the `wandb` package is absent.
  """
  if not config.wandb.project or jax.process_index() != 0:
    return None
  try:
    import wandb
  except ImportError:
    raise ConfigError(f"config.wandb.project={config.wandb.project!r} needs the wandb package: "
                      "pip install -e '.[wandb]' (or set config.wandb.project='')") from None
  folder = os.path.abspath(workdir)
  run = wandb.init(
      project=config.wandb.project, entity=config.wandb.entity or None,
      group=config.wandb.group or config.get("variant") or None,
      name="/".join(folder.split(os.sep)[-2:]), id=run_id(workdir), resume="allow",
      dir=workdir, config=config.to_dict())
  return Tracker(run)
