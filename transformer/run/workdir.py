"""The run's config as a workdir keeps it: `WORKDIR/config.json`, written when training starts.

Every tool that reads a workdir (evaluate.py, reports, inspection) can take its config from
there instead of the command line, and a resumed run compares the config it was given with
the saved one (`differences`).
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import time
from typing import Any

import ml_collections

from absl import logging

from transformer import errors
from transformer.data import textio
from transformer.model import config as model_config
from transformer.run import config_checks, schema
from transformer.errors import ConfigError

CONFIG_FILE = "config.json"
LOCK_FILE = "train.lock"

# What makes a trained model what it is (declared in `schema`): its architecture (every
# `config.model` field but dropout and the implementation switches) and its vocabulary (the
# data keys that name the vocabulary's cache file, `data.seed` among them). A
# tool given a --config for a trained workdir refuses differences here; everything else
# (decoding, data paths, dropout, attention implementation, dtype) may change between
# training and evaluation.
IDENTITY_KEYS = schema.identity_keys()

# Keys added after workdirs were first written, each with the value that was in effect before
# it existed: a config.json without one is read as holding that value, and a run resuming
# there keeps it (`fill_added_keys`).
_ADDED_LATER = {
    "data.seed": lambda saved: saved.get("seed", 0),  # the run's seed sampled the data cache
    "keep_full_checkpoints": lambda saved: saved.get("keep_checkpoints", 1),  # all were full
    "heartbeat_timeout_seconds": lambda saved: 100,  # JAX's own default
    "step_timeout_seconds": lambda saved: 0,  # no step clock
    "dropout_rng_impl": lambda saved: "threefry2x32",
    "data.allow_new_order_on_resume": lambda saved: False,
    "data.synthetic_train_pairs": lambda saved: 50_000,  # the generator's fixed size
    "init_from": lambda saved: "",  # from random parameters
    "init_from_partial": lambda saved: False,
    "select": lambda saved: "",  # no best checkpoint was kept
    "patience": lambda saved: 0,
    "comet_model": lambda saved: "",  # no COMET during training
    "comet_python": lambda saved: "",
    "wandb": lambda saved: {"project": "", "entity": "", "group": ""},  # no W&B run
    # The departures after the paper (configs/modern.py): their defaults are what the model
    # and the optimiser computed before the keys existed.
    **{key: (lambda saved, value=value: value) for key, value in (
        ("model.norm_type", "layernorm"), ("model.activation", "relu"),
        ("model.ffn_match_params", False), ("model.shaw_clip", 16), ("model.num_kv_heads", 0),
        ("model.qk_norm", "none"), ("model.tie_embeddings", "three_way"),
        ("model.biases", True), ("model.attention_biases", False),
        ("model.output_bias", False), ("model.norm_epsilon", 1e-6), ("optimizer", "adam"), ("weight_decay", 0.0),
        ("lr_schedule", "inverse_sqrt"), ("wsd_decay_fraction", 0.2), ("z_loss", 0.0))},
    # A gated feed-forward had biases (after model.activation, filled above).
    "model.glu_biases": lambda saved: saved["model"]["activation"] in model_config.GATED,
    "model.qk_norm_length": lambda saved: 64,  # read by qk_norm='l2' alone, which came with it
}

# Values a key has taken since under another name: True of `model.qk_norm` was the RMS form,
# before Henry et al.'s L2 form came beside it.
_RENAMED_VALUES = {"model.qk_norm": {True: "rms", False: "none"}}


def fill_added_keys(saved: dict) -> dict[str, Any]:
  """Fills into `saved` (a config.json's content, changed in place) the keys of
  `_ADDED_LATER` it predates, and gives the values of `_RENAMED_VALUES` their names of
  today; returns the keys filled in, with their values."""
  for dotted, names in _RENAMED_VALUES.items():
    node, name = _parent(saved, dotted)
    if isinstance(node, dict) and isinstance(node.get(name), bool):
      node[name] = names[node[name]]
  filled = {}
  for dotted, value_before in _ADDED_LATER.items():
    node, name = _parent(saved, dotted)
    if isinstance(node, dict) and name not in node:
      node[name] = filled[dotted] = value_before(saved)
  return filled


def _parent(saved: dict, dotted: str) -> tuple[Any, str]:
  """The dict that holds dotted key `dotted` in `saved` (None if there is none), and its
  last name."""
  *parents, name = dotted.split(".")
  node = saved
  for parent in parents:
    node = node.get(parent) if isinstance(node, dict) else None
  return node, name


def keep_added_keys(config, filled: dict[str, Any]) -> None:
  """Sets in `config` (a run resuming in a workdir) the values `fill_added_keys` found in
  effect there, so that the run goes on as it was trained; keys that may change on resume
  (`_PATHS_AND_SPEED`) keep the requested value."""
  for dotted, value in filled.items():
    if dotted in _PATHS_AND_SPEED:
      continue
    *parents, name = dotted.split(".")
    node = config
    for parent in parents:
      node = node[parent]
    if node[name] != value:
      logging.info("%s predates config.%s: this run keeps %r, the value in effect when it was "
                   "trained", CONFIG_FILE, dotted, value)
      node[name] = value


def config_path(workdir: str | os.PathLike) -> pathlib.Path:
  return pathlib.Path(workdir) / CONFIG_FILE


def save_config(workdir: str | os.PathLike, config) -> None:
  """Writes `config` as `WORKDIR/config.json` (atomically: a crash leaves the old file)."""
  textio.write_text_atomically(config_path(workdir),
                               config.to_json_best_effort(indent=2, sort_keys=True) + "\n")


def load_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
  """The config saved in `workdir`, checked like any config.

  Raises:
    ConfigError: one line, when the file is missing, unreadable, or was written by a version
      of the project whose config keys differ from this one's.
  """
  path = config_path(workdir)
  if not path.is_file():
    raise ConfigError(f"no {CONFIG_FILE} in {workdir}: it is written when training starts "
                      f"there; train first, or pass --config=<the config it was trained with>")
  try:
    saved = json.loads(path.read_text())
    fill_added_keys(saved)
    config = ml_collections.ConfigDict(saved)
  except (OSError, ValueError) as e:
    raise ConfigError(f"{path} cannot be read ({e}); pass --config=<the config it was trained "
                      "with>") from None
  try:
    config_checks.validate(config)
  except ConfigError as e:
    raise ConfigError(f"{path}: {e} (written by an incompatible version of this project?); "
                      "pass --config=<the config it was trained with>") from None
  return config


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
  flat = {}
  for key, value in node.items():
    if isinstance(value, (dict, ml_collections.ConfigDict)):
      flat.update(_flatten(value, f"{prefix}{key}."))
    else:
      flat[prefix + key] = list(value) if isinstance(value, tuple) else value
  return flat


def differences(saved, requested, keys: tuple[str, ...] = ()) -> list[str]:
  """Dotted keys whose values differ between two configs (present in one only included).

  Args:
    saved, requested: configs (ConfigDicts or nested dicts).
    keys: compare only these keys and the keys under them (e.g. `('model', 'data')`); all
      keys if empty.
  """
  a, b = _flatten(saved), _flatten(requested)
  chosen = sorted(k for k in a.keys() | b.keys()
                  if not keys or any(k == p or k.startswith(p + ".") for p in keys))
  return [k for k in chosen if a.get(k, "<absent>") != b.get(k, "<absent>")]


def config_for(workdir: str | os.PathLike, requested=None) -> ml_collections.ConfigDict:
  """The config a tool that reads `workdir` uses: the saved one, or `requested` (a --config)
  checked against it.

  Args:
    workdir: a training workdir.
    requested: a config from the command line, or None to use `WORKDIR/config.json`. It is
      used as given when the workdir has no saved config, or one that cannot be read (e.g.
      written by an earlier version of the project, with other keys): that is what --config
      is for.

  Raises:
    ConfigError: one line, when the saved config is missing or unreadable and none is
      requested, or when `requested` differs from the saved one in a key of `IDENTITY_KEYS`
      (named, with both values).
  """
  if requested is None:
    return load_config(workdir)
  try:
    # Only the identity keys are compared: a file from another version may lack others.
    saved = json.loads(config_path(workdir).read_text())
    filled = fill_added_keys(saved)
  except (OSError, ValueError, AttributeError):
    logging.warning("%s cannot be read: using --config as given", config_path(workdir))
    return requested
  keep_added_keys(requested, filled)
  changed = differences(saved, requested, IDENTITY_KEYS)
  if changed:
    raise ConfigError(f"--config describes another model than the one trained in {workdir}: "
                      f"its {CONFIG_FILE} has {_listing(saved, requested, changed)}; drop "
                      "--config (and --config.KEY=VALUE of these keys) to use it")
  return requested


# Keys that may differ from the saved config when a run resumes, because they do not change
# what is computed (declared in `schema`): where files are (their content is checked by
# checksums), how fast data is read, how attention and the loss are computed, which splits
# are evaluated.
_PATHS_AND_SPEED = schema.path_or_speed_keys()


def check_resume_config(saved, requested, *, allow_changes: bool) -> list[str]:
  """Judges a resumed run's config against the one its workdir was trained with.

  Model and data keys may not change (a run of another model or corpus belongs in another
  workdir), except where files are and how fast they are read (`_PATHS_AND_SPEED`); other
  keys (more steps, logging, evaluation, parallelism) only with `allow_changes`.

  Returns:
    The keys that differ (all allowed).

  Raises:
    ConfigError: naming the keys that may not differ, or that need `allow_changes`.
  """
  changed = differences(saved, requested)
  fixed = [k for k in differences(saved, requested, keys=("model", "data"))
           if k not in _PATHS_AND_SPEED]
  if fixed:
    raise ConfigError(f"{CONFIG_FILE} of this workdir has {_listing(saved, requested, fixed)};"
                      " a run of another model or corpus needs a new workdir")
  needs_flag = [k for k in changed if k not in _PATHS_AND_SPEED]
  if needs_flag and not allow_changes:
    raise ConfigError(f"{CONFIG_FILE} of this workdir has "
                      f"{_listing(saved, requested, needs_flag)}; pass --allow_config_changes "
                      "to resume with the new values")
  return changed


def _listing(saved, requested, keys: list[str]) -> str:
  a, b = _flatten(saved), _flatten(requested)
  shown = [f"{k}={a.get(k, '<absent>')!r} (now {b.get(k, '<absent>')!r})" for k in keys[:4]]
  more = f" and {len(keys) - 4} more" if len(keys) > 4 else ""
  return ", ".join(shown) + more


class TrainerLock:
  """`WORKDIR/train.lock` while a trainer runs there: a second trainer is refused.

  The file names the owner's host and PID. A lock whose process is gone (same host, no such
  PID) is taken over with a warning; one from another host is not (its process cannot be
  checked from here), and the error says how to remove it.
  """

  def __init__(self, workdir: str | os.PathLike):
    self.path = pathlib.Path(workdir) / LOCK_FILE
    self.owner = {"host": socket.gethostname(), "pid": os.getpid(),
                  "since": time.strftime("%Y-%m-%d %H:%M:%S")}

  def __enter__(self) -> "TrainerLock":
    for _ in range(2):
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        self._take_over_if_stale()
        continue
      try:  # a lock left empty (its disk full) would refuse every later trainer
        with errors.writing("the trainer lock", self.path), os.fdopen(fd, "w") as f:
          json.dump(self.owner, f)
      except BaseException:
        self.path.unlink(missing_ok=True)
        raise
      return self
    raise ConfigError(f"could not take {self.path}; another trainer started at the same time")

  def _take_over_if_stale(self) -> None:
    try:
      holder = json.loads(self.path.read_text())
    except FileNotFoundError:  # released since
      return
    except (OSError, ValueError):
      holder = None
    if not isinstance(holder, dict):
      raise ConfigError(f"{self.path} cannot be read: another trainer is taking it at this "
                        "moment, or one stopped while taking it; delete it if no trainer runs "
                        f"in {self.path.parent}")
    host, pid = holder.get("host"), holder.get("pid")
    if host == self.owner["host"] and isinstance(pid, int) and not _alive(pid):
      logging.warning("%s was left by process %d, which has ended: taking it over",
                      self.path, pid)
      self.path.unlink(missing_ok=True)
      return
    raise ConfigError(f"{self.path.parent} is in use by another trainer (PID {pid} on {host}, "
                      f"since {holder.get('since')}); wait for it to finish or stop it, or "
                      f"delete {self.path} if that process is gone")

  def __exit__(self, *exc) -> None:
    self.release()

  def release(self) -> None:
    self.path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # it exists, under another user
  return True

