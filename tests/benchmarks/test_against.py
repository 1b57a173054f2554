"""--against=REV: a suite on this checkout and on another commit, taking turns."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import against
from tests.conftest import REPO
from transformer import records


def test_the_figures_compared_are_measures_named_by_their_rows():
  figures = {"suite": "train_step", "device": "cpu", "measurements": [
      {"model": "base", "dtype": "float32", "loss_chunk_tokens": 0, "step_seconds": 2.0,
       "mfu": 0.5, "batch_size": 64, "num_params": 63},
      {"model": "base", "dtype": "bfloat16", "loss_chunk_tokens": 0, "step_seconds": 1.0}]}
  assert against.flatten(figures) == {
      "measurements/base,float32,0,64/step_seconds": 2.0,
      "measurements/base,float32,0,64/mfu": 0.5,
      "measurements/base,bfloat16,0/step_seconds": 1.0}


def _git(*args):
  return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)


@pytest.mark.skipif(_git("rev-parse", "HEAD").returncode != 0,
                    reason="needs a git checkout with history (a clone, not an archive)")
def test_a_suite_runs_here_and_at_another_commit_and_prints_both(tmp_path):
  before = _git("worktree", "list").stdout
  run = subprocess.run(
      [sys.executable, "-m", "benchmarks", "--config=tests/tiny_config.py", "--suite=train_step",
       "--batch_size=8", "--source_length=8", "--target_length=8", "--min_seconds=0.2",
       # The peak as given: measuring it takes 3 s of both cores in each tree's run.
       "--peak_tflops=0.5", "--against=HEAD", "--against_rounds=1", f"--workdir={tmp_path}",
       f"--output={tmp_path / 'out.json'}"],
      cwd=REPO, capture_output=True, text=True,
      env=dict(os.environ, JAX_PLATFORMS="cpu", TRANSFORMER_RESULTS_DIR=str(tmp_path / "records")))
  assert run.returncode == 0, run.stderr[-3000:]
  assert not (tmp_path / "records").exists(), "a comparison's turns appended records"
  turns = records.read(tmp_path / "against-records" / "train_step.jsonl")  # kept apart
  assert turns and all(r.name.startswith("train_step.tiny_config.cpu.") for r in turns)
  result = json.loads((tmp_path / "out.json").read_text())
  head = _git("rev-parse", "--short", "HEAD").stdout.strip()
  assert result["against"] == head and result["rounds"] == 1
  (step,) = [f for f in result["figures"] if f["figure"].endswith("/step_seconds")]
  assert step["this"] > 0 and step["other"] > 0
  assert step["ratio"] == pytest.approx(step["this"] / step["other"])
  assert f"against {head}, median of 1 turns" in run.stdout
  figure = {f["figure"].rsplit("/", 1)[-1]: f for f in result["figures"]}
  for tree in ("this", "other"):  # MFU over the given peak, 0.5 TFLOP/s of each of 8 devices
    assert figure["mfu"][tree] == pytest.approx(
        figure["model_tflops_per_sec"][tree] / (0.5 * 8), rel=1e-6)
  assert _git("worktree", "list").stdout == before  # the temporary tree is gone
