"""What a workdir's checkpoints folder holds, read from its names alone: no orbax, no JAX
backend (a sweep checks its runs' progress with these, and `checkpoint.Checkpointer` names its
items with them).

  checkpoints/<step>/    params (parameters and step), opt_state (Adam's moments and counts),
                         data (iterator state), meta (JSON: vocabulary, log window)

A folder holding `meta` is a full checkpoint (a run resumes from it); one holding `params`
alone is a parameter snapshot. A save under way, or abandoned, is a temporary folder.
"""

from __future__ import annotations

import os


# Orbax saves into `<step>.orbax-checkpoint-tmp` and renames it when the save is complete.
UNFINISHED = ".orbax-checkpoint-tmp"
# The items of a checkpoint folder. A parameter snapshot holds PARAMS alone; META marks a
# full checkpoint; a full-only item being removed from one carries REMOVING.
PARAMS, OPT_STATE, DATA, META = "params", "opt_state", "data", "meta"
REMOVING = ".removing"
# The one item that held the whole train state before snapshots: read, never written.
WHOLE_STATE = "state"


def is_full(step_directory: str) -> bool:
  """Whether a checkpoint folder holds the full train state (resuming can start there)."""
  return os.path.isdir(os.path.join(step_directory, META))


def saved_steps(workdir: str) -> list[int]:
  """The steps of the complete checkpoints in `workdir`, oldest first; reads only, and starts
  neither orbax nor a JAX backend (a sweep checks its variants' progress with it).

  A complete checkpoint is a folder named by its step: orbax saves under a temporary name
  (`<step>.orbax-checkpoint-tmp...`) and renames it when the save is done.
  """
  folder = os.path.join(workdir, "checkpoints")
  names = os.listdir(folder) if os.path.isdir(folder) else ()
  return sorted(int(name) for name in names if name.isdigit())


def latest_saved_step(workdir: str) -> int:
  """The step of the newest complete checkpoint in `workdir`, 0 when there is none."""
  return max(saved_steps(workdir), default=0)


def unfinished_steps(workdir: str) -> list[int]:
  """The steps of the saves under way in `workdir` (or abandoned: orbax's temporary folders),
  oldest first; reads only, like `saved_steps`."""
  folder = os.path.join(workdir, "checkpoints")
  names = os.listdir(folder) if os.path.isdir(folder) else ()
  return sorted({int(name.split(".")[0]) for name in names
                 if UNFINISHED in name and name.split(".")[0].isdigit()})


def resume_step(workdir: str) -> int | None:
  """The step of the newest complete full checkpoint in `workdir` (where a run resumes, if it
  restores), None when there is none; reads only, like `saved_steps`."""
  folder = os.path.join(workdir, "checkpoints")
  full = [s for s in saved_steps(workdir) if is_full(os.path.join(folder, str(s)))]
  return max(full, default=None)
