"""The run's config as a workdir keeps it: `WORKDIR/config.json`, written when training starts.

Every tool that reads a workdir (evaluate.py, reports, inspection) can take its config from
there instead of the command line, and a resumed run compares the config it was given with
the saved one (`differences`).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import ml_collections

from transformer import config_checks
from transformer.errors import ConfigError

CONFIG_FILE = "config.json"

# What makes a trained model what it is: its shape and its vocabulary (the data keys that
# name the vocabulary's cache file, and the seed that samples its text). A tool given a
# --config for a trained workdir refuses differences here; everything else (decoding, data
# paths, dropout, attention implementation, dtype) may change between training and evaluation.
IDENTITY_KEYS = (
    "model.vocab_size", "model.d_model", "model.d_ff", "model.num_heads", "model.d_k",
    "model.d_v", "model.num_layers", "model.positional", "model.norm", "model.max_len",
    "data.dataset", "data.tfds_name", "data.source_lang", "data.target_lang",
    "data.vocab_model_type", "data.vocab_sample_sentences", "data.vocab_character_coverage",
    "seed")


def config_path(workdir: str | os.PathLike) -> pathlib.Path:
  return pathlib.Path(workdir) / CONFIG_FILE


def save_config(workdir: str | os.PathLike, config) -> None:
  """Writes `config` as `WORKDIR/config.json` (atomically: a crash leaves the old file)."""
  path = config_path(workdir)
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
  tmp.write_text(config.to_json_best_effort(indent=2, sort_keys=True) + "\n")
  os.replace(tmp, path)


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
    config = ml_collections.ConfigDict(json.loads(path.read_text()))
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
      used as given when the workdir has no saved config (one trained before workdirs kept
      theirs).

  Raises:
    ConfigError: one line, when the saved config is missing (and none is requested) or
      unreadable, or when `requested` differs from it in a key of `IDENTITY_KEYS` (named, with
      both values).
  """
  if requested is None:
    return load_config(workdir)
  if not config_path(workdir).is_file():
    return requested
  saved = load_config(workdir)
  changed = differences(saved, requested, IDENTITY_KEYS)
  if changed:
    a, b = _flatten(saved), _flatten(requested)
    shown = ", ".join(f"{k} ({a.get(k, '<absent>')!r} saved, {b.get(k, '<absent>')!r} given)"
                      for k in changed)
    raise ConfigError(f"--config describes another model than the one trained in {workdir}: "
                      f"{shown}; drop --config to use {config_path(workdir)}")
  return requested
