"""Records of measured figures (transformer/records.py): appended as JSON lines, the
newest of a name current, a bad line named by file and line; and the generated blocks of a
page (doc_blocks.py) rendered from them."""

import json

import pytest

from transformer.research import doc_blocks
from transformer import records


def _record(**kw):
  fields = dict(name="demo.cpu.test_sacrebleu", figure=94.0, unit="BLEU",
                command="python train.py", commit="abc123", date="2026-11-28T10:00:00+00:00",
                device="cpu:AMD EPYC, 2 cores x1")
  return records.Record(**{**fields, **kw})


def test_a_record_made_now_names_its_command_commit_date_and_device(tmp_path, monkeypatch):
  monkeypatch.setenv(records.ENV, str(tmp_path))
  made = records.make("x.cpu.total_s", 12, "s", device="cpu:AMD EPYC, 2 cores x1",
                      seeds=[0, 1], command="python -m benchmarks --suite=x", note="why")
  path = records.append("x", [made])
  assert path == tmp_path / "x.jsonl"
  (read,) = records.read(path)
  assert read == made and read.figure == 12.0 and read.seeds == (0, 1)
  assert read.commit and read.date.startswith("20") and read.extra == {"note": "why"}


def test_the_newest_record_of_a_name_is_current_and_of_one_date_the_last_written(tmp_path):
  records.append("a", [_record(figure=1.0, date="2026-11-27T00:00:00+00:00"),
                       _record(figure=2.0, date="2026-11-28T00:00:00+00:00"),
                       _record(figure=3.0, date="2026-11-26T00:00:00+00:00")], tmp_path)
  records.append("b", [_record(name="other", figure=5.0),
                       _record(name="other", figure=6.0)], tmp_path)
  held = records.load(tmp_path)
  assert held["demo.cpu.test_sacrebleu"].figure == 2.0
  assert held["other"].figure == 6.0


def test_a_bad_line_names_its_file_and_line(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text(_record().to_json() + "\n\n{not json\n")
  with pytest.raises(ValueError, match=r"bad.jsonl:3: not a record"):
    records.load(tmp_path)
  path.write_text(json.dumps({**json.loads(_record().to_json()), "figur": 1}) + "\n")
  with pytest.raises(ValueError, match=r"bad.jsonl:1: .*unknown record keys \['figur'\]"):
    records.read(path)


def test_the_results_folder_is_the_environments_when_set(tmp_path, monkeypatch):
  monkeypatch.delenv(records.ENV, raising=False)
  assert records.results_dir() == records.RESULTS
  monkeypatch.setenv(records.ENV, str(tmp_path))
  assert records.results_dir() == tmp_path


def test_a_device_tag_keeps_an_accelerators_model_apart():
  assert records.device_tag("cpu:AMD EPYC, 2 cores x1") == "cpu"
  assert records.device_tag("gpu:NVIDIA H200 x1") == "gpu-h200"
  assert records.device_tag("gpu:NVIDIA H100 80GB HBM3 x8") == "gpu-h100-80gb-hbm3"
  assert records.device_tag("tpu:TPU v5 lite x4") == "tpu-tpu-v5-lite"


_TABLE = doc_blocks.Table(
    ("what", "figure", "device"),
    [("demo", doc_blocks.fig("demo.cpu.test_sacrebleu"),
      doc_blocks.device("demo.cpu.test_sacrebleu")),
     ("time", doc_blocks.text("{t} in all", t=doc_blocks.fig("t.total_s", 1)), "")])


def test_a_table_renders_figures_with_units_and_a_footnote_per_source():
  held = {"demo.cpu.test_sacrebleu": _record(),
          "t.total_s": _record(name="t.total_s", figure=1511.34, unit="s", command="other")}
  rendered = _TABLE.render(held)
  assert "| demo | 94.00 | CPU, AMD EPYC, 2 cores ¹ |" in rendered
  assert "| time | 1,511.3 s in all |  ² |" in rendered
  assert "- ¹ `python train.py` at abc123, 2026-11-28, CPU, AMD EPYC, 2 cores" in rendered
  with pytest.raises(KeyError, match="no record named 't.total_s'"):
    _TABLE.render({"demo.cpu.test_sacrebleu": _record()})


def test_a_pages_blocks_are_rewritten_and_the_stale_ones_named():
  held = {"demo.cpu.test_sacrebleu": _record(), "t.total_s": _record(name="t.total_s")}
  page = "# Page\n\n<!-- table: t -->\nold\n<!-- end table -->\n\nafter\n"
  new, stale = doc_blocks.regenerate(page, {"t": _TABLE}, held)
  assert stale == ["t"] and new.endswith("<!-- end table -->\n\nafter\n")
  assert doc_blocks.regenerate(new, {"t": _TABLE}, held) == (new, [])
  with pytest.raises(ValueError, match="page:3: no table named 't'"):
    doc_blocks.regenerate(page, {}, held)
  with pytest.raises(ValueError, match="page:1: table 'x' has no <!-- end table -->"):
    doc_blocks.blocks("<!-- table: x -->\n")


def test_a_benchmarks_figures_flatten_to_named_records_with_units():
  figures = {"suite": "decoding", "device": "cpu:x", "flax_examples_wmt": None,
             "beam_by_batch": [
                 {"batch_size": 1, "beam_size": 4, "cpu_workarounds": True, "seconds": 0.5,
                  "sentences_per_sec": 2.0, "ms_per_step": 20.0},
                 {"batch_size": 32, "beam_size": 4, "cpu_workarounds": False, "seconds": 4.0,
                  "sentences_per_sec": 8.0, "ms_per_step": float("nan")}],
             "runs": [{"total_s": 1.0}, {"total_s": 2.0}],
             "greedy_vs_beam": {"beam_over_greedy": 0.42, "compile_share": 0.09,
                                "test_sacrebleu": 22.5, "dev_perplexity": 27.8}}
  named = {name: (value, unit) for name, value, unit in records.flatten(figures)}
  assert named == {
      "beam_by_batch.cpu_workarounds-b1-beam4.seconds": (0.5, "s"),
      "beam_by_batch.cpu_workarounds-b1-beam4.sentences_per_sec": (2.0, "/s"),
      "beam_by_batch.cpu_workarounds-b1-beam4.ms_per_step": (20.0, "ms"),
      "beam_by_batch.no_cpu_workarounds-b32-beam4.seconds": (4.0, "s"),
      "beam_by_batch.no_cpu_workarounds-b32-beam4.sentences_per_sec": (8.0, "/s"),
      "runs.0.total_s": (1.0, "s"), "runs.1.total_s": (2.0, "s"),
      "greedy_vs_beam.beam_over_greedy": (0.42, "x"),
      "greedy_vs_beam.compile_share": (0.09, "fraction"),
      "greedy_vs_beam.test_sacrebleu": (22.5, "BLEU"),
      "greedy_vs_beam.dev_perplexity": (27.8, "perplexity")}


def test_a_reports_rows_become_records_with_their_spread_and_comparison(tmp_path):
  from transformer.research import report

  row = {"kind": "variant", "row": "pre_ln", "variant": "pre_ln", "seed": "0 1", "n": "2",
         "test_sacrebleu": "23.2", "test_sacrebleu_std": "0.7", "dev_perplexity": "30.9",
         "dev_perplexity_std": "", "sacrebleu_delta": "0.79", "baseline": "base",
         "sacrebleu_ci95_low": "-0.23", "sacrebleu_ci95_high": "1.92",
         "sacrebleu_p_greater": "0.94", "sacrebleu_p_permutation": "0.057",
         "sacrebleu_p_holm": "0.17", "sacrebleu_test_set_delta": "0.8",
         "sacrebleu_test_set_p_bootstrap": "0.005", "sacrebleu_test_set_p_ar": "0.012"}
  path = tmp_path / "report.csv"
  path.write_text(",".join(row) + "\n" + ",".join(row.values()) + "\n"
                  + "run,pre_ln/seed0" + "," * (len(row) - 2) + "\n")
  made = {r.name: r for r in report.report_records(path, str(tmp_path / "modern"), "cpu:x x1")}
  bleu = made["report.modern.pre_ln.test_sacrebleu"]
  assert (bleu.figure, bleu.unit, bleu.seeds, bleu.extra["sd"]) == (23.2, "BLEU", (0, 1), 0.7)
  assert "sd" not in made["report.modern.pre_ln.dev_perplexity"].extra
  delta = made["report.modern.pre_ln.sacrebleu_delta"].extra
  assert delta["ci95"] == [-0.23, 1.92] and delta["p_holm"] == 0.17
  assert made["report.modern.pre_ln.sacrebleu_test_set_delta"].extra["both_p_le_0_05"]
