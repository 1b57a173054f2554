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


def test_the_project_is_compared_with_ctranslate2_float32_under_its_rule():
  rows = [dict(engine="project (JAX, XLA:CPU)", search="beam 4", sentences_per_second=200.0),
          dict(engine="project (JAX, XLA:CPU), finished sentences kept", search="beam 4",
               sentences_per_second=70.0),
          dict(engine="CTranslate2 float32 (cpu), translate_batch", search="beam 4",
               sentences_per_second=250.0),
          dict(engine="CTranslate2 float32 (cpu), project's ranking", search="beam 4",
               sentences_per_second=160.0),
          dict(engine="CTranslate2 int8 (cpu), project's ranking", search="beam 4",
               sentences_per_second=400.0),
          dict(engine="project (JAX, XLA:CPU)", search="greedy", sentences_per_second=500.0),
          dict(engine="CTranslate2 float32 (cpu), project's limits", search="greedy",
               sentences_per_second=400.0)]
  assert speed.ratios_to_ctranslate2(rows) == {"beam 4": 1.25, "greedy": 1.25}
  assert speed.ratios_to_ctranslate2(rows[:3]) == {}
