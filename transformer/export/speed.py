"""Translation speed of a trained workdir, side by side in one process: the project's decoder
against CTranslate2 at its best on the same cores, and Hugging Face's generate() when it is
installed.

  python -m transformer.export.speed --workdir=runs/demo
  python -m transformer.export.speed --workdir=runs/tatoeba_small --huggingface=false

Every engine translates the same sentences (the split's sources) from the same model with the
workdir's beam size, length penalty and `max_extra_len`. CTranslate2 is compared at its best:
for each search (beam, and greedy with `--greedy`) and compute type (`--compute_types` that the
device supports), every setting of its throughput knobs (`ctranslate2_search.knob_grid`:
inter_threads x intra_threads filling `--threads` cores, `max_batch_size` in `--examples` or
`--tokens`) is timed over all the sentences (one untimed pass per translator, then
`--search_rounds` passes) and printed; the fastest of each compute type goes on.

Then one untimed pass of each engine (XLA compiles its programs there; CTranslate2 and PyTorch
warm their caches), and the engines take turns, `--rounds` timed passes each: the figure is
sentences per second of an engine's median pass, so a load that comes and goes falls on all
of them alike. Beside CTranslate2's own search (`translate_batch`, its `|Y|^α` ranking), its
translations under the project's ranking and per-sentence limits (`ctranslate2_search.translate`,
one call per output limit, at the threads and sub-batch size of the same compute type's fastest
setting) are timed too: "differ" counts translations unlike the project's. `--unshrunk` adds
the project's searches with finished sentences kept in their batch.

Prints the table and the project's ratio to each CTranslate2 row, writes the whole as JSON
(`--output`, default WORKDIR/eval/speed.json) and appends records (`--record`):
`export_speed.CORPUS.SEARCH.SYSTEM` in sentences/s (SEARCH `beam4`, `greedy`; SYSTEM `project`,
`ctranslate2_float32` at its best with its knobs in the extra, `ctranslate2_float32_project_rule`,
...) and `export_speed.CORPUS.SEARCH.project_over_SYSTEM` (x).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import pathlib
import statistics
import tempfile
import time
from typing import Callable, NamedTuple, Sequence

from absl import flags
from absl import logging

from transformer import cli
from transformer import records
from transformer.export import ctranslate2_search
from transformer.export.ctranslate2_search import EXAMPLES, TOKENS, Knobs

TOPIC = "export_speed"


def _define_flags() -> None:
  """Flags, defined only when run as a program (importing the module defines none)."""
  flags.DEFINE_string("workdir", None, "Training workdir holding checkpoints/.")
  flags.DEFINE_string("split", None, "Split to translate (default: config.data.test_split).")
  flags.DEFINE_integer("num_sentences", 0, "Only the first N (0: all).")
  flags.DEFINE_integer("threads", len(os.sched_getaffinity(0)),
                       "CPU cores: CTranslate2's inter_threads x intra_threads fill them.")
  flags.DEFINE_list("compute_types", ["float32", "int8"],
                    "CTranslate2 compute types to search (those the device lacks are skipped).")
  flags.DEFINE_list("examples", [str(n) for n in EXAMPLES],
                    "CTranslate2 max_batch_size values tried with batch_type 'examples'.")
  flags.DEFINE_list("tokens", [str(n) for n in TOKENS],
                    "CTranslate2 max_batch_size values tried with batch_type 'tokens'.")
  flags.DEFINE_integer("search_rounds", 1, "Timed passes of each CTranslate2 setting searched.")
  flags.DEFINE_integer("batch_size", 64, "Sentences per call of transformers' generate() and "
                       "of its project's-ranking search (huggingface_search).")
  flags.DEFINE_enum("ct2_device", "cpu", ["cpu", "cuda"],
                    "Where CTranslate2 translates (transformers stays on the CPU).")
  flags.DEFINE_integer("rounds", 3, "Timed passes of each engine, taking turns; the median counts.")
  flags.DEFINE_bool("greedy", True, "Also time greedy search (beam size 1).")
  flags.DEFINE_bool("huggingface", True, "Time transformers too, when it is installed.")
  flags.DEFINE_bool("unshrunk", False, "Also time the project's searches with every sentence "
                    "kept until its batch ends (translate_texts(shrink=False)): what finished "
                    "sentences leaving the batch save, and a check that they change nothing.")
  flags.DEFINE_string("corpus", None, "The records' CORPUS (default: `corpus_name`).")
  flags.DEFINE_bool("record", True, "Append the figures to the results folder's records.")
  flags.DEFINE_string("output", None, "JSON output (default WORKDIR/eval/speed.json).")
  flags.mark_flag_as_required("workdir")


def take_turns(engines: Sequence[tuple[str, Callable[[], list[str]]]], rounds: int
               ) -> tuple[list[list[str]], list[float]]:
  """Each engine's output and median seconds: one untimed pass each (compiling, warming up),
  then `rounds` timed passes each, the engines taking turns.

  Args:
    engines: `(name, translate)` pairs, `translate()` giving the translations.
    rounds: timed passes of each engine.

  Raises:
    ValueError: `rounds` < 1, or an engine's output changes between its passes.
  """
  if rounds < 1:
    raise ValueError(f"--rounds={rounds} must be at least 1")
  outputs = [fn() for _, fn in engines]
  times = [[] for _ in engines]
  for _ in range(rounds):
    for (name, fn), output, seconds in zip(engines, outputs, times):
      start = time.perf_counter()
      again = fn()
      seconds.append(time.perf_counter() - start)
      if again != output:
        raise ValueError(f"{name} translated differently on another pass: its passes would "
                         "not time the same work")
  return outputs, [statistics.median(t) for t in times]


class Engine(NamedTuple):
  """One way of translating the sentences, timed in the turns."""

  engine: str  # as printed
  search: str  # "beam 4" or "greedy"
  system: str  # the records' SYSTEM: project, ctranslate2_int8, ...
  fn: Callable[[], list[str]]
  knobs: dict | None = None  # CTranslate2's setting, for its best


class _Job(NamedTuple):
  """What every engine translates, and how."""

  source: object  # model_source.Source
  split: str
  sentences: list[str]
  searches: list[tuple[str, object]]  # (search, config): config.decode.beam_size sets it


def _job(workdir: str, split: str | None, num_sentences: int, greedy: bool) -> _Job:
  from transformer.data import input_pipeline
  from transformer.export import model_source

  source = model_source.load(workdir, 1)
  config = source.config
  split = split or config.data.test_split
  pairs = input_pipeline.load_split(config, workdir, split)
  sentences = [s for s, _ in pairs][:num_sentences or None]
  searches = [(f"beam {int(config.decode.beam_size)}", config)]
  if greedy:
    greedy_config = copy.deepcopy(config)
    greedy_config.decode.beam_size = 1
    searches.append(("greedy", greedy_config))
  return _Job(source, split, sentences, searches)


def _project_engines(job: _Job, unshrunk: bool) -> list[Engine]:
  import jax

  from transformer.decoding import translate
  from transformer.model import transformer as model_lib

  model = model_lib.build_model(job.source.config)
  name = f"project (JAX, XLA:{jax.default_backend().upper()})"

  def project(config, shrink):
    return lambda: translate.translate_texts(model, job.source.params, job.source.tokenizer,
                                             job.sentences, config, progress=False,
                                             shrink=shrink)

  out = [Engine(name, search_name, "project", project(c, True)) for search_name, c in job.searches]
  if unshrunk:
    out += [Engine(f"{name}, finished sentences kept", search_name, "project_unshrunk",
                   project(c, False)) for search_name, c in job.searches]
  return out


def _peer_engines(job: _Job, peer, tried: dict[str, list[dict]],
                  compute_types: Sequence[str]) -> list[Engine]:
  """Each compute type at its best setting for each search, then under the project's rule
  at the same setting."""
  out = []
  for compute_type in compute_types:
    fastest = {name: ctranslate2_search.fastest(tried[name], compute_type)
               for name, _ in job.searches}
    for name, c in job.searches:
      best = fastest[name]
      out.append(Engine(f"CTranslate2 {compute_type} at its best ({peer.device}), "
                        "translate_batch", name, f"ctranslate2_{compute_type}",
                        lambda best=best, beam=int(c.decode.beam_size): peer.translate(best, beam),
                        dataclasses.asdict(best)))
    for name, c in job.searches:
      out.append(Engine(f"CTranslate2 {compute_type} ({peer.device}), project's ranking", name,
                        f"ctranslate2_{compute_type}_project_rule",
                        _project_rule(job, peer, fastest[name], int(c.decode.beam_size)),
                        dataclasses.asdict(fastest[name])))
  return out


def _project_rule(job: _Job, peer, knobs: Knobs, beam_size: int) -> Callable[[], list[str]]:
  """CTranslate2 under the project's ranking and limits (`ctranslate2_search.translate`, one
  call per output limit) at the threads and sub-batches of its fastest `translate_batch`
  setting `knobs`: each call's sentences are split into sub-batches that the workers translate
  in parallel."""
  decode = job.source.config.decode
  translator = peer.translator(knobs)
  return lambda: ctranslate2_search.translate(
      translator, job.source.tokenizer, job.sentences, beam_size=beam_size,
      alpha=float(decode.length_penalty), max_extra_len=int(decode.max_extra_len),
      max_len=job.source.config.model.max_len, max_batch_size=max(len(job.sentences), 1),
      sub_batch=(knobs.max_batch_size, knobs.batch_type))


def _logged(peer, search_name: str, beam_size: int, rounds: int, num_sentences: int
            ) -> Callable[[Knobs], float]:
  """`peer.seconds` of a search, logging each setting as it is timed (the search takes
  minutes)."""
  def seconds(knobs):
    s = peer.seconds(knobs, beam_size, rounds)
    logging.info("CTranslate2 %s, %s: %.1f sentences/s", search_name, knobs, num_sentences / s)
    return s
  return seconds


def measure(workdir: str, split: str | None = None, num_sentences: int = 0, *, cores: int,
            compute_types: Sequence[str] = ("float32", "int8"),
            examples: Sequence[int] = EXAMPLES, tokens: Sequence[int] = TOKENS,
            search_rounds: int = 1, batch_size: int = 64, ct2_device: str = "cpu",
            rounds: int = 3, greedy: bool = True, huggingface: bool = True,
            unshrunk: bool = False) -> dict:
  """Sentences per second of each engine on `split` of the workdir's dataset, CTranslate2 at
  the fastest of its settings on `cores`; the flags of the same names say more."""
  import ctranslate2

  from transformer.export import to_ctranslate2

  supported = ctranslate2.get_supported_compute_types(ct2_device)
  compute_types = [c for c in compute_types if c in supported]
  if not compute_types:
    raise ValueError(f"CTranslate2 on {ct2_device} supports none of --compute_types; it "
                     f"supports {', '.join(sorted(supported))}")
  job = _job(workdir, split, num_sentences, greedy)
  settings = ctranslate2_search.knob_grid(cores, compute_types, examples, tokens, ct2_device)
  d = job.source.config.decode
  with tempfile.TemporaryDirectory() as tmp:
    peer = ctranslate2_search.Translators(
        {c: to_ctranslate2.export(job.source, pathlib.Path(tmp) / c, c) for c in compute_types},
        job.source.tokenizer, job.sentences, alpha=float(d.length_penalty),
        max_extra_len=int(d.max_extra_len), max_len=job.source.config.model.max_len,
        device=ct2_device)
    tried = {name: ctranslate2_search.time_settings(
        settings, _logged(peer, name, int(c.decode.beam_size), search_rounds, len(job.sentences)),
        len(job.sentences)) for name, c in job.searches}
    engines = _project_engines(job, unshrunk)
    engines += _peer_engines(job, peer, tried, compute_types)
    if huggingface:
      engines += _huggingface(job, cores, batch_size, tmp)
    outputs, seconds = take_turns([(f"{e.engine}, {e.search}", e.fn) for e in engines], rounds)
  reference = {e.search: out for e, out in zip(engines, outputs) if e.system == "project"}
  rows = [dict(engine=e.engine, search=e.search, system=e.system, knobs=e.knobs, seconds=s,
               sentences_per_second=len(job.sentences) / s,
               differ=sum(a != b for a, b in zip(reference[e.search], out)))
          for e, out, s in zip(engines, outputs, seconds)]
  return {"workdir": workdir, "checkpoint_steps": job.source.steps, "split": job.split,
          "num_sentences": len(job.sentences), "beam_size": int(d.beam_size),
          "alpha": float(d.length_penalty), "cores": cores, "rounds": rounds,
          "search_rounds": search_rounds, "device": device_name(ct2_device),
          "corpus": corpus_name(job.source.config), "rows": rows, "tried": tried}


def device_name(ct2_device: str = "cpu") -> str:
  """Where the figures were measured, as records name it (`cpu:AMD EPYC 9B45, 2 cores x1`),
  with CTranslate2's device beside an accelerator."""
  import jax

  name = records.device_name()
  return name if jax.devices()[0].platform == "cpu" else f"{name} (CTranslate2 on {ct2_device})"


def ratios(rows: list[dict]) -> dict[str, dict[str, float]]:
  """The project's sentences/s over each CTranslate2 row's, per search:
  `{search: {system: ratio}}`."""
  out = {}
  for search_name in dict.fromkeys(r["search"] for r in rows):
    ours = next((r["sentences_per_second"] for r in rows
                 if r["search"] == search_name and r["system"] == "project"), None)
    if ours:
      out[search_name] = {r["system"]: ours / r["sentences_per_second"] for r in rows
                          if r["search"] == search_name and r["system"].startswith("ctranslate2")}
  return out


def records_of(result: dict, corpus: str) -> list:
  """The figures of `measure` as records: each row's sentences/s, and the project's ratio to
  each CTranslate2 compute type at its best (the best setting's knobs in the extra)."""
  def tag(search_name):
    return search_name.replace(" ", "")  # "beam 4" -> "beam4"

  common = dict(device=result["device"], config=f"workdir {result['workdir']}",
                checkpoint_steps=result["checkpoint_steps"], split=result["split"],
                num_sentences=result["num_sentences"], alpha=result["alpha"],
                cores=result["cores"], rounds=result["rounds"])
  out = [records.make(f"{TOPIC}.{corpus}.{tag(r['search'])}.{r['system']}",
                      r["sentences_per_second"], "sentences/s", engine=r["engine"],
                      differ=r["differ"], **({"knobs": r["knobs"]} if r["knobs"] else {}),
                      **common)
         for r in result["rows"]]
  knobs = {(r["search"], r["system"]): r["knobs"] for r in result["rows"]}
  for search_name, by_system in ratios(result["rows"]).items():
    for system, ratio in by_system.items():
      best = knobs[search_name, system]
      out.append(records.make(
          f"{TOPIC}.{corpus}.{tag(search_name)}.project_over_{system}", ratio, "x",
          **({"knobs": best, "settings_tried": len(result["tried"][search_name])}
             if best else {}), **common))
  return out


def corpus_name(config) -> str:
  """`config.data.dataset`, or for aligned files the first word of their folder's name
  (`tatoeba-deu-eng` -> `tatoeba`)."""
  if config.data.dataset == "files":
    return pathlib.Path(config.data.files_dir).name.split("-")[0] or "files"
  return str(config.data.dataset)


def _huggingface(job: _Job, threads: int, batch_size: int, tmp: str) -> list[Engine]:
  try:
    import torch
    from transformers import MarianMTModel, MarianTokenizer
  except ImportError:
    return []
  from transformer.export import huggingface_search
  from transformer.export import to_huggingface

  source, sentences = job.source, job.sentences
  folder = to_huggingface.export(source, pathlib.Path(tmp) / "hf")
  torch.set_num_threads(threads)
  model = MarianMTModel.from_pretrained(folder).eval()
  tokenizer = MarianTokenizer.from_pretrained(folder)
  d = source.config.decode

  def generate():
    out = []
    for start in range(0, len(sentences), batch_size):
      batch = tokenizer(sentences[start:start + batch_size], return_tensors="pt", padding=True)
      with torch.no_grad():
        ids = model.generate(**batch, num_beams=int(d.beam_size),
                             length_penalty=float(d.length_penalty),
                             # counts the start symbol
                             max_length=batch["input_ids"].shape[1] + int(d.max_extra_len) + 1)
      out.extend(tokenizer.batch_decode(ids, skip_special_tokens=True))
    return out

  def exact():
    return huggingface_search.translate(
        model, source.tokenizer, sentences, beam_size=int(d.beam_size),
        alpha=float(d.length_penalty), max_extra_len=int(d.max_extra_len),
        max_len=source.config.model.max_len, max_batch_size=batch_size)

  beam = job.searches[0][0]
  return [Engine("transformers MarianMTModel (PyTorch), generate()", beam,
                 "transformers_generate", generate),
          Engine("transformers MarianMTModel (PyTorch), project's ranking", beam,
                 "transformers_project_rule", exact)]


def report(result: dict) -> list[str]:
  """The printed table: every CTranslate2 setting tried, then the turns and the ratios."""
  lines = [f"{result['num_sentences']} sentences of {result['split']}, beam "
           f"{result['beam_size']}, alpha {result['alpha']}, {result['device']}"]
  for search_name, tried in result["tried"].items():
    lines.append(f"CTranslate2 settings tried, {search_name} ({result['search_rounds']} timed "
                 "pass each), fastest first:")
    lines += [f"  {Knobs(**r['knobs'])!s:<70} {r['sentences_per_second']:8.1f} sent/s"
              for r in tried]
  lines.append(f"median of {result['rounds']} turns:")
  lines.append(f"{'engine':<62} {'search':>7} {'sent/s':>8} {'differ':>7}")
  lines += [f"{r['engine']:<62} {r['search']:>7} {r['sentences_per_second']:8.1f} "
            f"{r['differ']:7d}" + (f"  [{Knobs(**r['knobs'])}]" if r["knobs"] else "")
            for r in result["rows"]]
  for search_name, by_system in ratios(result["rows"]).items():
    lines += [f"{search_name}: the project at {ratio:.2f}x {system}"
              + (" at its fastest setting" if system.endswith("project_rule") else " at its best")
              for system, ratio in by_system.items()]
  return lines


def main(argv):
  del argv
  f = flags.FLAGS
  result = measure(f.workdir, f.split, f.num_sentences, cores=f.threads,
                   compute_types=f.compute_types, examples=[int(n) for n in f.examples],
                   tokens=[int(n) for n in f.tokens], search_rounds=f.search_rounds,
                   batch_size=f.batch_size, ct2_device=f.ct2_device, rounds=f.rounds,
                   greedy=f.greedy, huggingface=f.huggingface, unshrunk=f.unshrunk)
  print("\n".join(report(result)))
  output = pathlib.Path(f.output or os.path.join(f.workdir, "eval", "speed.json"))
  output.parent.mkdir(parents=True, exist_ok=True)
  output.write_text(json.dumps(result, indent=2) + "\n")
  print(f"written: {output}")
  if f.record:
    from transformer import records

    corpus = f.corpus or result["corpus"]
    path = records.append(TOPIC, records_of(result, corpus))
    print(f"records appended: {path} ({TOPIC}.{corpus}.*)")


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
