"""Translation speed of a trained workdir, side by side in one process: the project's decoder,
CTranslate2 float32 and int8, and Hugging Face's generate() when it is installed.

  python -m transformer.export.speed --workdir=runs/demo
  python -m transformer.export.speed --workdir=runs/tatoeba --split=test --threads=2

Each engine translates the same sentences (the split's sources) with the workdir's beam size,
after one untimed pass over them (XLA compiles its programs there; CTranslate2 and PyTorch warm
their caches). Then the engines take turns, `--rounds` timed passes each, and the figure is
sentences per second of an engine's median pass: a load that comes and goes falls on all of
them alike. CTranslate2 and transformers are each timed two ways: their own search
(`translate_batch` / `generate()`, beam 4, `length_penalty=α`, their `|Y|^α` ranking) and the
project's ranking and per-sentence length limits (`ctranslate2_search` / `huggingface_search`,
one call per source length), with how many translations each gives that differ from the
project's. `--greedy` adds greedy search (beam size 1): the project's against CTranslate2
float32 under the project's length limits. `--unshrunk` adds the project's searches with
finished sentences kept in their batch, as a check (no translation may differ) and for what
their leaving saves.
Prints a table and writes it as JSON (`--output`, default WORKDIR/eval/speed.json).
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import platform
import statistics
import tempfile
import time
from typing import Callable, Sequence

from absl import flags

from transformer import cli


def _define_flags() -> None:
  """Flags, defined only when run as a program (importing the module defines none)."""
  flags.DEFINE_string("workdir", None, "Training workdir holding checkpoints/.")
  flags.DEFINE_string("split", None, "Split to translate (default: config.data.test_split).")
  flags.DEFINE_integer("num_sentences", 0, "Only the first N (0: all).")
  flags.DEFINE_integer("threads", os.cpu_count() or 1, "CPU threads per engine.")
  flags.DEFINE_integer("batch_size", 64, "Sentences per CTranslate2 / generate() call.")
  flags.DEFINE_enum("ct2_device", "cpu", ["cpu", "cuda"],
                    "Where CTranslate2 translates (transformers stays on the CPU).")
  flags.DEFINE_integer("rounds", 3, "Timed passes of each engine, taking turns; the median counts.")
  flags.DEFINE_bool("greedy", True, "Also time greedy search: the project's and CTranslate2 "
                    "float32's under the project's length limits.")
  flags.DEFINE_bool("huggingface", True, "Time transformers too, when it is installed.")
  flags.DEFINE_bool("unshrunk", False, "Also time the project's searches with every sentence "
                    "kept until its batch ends (translate_texts(shrink=False)): what finished "
                    "sentences leaving the batch save, and a check that they change nothing.")
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


def measure(workdir: str, split: str | None, num_sentences: int, threads: int,
            batch_size: int, ct2_device: str = "cpu", *, rounds: int = 3, greedy: bool = True,
            huggingface: bool = True, unshrunk: bool = False) -> dict:
  """Sentences per second of each engine on `split` of the workdir's dataset."""
  import ctranslate2

  from transformer.data import input_pipeline
  from transformer.decoding import translate
  from transformer.export import ctranslate2_search
  from transformer.export import model_source
  from transformer.export import to_ctranslate2
  from transformer.model import transformer as model_lib

  source = model_source.load(workdir, 1)
  config = source.config
  split = split or config.data.test_split
  pairs = input_pipeline.load_split(config, workdir, split)
  sentences = [s for s, _ in pairs][:num_sentences or None]
  d = config.decode
  model = model_lib.build_model(config)
  beam = f"beam {int(d.beam_size)}"
  engines = []  # (engine, search, fn): each fn translates `sentences`

  def project(config, shrink=True):
    return lambda: translate.translate_texts(model, source.params, source.tokenizer, sentences,
                                             config, progress=False, shrink=shrink)

  import jax

  ours = f"project (JAX, XLA:{jax.default_backend().upper()})"
  searches = [(beam, config)]
  if greedy:
    greedy_config = copy.deepcopy(config)
    greedy_config.decode.beam_size = 1
    searches.append(("greedy", greedy_config))
  engines.extend((ours, search, project(c)) for search, c in searches)
  if unshrunk:
    engines.extend((f"{ours}, finished sentences kept", search, project(c, shrink=False))
                   for search, c in searches)
  tok = source.tokenizer
  pieces = [[tok.piece(i) for i in tok.encode(s)] for s in sentences]
  piece_ids = {tok.piece(i): i for i in range(tok.vocab_size)}
  with tempfile.TemporaryDirectory() as tmp:
    for quantization in ("float32", "int8"):
      folder = to_ctranslate2.export(source, pathlib.Path(tmp) / quantization, quantization)
      translator = ctranslate2.Translator(str(folder), device=ct2_device,
                                          intra_threads=threads)

      def native(translator=translator):
        out = translator.translate_batch(
            pieces, beam_size=int(d.beam_size), length_penalty=float(d.length_penalty),
            max_batch_size=batch_size, min_decoding_length=0,
            max_decoding_length=max(map(len, pieces)) + 1 + int(d.max_extra_len))
        return [tok.decode([piece_ids.get(p, 0) for p in r.hypotheses[0]]) for r in out]

      def exact(beam_size, translator=translator):
        return lambda: ctranslate2_search.translate(
            translator, tok, sentences, beam_size=beam_size, alpha=float(d.length_penalty),
            max_extra_len=int(d.max_extra_len), max_len=config.model.max_len,
            max_batch_size=batch_size)

      name = f"CTranslate2 {quantization} ({ct2_device})"
      engines.append((f"{name}, translate_batch", beam, native))
      engines.append((f"{name}, project's ranking", beam, exact(int(d.beam_size))))
      if greedy and quantization == "float32":
        engines.append((f"{name}, project's limits", "greedy", exact(1)))
    if huggingface:
      engines.extend(_huggingface(source, sentences, threads, batch_size, tmp, beam))
    outputs, seconds = take_turns([(f"{engine}, {search}", fn) for engine, search, fn in engines],
                                  rounds)
  reference = {search: out for (engine, search, _), out in zip(engines, outputs)
               if engine == ours}
  rows = [dict(engine=engine, search=search, seconds=s,
               sentences_per_second=len(sentences) / s,
               differ=sum(a != b for a, b in zip(reference[search], out)))
          for (engine, search, _), out, s in zip(engines, outputs, seconds)]
  return {"workdir": workdir, "split": split, "num_sentences": len(sentences),
          "beam_size": int(d.beam_size), "alpha": float(d.length_penalty), "threads": threads,
          "rounds": rounds,
          "device": f"JAX on {jax.devices()[0].device_kind}, CTranslate2 on {ct2_device}, CPU "
                    f"{threads} threads ({platform.processor() or platform.machine()})",
          "rows": rows}


def ratios_to_ctranslate2(rows: list[dict]) -> dict[str, float]:
  """The project's sentences/s over CTranslate2 float32's under the project's ranking and
  limits, for each search that has both rows."""
  def speed(search, match):
    return next((r["sentences_per_second"] for r in rows
                 if r["search"] == search and match(r["engine"])), None)

  ratios = {}
  for search in dict.fromkeys(r["search"] for r in rows):
    ours = speed(search, lambda e: e.startswith("project (") and e.endswith(")"))
    theirs = speed(search, lambda e: e.startswith("CTranslate2 float32") and "project's" in e)
    if ours and theirs:
      ratios[search] = ours / theirs
  return ratios


def _huggingface(source, sentences, threads, batch_size, tmp, beam) -> list[tuple]:
  try:
    import torch
    from transformers import MarianMTModel, MarianTokenizer
  except ImportError:
    return []
  from transformer.export import huggingface_search
  from transformer.export import to_huggingface

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

  return [(f"transformers MarianMTModel (PyTorch), {how}", beam, fn)
          for how, fn in (("generate()", generate), ("project's ranking", exact))]


def main(argv):
  del argv
  f = flags.FLAGS
  result = measure(f.workdir, f.split, f.num_sentences, f.threads, f.batch_size,
                   f.ct2_device, rounds=f.rounds, greedy=f.greedy, huggingface=f.huggingface,
                   unshrunk=f.unshrunk)
  print(f"{result['num_sentences']} sentences of {result['split']}, beam {result['beam_size']}, "
        f"alpha {result['alpha']}, {result['device']}, median of {result['rounds']} turns")
  print(f"{'engine':<58} {'search':>7} {'sent/s':>8} {'differ':>7}")
  for row in result["rows"]:
    print(f"{row['engine']:<58} {row['search']:>7} {row['sentences_per_second']:8.1f} "
          f"{row['differ']:7d}")
  for search, ratio in ratios_to_ctranslate2(result["rows"]).items():
    print(f"{search}: the project at {ratio:.2f}x CTranslate2 float32 under the project's rule")
  output = pathlib.Path(f.output or os.path.join(f.workdir, "eval", "speed.json"))
  output.parent.mkdir(parents=True, exist_ok=True)
  output.write_text(json.dumps(result, indent=2) + "\n")
  print(f"written: {output}")


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
