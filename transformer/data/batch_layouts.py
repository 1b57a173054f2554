"""How training pairs are laid out in batches of ~N token slots (paper §5.1), and the batch at
each step: a pure function of the seed, the data and the step.

Glossary: B rows of a batch, L row length, P processes, N tokens.

Two layouts:
  * buckets (`BucketLayout`, the paper's "batched together by approximate sequence length"): a
    pair goes to the smallest bucket length ≥ its longer side (EOS included); a bucket of
    length L makes batches of `[tokens_per_batch / P / L]` rows rounded down to
    `rows_multiple`, always full, so XLA compiles one program per bucket. Each bucket cycles
    through its pairs in a fresh seeded order every pass, and the bucket of each step follows
    a seeded shuffle of each epoch's bucket counts (the same on every process, so all
    processes build batches of the same shape at every step);
  * packing (`PackedLayout`, `packing=True`, a departure): pairs placed one after another in
    rows of `packed_length`, with 1-based `*_segmentation` ids and per-pair `*_positions`; one
    shape.
Process p owns every P-th kept training pair and reads only those pairs' tokens.
"""

from __future__ import annotations

import bisect
import functools
import math
import threading

import jax
import numpy as np

from transformer.data import datasets
from transformer.errors import ConfigError
from transformer.tokens import EOS_ID

# Automatic bucket lengths: from 8, multiples of 4 growing by about ×1.2. Up to 256 tokens this
# is 17 shapes; on newstest2013 (EN-DE, 37k BPE) about 82% (source) / 89% (target) of the
# slots hold real tokens; ×1.3 would give 13 shapes and 79% / 86%. Padding comes mostly from
# the shorter side of each pair, as both sides of a bucket share its length.
_BUCKET_GROWTH = 1.2
_BUCKET_STEP = 4
_OPEN_ROWS = 8  # rows packing keeps open (first fit)


def bucket_boundaries(config) -> list[int]:
  """Bucket lengths (longer side of a pair, EOS included), ending at the longest allowed pair."""
  data = config.data
  longest = max(data.max_source_len, data.max_target_len)
  if data.bucket_boundaries:
    bounds = sorted({int(b) for b in data.bucket_boundaries if int(b) < longest})
    return bounds + [longest]
  bounds = [8]
  while bounds[-1] < longest:
    grown = math.ceil(bounds[-1] * _BUCKET_GROWTH / _BUCKET_STEP) * _BUCKET_STEP
    bounds.append(max(bounds[-1] + _BUCKET_STEP, grown))
  return [b for b in bounds if b < longest] + [longest]


def rows_per_process(config, length: int, rows_multiple: int) -> int:
  """Rows per process of a batch whose rows are `length` tokens long."""
  per_process = config.data.tokens_per_batch // jax.process_count()
  return per_process // length // rows_multiple * rows_multiple


def check_fits_devices(config, rows_multiple: int) -> None:
  """One-line error when a batch cannot give every local device a row (the static data
  settings are `config_checks.validate`'s)."""
  if rows_multiple < 1:
    raise ConfigError(f"rows_multiple={rows_multiple} must be ≥ 1")
  data = config.data
  width = max(data.max_source_len, data.max_target_len)
  if data.packing:
    width = data.packed_length or width
  if rows_per_process(config, width, rows_multiple) < rows_multiple:
    need = width * rows_multiple * jax.process_count()
    raise ConfigError(
        f"config.data.tokens_per_batch={data.tokens_per_batch} is smaller than one maximal "
        f"pair: the longest rows hold {width} tokens and each of the {jax.process_count()} "
        f"process(es) needs {rows_multiple} row(s) (one per local data-parallel device), so "
        f"it must be ≥ {need}")


def _fill(tokens, starts, lens, ex, rows, cols, shape, with_segments: bool) -> dict:
  """Writes pairs `ex` (one side) at (`rows`, `cols`), each followed by EOS.

  Args:
    tokens, starts, lens: a side of a `TokenizedSplit` (lengths without EOS, already capped
      to fit the row).
    ex: pair indices; rows, cols: where each pair starts in the `shape` [B, L] output.
    shape: (B, L).
    with_segments: also return 1-based segment ids (per row) and per-pair positions.

  Returns:
    {'ids': int32 [B, L]} (+ 'segmentation', 'positions').
  """
  n = lens.astype(np.int64)
  width = shape[1]
  first = rows.astype(np.int64) * width + cols  # flat slot of each pair's first token
  within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
  out = {"ids": np.zeros(shape, np.int32)}
  flat = out["ids"].reshape(-1)
  flat[np.repeat(first, n) + within] = tokens[np.repeat(starts[ex], n) + within]
  flat[first + n] = EOS_ID
  if with_segments:
    n1 = n + 1
    within1 = np.arange(int(n1.sum())) - np.repeat(np.cumsum(n1) - n1, n1)
    slots = np.repeat(first, n1) + within1
    # Segment ids count the pairs of each row from 1 (rows are given in order).
    new_row = np.ones(len(rows), bool)
    new_row[1:] = rows[1:] != rows[:-1]
    run_start = np.maximum.accumulate(np.where(new_row, np.arange(len(rows)), 0))
    seg = np.arange(len(rows)) - run_start + 1
    out["segmentation"] = np.zeros(shape, np.int32)
    out["positions"] = np.zeros(shape, np.int32)
    out["segmentation"].reshape(-1)[slots] = np.repeat(seg, n1)
    out["positions"].reshape(-1)[slots] = within1
  return out


def make_batch(split: datasets.TokenizedSplit, ex, rows, src_cols, tgt_cols, shape,
               packed: bool, cap: int | None = None) -> dict[str, np.ndarray]:
  """The batch of pairs `ex` of `split`, each at (`rows`, `*_cols`) in arrays of `shape`
  [B, L]; with `cap`, each side cut to `cap - 1` tokens before its EOS."""
  src_lens, tgt_lens = split.src_lens[ex], split.tgt_lens[ex]
  if cap is not None:  # evaluation keeps over-long pairs, cut to the model's positions
    src_lens, tgt_lens = np.minimum(src_lens, cap - 1), np.minimum(tgt_lens, cap - 1)
  src = _fill(split.src_tokens, split.src_starts, src_lens, ex, rows, src_cols, shape, packed)
  tgt = _fill(split.tgt_tokens, split.tgt_starts, tgt_lens, ex, rows, tgt_cols, shape, packed)
  batch = {"inputs": src["ids"], "targets": tgt["ids"]}
  if packed:
    batch.update(inputs_segmentation=src["segmentation"], inputs_positions=src["positions"],
                 targets_segmentation=tgt["segmentation"], targets_positions=tgt["positions"])
  return batch


@functools.lru_cache(maxsize=256)
def _permutation(seed: int, stream: tuple, n: int) -> np.ndarray:
  """A seeded order of `n` items for one pass of one stream (cached: batches reuse it)."""
  return np.random.default_rng([seed, *stream]).permutation(n)


class BucketLayout:
  """Full batches of a few fixed shapes; a seeded, resumable schedule of buckets."""

  def __init__(self, config, split, kept: np.ndarray, rows_multiple: int):
    self.split, self.seed = split, config.seed
    p, num = jax.process_index(), jax.process_count()
    self.process = p
    length = np.maximum(split.src_lens[kept], split.tgt_lens[kept]) + 1
    bounds = bucket_boundaries(config)
    bucket = np.searchsorted(bounds, length)
    owner = np.arange(len(kept)) % num

    def per_process(bucket, num_buckets):  # [P, buckets] pair counts
      counts = np.zeros((num, num_buckets), np.int64)
      np.add.at(counts, (owner, bucket), 1)
      return counts

    # Drop bucket lengths some process has no pair for: their pairs go to the next bucket
    # (the longest such buckets join the last kept one), so every process fills every shape.
    counts, kept_bounds, pending = per_process(bucket, len(bounds)), [], np.zeros(num, np.int64)
    for i, b in enumerate(bounds):
      pending += counts[:, i]
      if (pending > 0).all():
        kept_bounds.append(b)
        pending[:] = 0
    if not kept_bounds:
      raise ConfigError(f"the {len(kept)} training pairs cannot be shared by {num} processes")
    if pending.any():
      kept_bounds[-1] = bounds[-1]
    self.bounds = kept_bounds
    bucket = np.searchsorted(self.bounds, length)
    self.rows = [rows_per_process(config, b, rows_multiple) for b in self.bounds]
    self.members = [kept[(owner == p) & (bucket == i)] for i in range(len(self.bounds))]
    # Batches of each bucket per epoch: enough for the process with the most of its pairs, so
    # that every process sees all of its pairs every epoch.
    most = per_process(bucket, len(self.bounds)).max(0)
    self.per_epoch = [-(-int(c) // r) for c, r in zip(most, self.rows)]
    self.shapes = [(r, b, b) for r, b in zip(self.rows, self.bounds)]
    self._schedule = functools.lru_cache(maxsize=4)(self._make_schedule)
    # Expected real tokens / slots over an epoch: rows are always full of pairs of the bucket.
    slots = sum(n * r * b for n, r, b in zip(self.per_epoch, self.rows, self.bounds))
    self.efficiency = tuple(
        sum(n * r * (float(np.mean(side[bucket == i])) + 1)
            for i, (n, r) in enumerate(zip(self.per_epoch, self.rows))) / slots
        for side in (split.src_lens[kept], split.tgt_lens[kept]))

  def batches_per_epoch(self) -> int:
    return sum(self.per_epoch)

  def _make_schedule(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """(bucket of each step of `epoch`, how many earlier steps of the epoch used it)."""
    labels = np.repeat(np.arange(len(self.bounds)), self.per_epoch)
    order = np.random.default_rng([self.seed, 1, epoch]).permutation(len(labels))
    sched = labels[order]
    by_bucket = np.argsort(sched, kind="stable")
    first = np.searchsorted(sched[by_bucket], np.arange(len(self.bounds)))
    rank = np.empty(len(sched), np.int64)
    rank[by_bucket] = np.arange(len(sched)) - first[sched[by_bucket]]
    return sched, rank

  def batch(self, step: int) -> dict[str, np.ndarray]:
    epoch, i = divmod(step, self.batches_per_epoch())
    sched, rank = self._schedule(epoch)
    b = int(sched[i])
    rows, members = self.rows[b], self.members[b]
    j = epoch * self.per_epoch[b] + int(rank[i])
    passes, offsets = np.divmod(j * rows + np.arange(rows), len(members))
    ex = np.empty(rows, np.int64)
    for q in np.unique(passes):  # a batch can straddle two passes over its bucket
      sel = passes == q
      perm = _permutation(self.seed, (2, self.process, b, int(q)), len(members))
      ex[sel] = members[perm[offsets[sel]]]
    zeros = np.zeros(rows, np.int64)
    return make_batch(self.split, ex, np.arange(rows), zeros, zeros, (rows, self.bounds[b]),
                      packed=False)


class PackedLayout:
  """Rows of `packed_length` filled with whole pairs of a seeded order (first fit)."""

  def __init__(self, config, split, kept: np.ndarray, rows_multiple: int):
    data = config.data
    self.split, self.seed, self.process = split, config.seed, jax.process_index()
    self.width = data.packed_length or max(data.max_source_len, data.max_target_len)
    self.rows = rows_per_process(config, self.width, rows_multiple)
    self.members = kept[jax.process_index()::jax.process_count()]
    if not len(self.members):
      raise ConfigError(f"the {len(kept)} training pairs cannot be shared by "
                       f"{jax.process_count()} processes")
    self.shapes = [(self.rows, self.width, self.width)]
    self._pass = functools.lru_cache(maxsize=3)(self._make_pass)
    self._cum_rows = [0]  # rows before each pass, computed pass by pass
    self._lock = threading.Lock()
    order, starts = self._pass(0)
    real = [int(lens[order].sum()) + len(order) for lens in (split.src_lens, split.tgt_lens)]
    self.efficiency = tuple(r / ((len(starts) - 1) * self.width) for r in real)

  def batches_per_epoch(self) -> int:
    return -(-(len(self._pass(0)[1]) - 1) // self.rows)

  def _make_pass(self, q: int) -> tuple[np.ndarray, list[int]]:
    """(pairs of pass `q`, grouped by row, each row in order; index of each row's first pair
    plus a final end).

    First fit over the last `_OPEN_ROWS` rows: a pair goes into the oldest open row with room
    on both sides, else opens a row (closing the oldest). On shuffled pairs this fills ~97%
    of target slots where filling one row at a time fills ~85%, at ~0.6 µs per pair.
    """
    order = self.members[_permutation(self.seed, (3, self.process, q), len(self.members))]
    row_of, open_ids, free_s, free_t, width, rows = [], [], [], [], self.width, 0
    for a, b in zip((self.split.src_lens[order] + 1).tolist(),
                    (self.split.tgt_lens[order] + 1).tolist()):
      for k in range(len(open_ids)):
        if free_s[k] >= a and free_t[k] >= b:
          free_s[k] -= a
          free_t[k] -= b
          row_of.append(open_ids[k])
          break
      else:
        if len(open_ids) == _OPEN_ROWS:
          del open_ids[0], free_s[0], free_t[0]
        open_ids.append(rows)
        free_s.append(width - a)
        free_t.append(width - b)
        row_of.append(rows)
        rows += 1
    row_of = np.asarray(row_of, np.int64)
    starts = np.zeros(rows + 1, np.int64)
    np.cumsum(np.bincount(row_of, minlength=rows), out=starts[1:])
    return order[np.argsort(row_of, kind="stable")], starts.tolist()

  def _locate(self, row: int) -> tuple[int, int]:
    """(pass, row within it) of the `row`-th row since the start."""
    with self._lock:  # grain's reader threads extend the table concurrently
      while self._cum_rows[-1] <= row:
        q = len(self._cum_rows) - 1
        self._cum_rows.append(self._cum_rows[-1] + len(self._pass(q)[1]) - 1)
      q = bisect.bisect_right(self._cum_rows, row) - 1
      return q, row - self._cum_rows[q]

  def batch(self, step: int) -> dict[str, np.ndarray]:
    parts, row, end = [], step * self.rows, (step + 1) * self.rows
    while row < end:  # the batch's rows, pass by pass
      q, r = self._locate(row)
      order, starts = self._pass(q)
      r_end = min(len(starts) - 1, r + end - row)
      ex = order[starts[r]:starts[r_end]]
      counts = np.diff(starts[r:r_end + 1])
      parts.append((ex, np.repeat(np.arange(r_end - r) + row - step * self.rows, counts)))
      row += r_end - r
    ex = np.concatenate([p[0] for p in parts])
    rows = np.concatenate([p[1] for p in parts])
    new_row = np.r_[True, rows[1:] != rows[:-1]]
    cols = []
    for lens in (self.split.src_lens[ex] + 1, self.split.tgt_lens[ex] + 1):
      c = np.cumsum(lens) - lens  # exclusive running sum, restarted at each row
      cols.append(c - np.maximum.accumulate(np.where(new_row, c, 0)))
    return make_batch(self.split, ex, rows, cols[0], cols[1], (self.rows, self.width),
                      packed=True)
