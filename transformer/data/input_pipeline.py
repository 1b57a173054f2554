"""Training and evaluation batches: filter → tokenize (cached) → batches of ~N tokens → shard.

Glossary: B rows of a batch, S source length, T target length, P processes, N tokens.

Batches by token count (paper §5.1). `config.data.tokens_per_batch` is the number of token
slots per side and per step across all processes (the padded size, as tensor2tensor and
fairseq count it); each process makes `tokens_per_batch / P` of them, in length buckets or
packed rows (`batch_layouts`).

Determinism and resumption. The batch at step k is a pure function of the seed, the data and
k (`batch_layouts`). The training iterator (`train_iterator`) is a grain `MapDataset` over
step numbers, read ahead by grain's threads; its state is the next step number and what the
order depends on, so a resumed run continues with exactly the batches an uninterrupted run
would have seen, or, when the number of processes or devices (the batch shapes), the seed or
the data changed, is refused in one line unless the config opts into a new order
(`train_iterator`).

Sharding. Process p owns every P-th kept training pair (`jax.process_index()`,
`jax.process_count()`) and reads only those pairs' tokens (memory-mapped); only the per-pair
length table is read whole, to agree on the bucket schedule. Evaluation batches split each
batch of the dev set into per-process slices, padding the last with all-PAD rows, which carry
no loss weight.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

import jax
import numpy as np
from absl import logging

from transformer.data import batch_layouts
from transformer.data import datasets
from transformer.data import tokenizer as tokenizer_lib
from transformer.data import train_iterator
from transformer import errors
from transformer.errors import ConfigError


@dataclasses.dataclass
class Datasets:
  """What training and evaluation read."""

  tokenizer: tokenizer_lib.Tokenizer
  train: train_iterator.TrainIterator  # infinite; next() -> batch dict; get/set_state
  # The dev split for loss, every pair once; None when config.data.eval_split is ''.
  eval_batches: Callable[[], Iterator[dict]] | None
  splits: dict[str, list[tuple[str, str]]]  # eval/test split -> (source, reference) raw text
  stats: dict = dataclasses.field(default_factory=dict)  # counts, shapes, padding efficiency


def _eval_plan(config, split: datasets.TokenizedSplit, rows_multiple: int):
  """(pairs, width, rows) of each of this process's dev batches; every process gets the same
  shapes, and each pair is in exactly one process's batch."""
  cap = config.model.max_len
  length = np.minimum(np.maximum(split.src_lens, split.tgt_lens) + 1, cap)
  bounds = batch_layouts.bucket_boundaries(config)
  while bounds[-1] < length.max(initial=0):
    bounds.append(min(bounds[-1] * 2, cap))
  bucket = np.searchsorted(bounds, length)
  num, p, plan = jax.process_count(), jax.process_index(), []
  for b, width in enumerate(bounds):
    ex = np.flatnonzero(bucket == b)
    rows = max(batch_layouts.rows_per_process(config, width, rows_multiple), rows_multiple)
    for start in range(0, len(ex), rows * num):
      plan.append((ex[start + p * rows:start + (p + 1) * rows], width, rows))
  return plan


def create_datasets(config, workdir: str, *, rows_multiple: int = 1) -> Datasets:
  """Reads (and on first use tokenizes and caches) the corpus of `config.data`.

  Args:
    config: the experiment config.
    workdir: the run folder; the cache lives in `config.data.cache_dir` or `WORKDIR/data`.
    rows_multiple: every batch's row count is a multiple of this (local data-parallel devices).

  Returns:
    `Datasets` with the tokenizer, the training iterator, dev batches and raw eval/test text.
  """
  data = config.data
  batch_layouts.check_fits_devices(config, rows_multiple)
  cache = datasets.cache_dir(config, workdir)

  def writing():
    """The corpus (the synthetic pair's files) and the tokenized splits are written to the
    cache on first use; a full disk there is one line (the vocabulary names itself)."""
    return errors.writing("the data cache (corpus files, tokenized splits)", cache)

  with writing():
    sources = datasets.split_sources(config, cache, ("train", data.eval_split, data.test_split))

  def prepare(build: bool):
    with writing():
      tok = tokenizer_lib.get_or_train(config, cache, sources["train"])
      return tok, {s: datasets.tokenize(sources[s], tok, cache, build=build)
                   for s in ("train", data.eval_split) if s}

  if jax.process_count() > 1:  # process 0 trains the vocabulary and fills the cache first
    from jax.experimental import multihost_utils

    if jax.process_index() == 0:
      prepare(build=True)
    multihost_utils.sync_global_devices("transformer.data.input_pipeline: data cache ready")
  tok, tokenized = prepare(build=jax.process_index() == 0)

  train = tokenized["train"]
  empty = (train.src_lens == 0) | (train.tgt_lens == 0)
  long = ~empty & ((train.src_lens + 1 > data.max_source_len) |
                   (train.tgt_lens + 1 > data.max_target_len))
  kept = np.flatnonzero(~(empty | long))
  logging.info("train: %d pairs, %d kept; dropped %d with an empty side and %d longer than "
               "max_source_len=%d / max_target_len=%d tokens (EOS included)", len(train),
               len(kept), empty.sum(), long.sum(), data.max_source_len, data.max_target_len)
  if not len(kept):
    raise ConfigError(
        f"the training set is empty after filtering: of {len(train)} pairs in "
        f"{sources['train'].description}, {empty.sum()} have an empty side and {long.sum()} "
        f"exceed config.data.max_source_len={data.max_source_len} / max_target_len="
        f"{data.max_target_len} tokens (EOS included)")
  make_layout = batch_layouts.PackedLayout if data.packing else batch_layouts.BucketLayout
  layout = make_layout(config, train, kept, rows_multiple)
  pipeline = train_iterator.Pipeline(
      seed=config.seed, cache=datasets.tokenized_cache_path(sources["train"], tok, cache).name,
      kept=len(kept), shapes=tuple(layout.shapes), packing=bool(data.packing),
      processes=jax.process_count(), rows_multiple=rows_multiple)
  stats = dict(train_pairs=len(train), kept_pairs=len(kept), dropped_empty=int(empty.sum()),
               dropped_too_long=int(long.sum()), shapes=layout.shapes,
               num_shapes=len(layout.shapes), batches_per_epoch=layout.batches_per_epoch(),
               padding_efficiency_source=layout.efficiency[0],
               padding_efficiency_target=layout.efficiency[1])
  logging.info("train batches (%s): %d shape(s) [rows, source, target] %s, ~%d per epoch; "
               "padding efficiency (real tokens / slots) source %.1f%%, target %.1f%%",
               "packed" if data.packing else "length buckets", len(layout.shapes),
               layout.shapes, stats["batches_per_epoch"], 100 * layout.efficiency[0],
               100 * layout.efficiency[1])

  eval_batches = None
  if data.eval_split:
    dev = tokenized[data.eval_split]
    plan = _eval_plan(config, dev, rows_multiple)
    # [rows, source, target] of each dev batch, in the order `eval_batches` yields them.
    stats["eval_batch_shapes"] = [(rows, w, w) for _, w, rows in plan]
    logging.info("%s: %d pairs in %d batches of %d shape(s)", data.eval_split, len(dev),
                 len(plan), len(set(stats["eval_batch_shapes"])))

    def eval_batches() -> Iterator[dict[str, np.ndarray]]:
      for ex, width, rows in plan:
        zeros = np.zeros(len(ex), np.int64)
        yield batch_layouts.make_batch(dev, ex, np.arange(len(ex)), zeros, zeros, (rows, width),
                                       packed=False, cap=config.model.max_len)

  splits = {s: list(sources[s].pairs()) for s in (data.eval_split, data.test_split) if s}
  train_iter = train_iterator.TrainIterator(
      layout.batch, pipeline, threads=data.read_threads, prefetch=data.prefetch_batches,
      allow_new_order=data.allow_new_order_on_resume)
  return Datasets(tokenizer=tok, train=train_iter, eval_batches=eval_batches, splits=splits,
                  stats=stats)


def load_split(config, workdir: str, split: str) -> list[tuple[str, str]]:
  """The raw (source, reference) pairs of one split, in order, for evaluation."""
  sources = datasets.split_sources(config, datasets.cache_dir(config, workdir), (split,))
  return list(sources[split].pairs())
