"""The start-up benchmark: fresh starts and resumes taking turns, each stopped after its first
step, and the medians and ratios made of them."""

import pytest

from benchmarks import against, first_step, startup
from tests import support


def test_fresh_starts_and_resumes_each_stop_after_their_first_step(tmp_path):
  """In this process (`run_child`): the suite's own processes are `first_step.py` running the
  same function."""
  trees = []

  def in_process(tree, spec):
    trees.append(tree)
    return first_step.train_to_first_step(spec)

  runs = startup.measure(support.tiny_config(), str(tmp_path), {"this": against.HERE},
                         rounds=1, rows=5, length=8, run_child=in_process)
  assert trees == [against.HERE] * 3  # the checkpoint of step 1, then one turn
  assert [r["start"] for r in runs] == ["fresh", "resume"]
  assert {r["rows"] for r in runs} == {8}  # rounded up to what the 8 test devices split
  # A fresh start trains step 1; a resume step 2, from the checkpoint of step 1.
  assert [r["step"] for r in runs] == [1, 2]
  for r in runs:
    assert 0 < r["ready_s"] < r["first_step_s"], r
    assert 0 < r["peak_ready_gib"] <= r["peak_gib"], r


def test_medians_per_start_and_a_resume_over_a_fresh_start():
  def row(code, start, seconds, peak):
    return {"code": code, "start": start, "ready_s": seconds / 2, "first_step_s": seconds,
            "peak_ready_gib": peak / 2, "peak_gib": peak}

  runs = [row("this", "fresh", 4.0, 2.0), row("this", "resume", 3.0, 2.2),
          row("this", "resume", 9.0, 1.8), row("this", "fresh", 6.0, 2.0),
          row("this", "resume", 2.0, 2.0), row("this", "fresh", 5.0, 2.0),
          row("abc123", "fresh", 5.0, 2.0), row("abc123", "resume", 6.0, 3.0)]
  medians, ratios = startup.summarize(runs)
  assert [(m["code"], m["start"], m["first_step_s"], m["peak_gib"]) for m in medians] == [
      ("this", "fresh", 5.0, 2.0), ("this", "resume", 3.0, 2.0),
      ("abc123", "fresh", 5.0, 2.0), ("abc123", "resume", 6.0, 3.0)]
  assert [r["code"] for r in ratios] == ["this", "abc123"]
  assert ratios[0]["first_step"] == pytest.approx(0.6) and ratios[0]["peak"] == 1.0
  assert ratios[1]["ready"] == pytest.approx(1.2) and ratios[1]["peak_ready"] == 1.5
