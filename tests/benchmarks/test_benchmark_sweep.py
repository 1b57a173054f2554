"""The sweep suite's figures: each run's compile time read from its train.log, as training
logs it, and the medians and ratios of the two modes."""

import types

import jax
import ml_collections
import numpy as np
import pytest

from benchmarks import sweep
from transformer.training import steps as steps_lib


def test_compile_times_come_from_each_runs_train_log_as_training_logs_them(tmp_path, caplog):
  step = jax.jit(lambda state, batch, rng: batch["inputs"].sum() + batch["targets"].sum())
  runner = types.SimpleNamespace(place_batch=lambda batch: batch)
  config = ml_collections.ConfigDict({"data": {"packing": False}, "num_eval_batches": -1})
  for folder, shapes in (("seed1", [(2, 3, 4)]), ("seed0", [(2, 3, 4), (2, 5, 6)])):
    data = types.SimpleNamespace(eval_batches=[], stats={"shapes": shapes})
    caplog.clear()
    with caplog.at_level("INFO"):
      steps_lib.compile_batch_shapes(runner, step, None, None, np.zeros(2), data, config)
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "train.log").write_text(f"step 1\n{caplog.text}step 2\n")
  found = sweep.compiles(str(tmp_path))
  assert [programs for programs, _ in found] == [2, 1]  # seed0's first
  assert all(seconds >= 0 for _, seconds in found)


def test_the_summary_gives_each_modes_medians_and_their_ratios():
  sweeps = [{"mode": "compile_once", "wall_s": w, "cpu_s": c, "compile_s": s}
            for w, c, s in ((300, 500, [80, 20]), (320, 560, [90, 30]), (310, 520, [70, 25]))]
  sweeps += [{"mode": "nocompile_once", "wall_s": 400, "cpu_s": 600, "compile_s": [100, 100]}]
  figures = sweep.summary(sweeps)
  assert figures["compile_once"] == {"wall_s": 310, "cpu_s": 520, "compile_s": 100}
  assert figures["ratio_wall_s"] == pytest.approx(310 / 400)
  assert figures["ratio_compile_s"] == pytest.approx(0.5)
