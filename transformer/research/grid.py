"""The runs of a sweep: named variants × grid points × seeds, each with its folder and overrides.

A run's folder under the sweep root is `VARIANT[/GRID][/seed<k>]`:

- VARIANT: a name of the config file's `NAMES` (absent when a config file without `NAMES` is
  swept alone);
- GRID: with `--grid KEY=v1,v2 ...`, the run's `key=value` pairs in `--grid` order joined by
  '_', e.g. `learning_rate_factor=0.5_warmup_steps=8000`. A key is named by its last dotted
  part (`model.dropout_rate` -> `dropout_rate`) unless two grid keys share it; characters
  other than letters, digits and `.+-` become '-'. The name depends only on the grid's keys
  and values, so the same command finds the same folders again;
- `seed<k>`: with `--seeds`, which passes `--config.seed=k`. Without `--seeds` a run trains
  with its config's own seed in `VARIANT[/GRID]`, the folder sweeps used before seeds
  existed, so those sweeps resume unchanged. (Rerun with `--seeds`, such a sweep trains its
  seed runs inside the first runs' workdirs, where the report does not look: start a seeded
  sweep in a fresh root.)
"""

from __future__ import annotations

import dataclasses
import itertools
import re

from transformer.errors import ConfigError

_UNSAFE = re.compile(r"[^A-Za-z0-9.+-]")
SEED_FOLDER = re.compile(r"seed(\d+)")  # a seed's folder, the last part of a run's


@dataclasses.dataclass(frozen=True)
class Point:
  """One training run of a sweep."""

  variant: str | None  # a name of the config file's NAMES; None: the config file alone
  grid: tuple[tuple[str, str], ...] = ()  # (config key, value) of its grid point
  seed: int | None = None  # --seeds' seed; None: the config's own
  folder: str = ""  # its workdir below the sweep root

  def overrides(self) -> list[str]:
    """`--config.KEY=VALUE` of its grid point, then its seed."""
    return ([f"--config.{key}={value}" for key, value in self.grid]
            + ([f"--config.seed={self.seed}"] if self.seed is not None else []))


def parse_grid(items, sets=()) -> list[tuple[str, list[str]]]:
  """`--grid KEY=v1,v2` items as `[(key, [v1, v2])]`, in the order given.

  Raises:
    ConfigError: an item without `=` or values, a key given twice (or also by `--set`, or
      `seed`, which `--seeds` sets), or a value given twice.
  """
  grid, fixed = [], {s.partition("=")[0].strip() for s in sets}
  for item in items:
    key, sep, values = item.partition("=")
    key = key.strip()
    chosen = [v.strip() for v in values.split(",")]
    if not sep or not key or not values.strip() or "" in chosen:
      raise ConfigError(f"--grid {item!r}: expected KEY=VALUE1,VALUE2,..., e.g. --grid "
                        "warmup_steps=4000,8000")
    if key == "seed":
      raise ConfigError(f"--grid {item!r}: sweep seeds with --seeds={values}")
    if key in fixed or key in (k for k, _ in grid):
      raise ConfigError(f"--grid {item!r}: {key} is given twice (by --grid or --set); give "
                        "each key once")
    if len(set(chosen)) < len(chosen):
      raise ConfigError(f"--grid {item!r}: a value is given twice")
    grid.append((key, chosen))
  return grid


def parse_seeds(text: str) -> list[int]:
  """`--seeds=0,1,2` as `[0, 1, 2]`; '' as `[]` (each run with its config's own seed).

  Raises:
    ConfigError: a seed that is not a non-negative integer, or a seed given twice.
  """
  if not text.strip():
    return []
  parts = [p.strip() for p in text.split(",")]
  if not all(p.isdigit() for p in parts):
    raise ConfigError(f"--seeds={text}: expected non-negative integers separated by commas, "
                      "e.g. --seeds=0,1,2")
  seeds = [int(p) for p in parts]
  if len(set(seeds)) < len(seeds):
    raise ConfigError(f"--seeds={text}: a seed is given twice")
  return seeds


def _short_names(keys: list[str]) -> dict[str, str]:
  """Each grid key's name in folders: its last dotted part, unless another key shares it."""
  last = [k.rsplit(".", 1)[-1] for k in keys]
  return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def grid_folder(point: tuple[tuple[str, str], ...], names: dict[str, str]) -> str:
  """The folder name of one grid point, e.g. `learning_rate_factor=0.5_warmup_steps=8000`."""
  return "_".join(f"{names[key]}={_UNSAFE.sub('-', value)}" for key, value in point)


def points(variants: list[str | None], grid: list[tuple[str, list[str]]],
           seeds: list[int]) -> list[Point]:
  """Every run: variants (outermost) × grid points (the last key varying fastest) × seeds.

  Raises:
    ConfigError: two grid points that would share a folder (values that differ only in
      characters a folder name cannot hold, such as `a/b` and `a-b`).
  """
  names = _short_names([key for key, _ in grid])
  grid_points = [tuple(zip([k for k, _ in grid], values))
                 for values in itertools.product(*(v for _, v in grid))]
  folders = {}
  for point in grid_points:
    folder = grid_folder(point, names)
    if folder in folders:
      raise ConfigError(f"--grid: {dict(folders[folder])} and {dict(point)} would both train "
                        f"in {folder!r}; give values that differ in letters, digits or .+-")
    folders[folder] = point
  out = []
  for variant in variants:
    for point in grid_points:
      for seed in seeds or [None]:
        parts = [variant, grid_folder(point, names) if point else None,
                 f"seed{seed}" if seed is not None else None]
        out.append(Point(variant, point, seed, "/".join(p for p in parts if p) or "."))
  return out
