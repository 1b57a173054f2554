"""Input suite: how fast the pipeline delivers training batches from its on-disk cache.

  python -m benchmarks --config=configs/tatoeba_small.py --suite=input

Two corpora, each in length buckets (with grain's reader threads, and without) and packed:
  * the config's own corpus (e.g. Tatoeba), at its `tokens_per_batch`;
  * news sentences at the paper's batch shape: newstest2013+2014 from ../shared/data (or
    $TRANSFORMER_SHARED_DATA) repeated to ~96k pairs (long news sentences, up to 256 tokens,
    25,000 token slots per batch); without them this part is skipped with a one-line note.
It also times the one-off costs: training the vocabulary, tokenizing the corpus into the cache,
and a warm start that finds both cached. The consumer here only counts tokens, so these rates
are what the pipeline can supply; the goal is ≥ 500,000 target tokens/s, well above what one
accelerator consumes.
"""

from __future__ import annotations

import copy
import os
import pathlib
import shutil
import time

import jax
import numpy as np

from configs import tatoeba_small
from transformer.data import input_pipeline

_NEWS_FILES = tuple(f"newstest{year}.{lang}" for year in (2013, 2014) for lang in ("en", "de"))
_NEWS_REPEAT = 16


def _throughput(data, seconds: float = 3.0) -> dict:
  """Batches/s, real target tokens/s and slots/s of `data.train` over ≥ `seconds`."""
  it = data.train
  for _ in range(3):  # start the reader threads and fill the read-ahead buffer
    next(it)
  batches = tokens = slots = 0
  start = time.perf_counter()
  while time.perf_counter() - start < seconds or batches < 20:
    batch = next(it)
    batches += 1
    tokens += int(np.count_nonzero(batch["targets"]))
    slots += batch["targets"].size
  elapsed = time.perf_counter() - start
  return dict(batches_per_s=batches / elapsed, target_tokens_per_s=tokens / elapsed,
              target_slots_per_s=slots / elapsed, target_tokens_per_batch=tokens / batches)


def _write_news(news: pathlib.Path, folder: pathlib.Path) -> None:
  folder.mkdir(parents=True, exist_ok=True)
  for lang in ("en", "de"):
    lines = []
    for year in (2013, 2014):
      lines += (news / f"newstest{year}.{lang}").read_text(encoding="utf-8").splitlines()
    text = "\n".join(lines) + "\n"
    (folder / f"train.{lang}").write_text(text * _NEWS_REPEAT, encoding="utf-8")
    for split in ("valid", "test"):
      (folder / f"{split}.{lang}").write_text("\n".join(lines[:500]) + "\n", encoding="utf-8")


def _corpus(name: str, config, workdir: str) -> list[dict]:
  """Cold start, warm start and the throughput of three layouts for one corpus."""
  rows = []
  config = copy.deepcopy(config)
  config.data.cache_dir = str(pathlib.Path(workdir) / f"input-cache-{name.split()[0]}")
  shutil.rmtree(config.data.cache_dir, ignore_errors=True)  # its own cache: a true cold start
  start = time.perf_counter()
  data = input_pipeline.create_datasets(config, workdir)
  cold = time.perf_counter() - start
  start = time.perf_counter()
  data = input_pipeline.create_datasets(config, workdir)
  warm = time.perf_counter() - start
  setup = dict(corpus=name, pairs=data.stats["train_pairs"], cold_start_s=cold,
               warm_start_s=warm)
  for layout, overrides in (("buckets", {}), ("buckets, no threads", dict(read_threads=0)),
                            ("packed", dict(packing=True))):
    variant = copy.deepcopy(config)
    variant.data.update(overrides)
    data = input_pipeline.create_datasets(variant, workdir)
    stats = data.stats
    rows.append(dict(setup, layout=layout, tokens_per_batch=variant.data.tokens_per_batch,
                     num_shapes=stats["num_shapes"],
                     padding_efficiency=stats["padding_efficiency_target"],
                     **_throughput(data)))
  return rows


def run(config, workdir: str) -> dict:
  """Measures the pipeline on the config's corpus and on news text; prints a table."""
  results, notes = [], []
  try:
    results += _corpus("config", config, workdir)
  except ValueError as e:  # e.g. an unprepared TFDS dataset: report it, measure the rest
    notes.append(f"config corpus skipped: {e}")
  news_dir = tatoeba_small.shared_data_dir() / "wmt-newstest-ende"
  missing = [name for name in _NEWS_FILES if not (news_dir / name).is_file()]
  if not missing:
    news = copy.deepcopy(config)
    folder = pathlib.Path(workdir) / "news-x16"
    _write_news(news_dir, folder)
    news.model.vocab_size = 8000
    news.model.max_len = max(news.model.max_len, 256)
    news.data.update(dataset="files", files_dir=str(folder), source_lang="en",
                     target_lang="de", vocab_path="", max_source_len=256, max_target_len=256,
                     tokens_per_batch=25_000, bucket_boundaries=(), packed_length=0)
    results += _corpus(f"newstest x{_NEWS_REPEAT}", news, workdir)
  else:
    notes.append(f"news corpus skipped: needs newstest2013/14 of ../shared/data "
                 f"({news_dir / missing[0]} is missing); set "
                 f"{tatoeba_small.SHARED_DATA_ENV}=/path/to/data to measure it")

  cores = len(os.sched_getaffinity(0))
  # The pipeline runs on the host CPU whatever the accelerator; name both.
  device = f"host CPU, {cores} cores available (accelerator: {jax.devices()[0].device_kind})"
  print(f"\ninput pipeline throughput from the on-disk cache — {device}")
  print(f"{'corpus':<16}{'layout':<22}{'tokens/batch':>13}{'shapes':>7}{'pad eff':>8}"
        f"{'batches/s':>11}{'tgt tokens/s':>14}")
  for r in results:
    print(f"{r['corpus']:<16}{r['layout']:<22}{r['tokens_per_batch']:>13,}{r['num_shapes']:>7}"
          f"{r['padding_efficiency']:>8.1%}{r['batches_per_s']:>11.1f}"
          f"{r['target_tokens_per_s']:>14,.0f}")
  for name in dict.fromkeys(r["corpus"] for r in results):
    r = next(x for x in results if x["corpus"] == name)
    print(f"{name}: {r['pairs']:,} pairs; first run (vocabulary + tokenizing) "
          f"{r['cold_start_s']:.1f} s, cached start {r['warm_start_s']:.2f} s")
  for note in notes:
    print(note)
  slowest = min((r["target_tokens_per_s"] for r in results), default=0.0)
  print(f"goal ≥ 500,000 target tokens/s: slowest layout {slowest:,.0f} "
        f"({'met' if slowest >= 5e5 else 'NOT met'})")
  return dict(cpu_cores=cores, results=results, notes=notes, goal_target_tokens_per_s=5e5,
              slowest_target_tokens_per_s=slowest)
