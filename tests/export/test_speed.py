"""The speed tool's timing: engines take turns and each counts its median pass."""

import pytest

from transformer.export import speed


def test_engines_take_turns_and_each_counts_its_median_pass(monkeypatch):
  clock = iter(range(1000))
  monkeypatch.setattr(speed.time, "perf_counter", lambda: next(clock))
  calls = []

  def engine(name, durations):
    durations = iter(durations)

    def translate():
      calls.append(name)
      if len(calls) > 2:  # after the untimed passes, the clock advances this pass' duration
        for _ in range(next(durations) - 1):
          next(clock)
      return [name]
    return name, translate

  outputs, seconds = speed.take_turns([engine("a", [5, 1, 3]), engine("b", [2, 9, 4])], 3)
  assert calls == ["a", "b"] + ["a", "b"] * 3
  assert outputs == [["a"], ["b"]]
  assert seconds == [3, 4]


def test_an_engine_that_changes_its_output_is_named():
  outputs = iter([["x"], ["y"]])
  with pytest.raises(ValueError, match="flaky translated differently"):
    speed.take_turns([("flaky", lambda: next(outputs))], 1)
  with pytest.raises(ValueError, match="--rounds=0"):
    speed.take_turns([("a", lambda: [])], 0)
