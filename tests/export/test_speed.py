"""The speed tool: engines take turns and each counts its median pass; CTranslate2 is searched
over its documented throughput knobs and compared at its best; the figures become records."""

import dataclasses

import ml_collections
import pytest

from tests.export import packages
from transformer.export import ctranslate2_search
from transformer.export import speed
from transformer.export.ctranslate2_search import Knobs
from transformer import records


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


def test_the_knobs_fill_the_cores_with_workers_and_threads_in_every_split():
  assert ctranslate2_search.thread_splits(2) == [(1, 2), (2, 1)]
  assert ctranslate2_search.thread_splits(4) == [(1, 4), (2, 2), (4, 1)]
  assert ctranslate2_search.thread_splits(1) == [(1, 1)]
  grid = ctranslate2_search.knob_grid(2, ["float32", "int8"], examples=[32, 64],
                                      tokens=[1024])
  assert {(k.compute_type, k.inter_threads, k.intra_threads, k.max_batch_size, k.batch_type)
          for k in grid} == {
              (c, inter, intra, size, batch_type) for c in ("float32", "int8")
              for inter, intra in ((1, 2), (2, 1))
              for size, batch_type in ((32, "examples"), (64, "examples"), (1024, "tokens"))}
  assert len(grid) == 12
  # One translator's settings (compute type, threads) together, in 4 runs.
  keys = [(k.compute_type, k.inter_threads) for k in grid]
  assert sum(a != b for a, b in zip(keys, keys[1:])) == 3


def _fake_seconds(knobs: Knobs) -> float:
  """Two workers beat one, int8 beats float32, 64 sentences or 2,048 tokens a sub-batch is the
  best size: a deterministic stand-in for timing CTranslate2."""
  size = abs(knobs.max_batch_size - (64 if knobs.batch_type == "examples" else 2048))
  return (10.0 / knobs.inter_threads + size / 100 + (0.5 if knobs.batch_type == "tokens" else 0)
          ) * (1.0 if knobs.compute_type == "float32" else 0.5)


def test_the_search_times_every_setting_and_the_fastest_goes_on():
  grid = ctranslate2_search.knob_grid(2, ["float32", "int8"])
  timed = []
  rows = ctranslate2_search.time_settings(
      grid, lambda k: timed.append(k) or _fake_seconds(k), num_sentences=1000)
  assert timed == grid
  assert [r["sentences_per_second"] for r in rows] == sorted(
      (1000 / _fake_seconds(k) for k in grid), reverse=True)
  for compute_type in ("float32", "int8"):
    assert ctranslate2_search.fastest(rows, compute_type) == Knobs(
        compute_type, inter_threads=2, intra_threads=1, max_batch_size=64,
        batch_type="examples")
  assert ctranslate2_search.fastest(rows, "int16") is None


def _row(system, search, sentences_per_second, knobs=None):
  return dict(engine=system, search=search, system=system, knobs=knobs, seconds=1.0,
              sentences_per_second=sentences_per_second, differ=0)


def _result():
  best = dataclasses.asdict(Knobs("float32", 2, 1, 64, "examples"))
  best_int8 = {**best, "compute_type": "int8"}
  rows = [_row("project", "beam 4", 179.0),
          _row("ctranslate2_float32", "beam 4", 289.0, best),
          _row("ctranslate2_float32_project_rule", "beam 4", 179.0, best),
          _row("ctranslate2_int8", "beam 4", 716.0, best_int8),
          _row("project", "greedy", 500.0),
          _row("ctranslate2_float32", "greedy", 400.0, best)]
  tried = {"beam 4": [dict(knobs=best, seconds=1.0, sentences_per_second=289.0)] * 32,
           "greedy": [dict(knobs=best, seconds=1.0, sentences_per_second=400.0)] * 16}
  return dict(workdir="runs/x", checkpoint_steps=[400], split="test", num_sentences=1000,
              beam_size=4, alpha=0.6, cores=2, rounds=3, search_rounds=1,
              device="cpu:Test CPU, 2 cores x1", corpus="tatoeba", rows=rows, tried=tried)


def test_the_project_is_compared_with_each_ctranslate2_row_of_its_search():
  assert speed.ratios(_result()["rows"]) == {
      "beam 4": {"ctranslate2_float32": 179 / 289, "ctranslate2_float32_project_rule": 1.0,
                 "ctranslate2_int8": 0.25},
      "greedy": {"ctranslate2_float32": 1.25}}


def test_the_figures_become_records_with_the_best_knobs(tmp_path, monkeypatch):
  monkeypatch.setenv(records.ENV, str(tmp_path))
  path = records.append(speed.TOPIC, speed.records_of(_result(), "tatoeba"))
  assert path == tmp_path / "export_speed.jsonl"
  held = records.load(tmp_path)
  assert sorted(held) == sorted(
      [f"export_speed.tatoeba.beam4.{s}" for s in (
          "project", "ctranslate2_float32", "ctranslate2_float32_project_rule",
          "ctranslate2_int8", "project_over_ctranslate2_float32",
          "project_over_ctranslate2_float32_project_rule", "project_over_ctranslate2_int8")]
      + [f"export_speed.tatoeba.greedy.{s}" for s in (
          "project", "ctranslate2_float32", "project_over_ctranslate2_float32")])
  ratio = held["export_speed.tatoeba.beam4.project_over_ctranslate2_int8"]
  assert (ratio.figure, ratio.unit) == (0.25, "x")
  assert ratio.extra["knobs"] == dict(compute_type="int8", inter_threads=2, intra_threads=1,
                                      max_batch_size=64, batch_type="examples")
  assert ratio.extra["settings_tried"] == 32
  assert ratio.device == "cpu:Test CPU, 2 cores x1"
  peer = held["export_speed.tatoeba.beam4.ctranslate2_float32"]
  assert (peer.figure, peer.unit, peer.extra["knobs"]["inter_threads"]) == (
      289.0, "sentences/s", 2)
  assert "knobs" not in held["export_speed.tatoeba.beam4.project"].extra
  ruled = held["export_speed.tatoeba.beam4.project_over_ctranslate2_float32_project_rule"]
  assert ruled.extra["knobs"] == peer.extra["knobs"]


def test_the_corpus_is_named_by_its_dataset_or_its_folder():
  config = ml_collections.ConfigDict({"data": {"dataset": "synthetic", "files_dir": ""}})
  assert speed.corpus_name(config) == "synthetic"
  config.data.update(dataset="files", files_dir="/data/tatoeba-deu-eng")
  assert speed.corpus_name(config) == "tatoeba"


def test_ctranslate2_goes_on_at_the_fastest_setting_it_was_timed_at(request, monkeypatch):
  packages.require("ctranslate2")  # before the trained workdir, which takes a while
  _, workdir = request.getfixturevalue("trained")
  timed = []

  def seconds(self, knobs, beam_size, rounds=1):
    timed.append(knobs)
    return _fake_seconds(knobs)

  monkeypatch.setattr(ctranslate2_search.Translators, "seconds", seconds)
  result = speed.measure(str(workdir), "test", 8, cores=2, compute_types=["float32", "int16x"],
                         examples=[4, 64], tokens=[2048], rounds=1, greedy=False,
                         huggingface=False)
  assert timed == ctranslate2_search.knob_grid(2, ["float32"], [4, 64], [2048])
  assert len(result["tried"]["beam 4"]) == 6
  by_system = {r["system"]: r for r in result["rows"]}
  assert set(by_system) == {"project", "ctranslate2_float32",
                            "ctranslate2_float32_project_rule"}
  assert by_system["ctranslate2_float32"]["knobs"] == dataclasses.asdict(
      Knobs("float32", 2, 1, 64, "examples"))
  # The project's ranking runs at the same setting, and translates as the project does.
  ruled = by_system["ctranslate2_float32_project_rule"]
  assert ruled["knobs"] == by_system["ctranslate2_float32"]["knobs"] and ruled["differ"] == 0
  assert speed.ratios(result["rows"])["beam 4"]["ctranslate2_float32"] == pytest.approx(
      by_system["project"]["sentences_per_second"]
      / by_system["ctranslate2_float32"]["sentences_per_second"])
