"""A sweep's runs: the product of variants, grid points and seeds, their folders and
overrides, and one-line errors for bad --grid and --seeds values."""

import pytest

from transformer.errors import ConfigError
from transformer.research import grid


def test_product_folders_and_overrides():
  points = grid.points(["base", "A1"], grid.parse_grid(
      ["learning_rate_factor=0.5,2", "model.dropout_rate=0.1"]), [0, 1])
  assert [p.folder for p in points[:4]] == [
      "base/learning_rate_factor=0.5_dropout_rate=0.1/seed0",
      "base/learning_rate_factor=0.5_dropout_rate=0.1/seed1",
      "base/learning_rate_factor=2_dropout_rate=0.1/seed0",
      "base/learning_rate_factor=2_dropout_rate=0.1/seed1"]
  assert len(points) == 8 and points[4].folder.startswith("A1/")
  assert points[3].overrides() == ["--config.learning_rate_factor=2",
                                   "--config.model.dropout_rate=0.1", "--config.seed=1"]


def test_without_seeds_or_grid_a_run_keeps_the_variant_folder():
  # Sweeps from before seeds existed trained in ROOT/NAME: the same folder, so they resume.
  (point,) = grid.points(["A1"], [], [])
  assert (point.folder, point.overrides()) == ("A1", [])
  assert [p.folder for p in grid.points([None], [], [3, 4])] == ["seed3", "seed4"]
  assert [p.folder for p in grid.points([None], grid.parse_grid(["warmup_steps=8"]), [])] == [
      "warmup_steps=8"]


def test_keys_sharing_a_last_part_keep_their_full_names_and_odd_characters_are_replaced():
  points = grid.points(["x"], grid.parse_grid(["model.d_k=8", "other.d_k=a/b"]), [])
  assert points[0].folder == "x/model.d_k=8_other.d_k=a-b"


def test_values_that_would_share_a_folder_are_refused():
  with pytest.raises(ConfigError, match=r"--grid: .* would both train in 'files_dir=a-b'"):
    grid.points(["x"], grid.parse_grid(["data.files_dir=a/b,a-b"]), [])


@pytest.mark.parametrize("items, sets, message", [
    (["warmup_steps"], [], "expected KEY=VALUE1,VALUE2"),
    (["warmup_steps=4000,"], [], "expected KEY=VALUE1,VALUE2"),
    (["warmup_steps=1,1"], [], "a value is given twice"),
    (["warmup_steps=1", "warmup_steps=2"], [], "warmup_steps is given twice"),
    (["warmup_steps=1"], ["warmup_steps=3"], "warmup_steps is given twice"),
    (["seed=1,2"], [], "sweep seeds with --seeds=1,2"),
])
def test_bad_grid_items_are_one_line_errors(items, sets, message):
  with pytest.raises(ConfigError, match=message):
    grid.parse_grid(items, sets)


def test_seeds():
  assert grid.parse_seeds("") == []
  assert grid.parse_seeds("0, 1,2") == [0, 1, 2]
  with pytest.raises(ConfigError, match="expected non-negative integers"):
    grid.parse_seeds("0,x")
  with pytest.raises(ConfigError, match="a seed is given twice"):
    grid.parse_seeds("1,1")
