"""Token-count batches: contents, budget, shapes, determinism, resumption, sharding, packing."""

import collections
import hashlib
import json
import logging
import pathlib
import random

import jax
import numpy as np
import pytest

from configs import base
from tests import support
from tests.support import DE, EN
from transformer.data import batch_layouts
from transformer.data import input_pipeline
from transformer.errors import ConfigError
from transformer.model import transformer as model_lib
from transformer.tokens import EOS_ID, PAD_ID

LONG = " ".join(EN * 3)  # ~100 tokens: over the training limit


def write_corpus(folder, sizes=(("train", 600), ("valid", 50), ("test", 40)), min_words=1):
  """Unique random pairs; train has an empty source and an over-long pair, valid a long one."""
  rng, seen = random.Random(0), set()
  folder.mkdir(parents=True, exist_ok=True)
  corpus = {}
  for split, n in sizes:
    pairs = []
    while len(pairs) < n:
      idx = [rng.randrange(len(EN)) for _ in range(rng.randint(min_words, 25))]
      src = " ".join(EN[j] for j in idx)
      if src not in seen:
        seen.add(src)
        pairs.append((src, " ".join(DE[j] for j in reversed(idx))))
    if split == "train" and min_words == 1:
      pairs[3] = ("", pairs[3][1])
      pairs[7] = (LONG, pairs[7][1])
    if split == "valid":
      pairs[5] = (LONG, " ".join(DE * 3))
    for lang, side in (("en", 0), ("de", 1)):
      (folder / f"{split}.{lang}").write_text("\n".join(p[side] for p in pairs) + "\n")
    corpus[split] = pairs
  return corpus


@pytest.fixture
def corpus(tmp_path):
  return write_corpus(tmp_path / "corpus")


def make_config(tmp_path, **data):
  config = base.get_config()
  config.model.update(vocab_size=200, d_model=32, d_ff=64, num_heads=2, d_k=16, d_v=16,
                      num_layers=1, dropout_rate=0.0, max_len=64)
  config.data.update(dataset="files", files_dir=str(tmp_path / "corpus"), max_source_len=40,
                     max_target_len=40, tokens_per_batch=1024, cache_dir=str(tmp_path / "cache"),
                     read_threads=2, prefetch_batches=4)
  config.data.update(data)
  return config


def pair_ids(tok, pairs):
  """Independent reference: (source ids, target ids) of raw pairs, straight from SentencePiece."""
  return [(tuple(tok.encode(s)), tuple(tok.encode(t))) for s, t in pairs]


def kept_reference(config, tok, pairs):
  return {p for p in pair_ids(tok, pairs)
          if p[0] and p[1] and len(p[0]) < config.data.max_source_len
          and len(p[1]) < config.data.max_target_len}


def unpacked_rows(batch):
  """(source ids, target ids) of every row, checking each is ids + EOS + PAD only; an all-PAD
  (filler) row gives ((), ())."""
  out = []
  for src, tgt in zip(batch["inputs"], batch["targets"]):
    if not src.any() and not tgt.any():
      out.append(((), ()))
      continue
    row = []
    for ids in (src, tgt):
      n = int(np.argmax(ids == EOS_ID))
      assert ids[n] == EOS_ID and (ids[n + 1:] == PAD_ID).all() and (ids[:n] > EOS_ID).all()
      row.append(tuple(ids[:n].tolist()))
    out.append(tuple(row))
  return out


def fingerprint(batch) -> str:
  h = hashlib.sha256()
  for k in sorted(batch):
    h.update(k.encode() + str(batch[k].shape).encode() + batch[k].tobytes())
  return h.hexdigest()


def take(it, n):
  return [next(it) for _ in range(n)]


def test_bucket_batches_hold_whole_kept_pairs_within_the_budget(tmp_path, corpus):
  config = make_config(tmp_path)
  data = input_pipeline.create_datasets(config, str(tmp_path / "run"), rows_multiple=4)
  kept = kept_reference(config, data.tokenizer, corpus["train"])
  stats = data.stats
  assert stats["kept_pairs"] == len(kept) > 500
  assert (stats["dropped_empty"], stats["dropped_too_long"]) == (1, 600 - 1 - len(kept))
  bounds = batch_layouts.bucket_boundaries(config)
  assert stats["num_shapes"] == len(stats["shapes"]) <= len(bounds)
  epoch = stats["batches_per_epoch"]
  seen, real, slots = collections.Counter(), [0, 0], 0
  for batch in take(data.train, epoch):
    assert set(batch) == {"inputs", "targets"}
    rows, length = batch["inputs"].shape
    assert batch["inputs"].dtype == np.int32 and batch["targets"].shape == (rows, length)
    assert (rows, length, length) in stats["shapes"]
    assert rows % 4 == 0 and rows * length <= config.data.tokens_per_batch
    seen.update(unpacked_rows(batch))
    real[0] += int((batch["inputs"] != PAD_ID).sum())
    real[1] += int((batch["targets"] != PAD_ID).sum())
    slots += rows * length
  # One epoch shows every kept pair (a few twice, where a bucket's last batch wraps around).
  assert set(seen) == kept and max(seen.values()) <= 2
  assert real[0] / slots == pytest.approx(stats["padding_efficiency_source"], abs=0.03)
  assert real[1] / slots == pytest.approx(stats["padding_efficiency_target"], abs=0.03)


def test_same_seed_same_batches(tmp_path, corpus):
  config = make_config(tmp_path)
  a = [fingerprint(b) for b in take(input_pipeline.create_datasets(config, "r").train, 30)]
  b = [fingerprint(b) for b in take(input_pipeline.create_datasets(config, "r").train, 30)]
  config.seed = 1
  c = [fingerprint(b) for b in take(input_pipeline.create_datasets(config, "r").train, 30)]
  assert a == b and a != c


@pytest.mark.parametrize("packing", [False, True])
def test_resumed_iterator_sees_the_uninterrupted_batches(tmp_path, corpus, packing):
  config = make_config(tmp_path, packing=packing)
  uninterrupted = [fingerprint(b) for b in
                   take(input_pipeline.create_datasets(config, "r").train, 100)]
  first = input_pipeline.create_datasets(config, "r").train
  before = [fingerprint(b) for b in take(first, 37)]
  state = json.loads(json.dumps(first.get_state()))  # as stored in a checkpoint
  assert state["next_index"] == 37
  del first  # the run stops; a new process builds the pipeline and restores the position
  second = input_pipeline.create_datasets(config, "r").train
  second.set_state(state)
  after = [fingerprint(b) for b in take(second, 63)]
  assert before + after == uninterrupted


def test_packed_rows_hold_whole_pairs_with_segments_and_positions(tmp_path, corpus):
  config = make_config(tmp_path, packing=True, packed_length=48)
  data = input_pipeline.create_datasets(config, "r", rows_multiple=2)
  kept = kept_reference(config, data.tokenizer, corpus["train"])
  assert data.stats["shapes"] == [(20, 48, 48)] and data.stats["num_shapes"] == 1
  seen = collections.Counter()
  for batch in take(data.train, data.stats["batches_per_epoch"]):
    assert batch["inputs"].shape == batch["targets"].shape == (20, 48)
    for r in range(20):
      row_pairs = []
      for side in ("inputs", "targets"):
        ids, seg, pos = (batch[side][r], batch[f"{side}_segmentation"][r],
                         batch[f"{side}_positions"][r])
        assert ((seg == 0) == (ids == PAD_ID)).all() and (pos[seg == 0] == 0).all()
        pieces = []
        for s in range(1, seg.max() + 1):
          where = np.flatnonzero(seg == s)
          assert (np.diff(where) == 1).all() and (pos[where] == np.arange(len(where))).all()
          assert ids[where[-1]] == EOS_ID and (ids[where[:-1]] > EOS_ID).all()
          pieces.append(tuple(ids[where[:-1]].tolist()))
        row_pairs.append(pieces)
      assert len(row_pairs[0]) == len(row_pairs[1])  # the same pairs on both sides
      seen.update(zip(*row_pairs))
  assert set(seen) == kept and max(seen.values()) <= 2
  assert data.stats["padding_efficiency_target"] > 0.85


def _per_pair_losses(model, params, batch, segments=None):
  """Summed cross-entropy of each pair: per row, or per (row, segment) when packed."""
  kwargs = {k: batch[k] for k in batch if k not in ("inputs", "targets")}
  apply = jax.jit(lambda p, i, t, kw: jax.nn.log_softmax(model.apply({"params": p}, i, t, **kw)))
  logp = apply(params, batch["inputs"], batch["targets"], kwargs)
  nll = -np.take_along_axis(np.asarray(logp), batch["targets"][..., None], -1)[..., 0]
  nll = np.where(batch["targets"] != PAD_ID, nll, 0.0)
  if segments is None:
    return list(nll.sum(-1))
  return [nll[r][segments[r] == s].sum() for r in range(len(nll))
          for s in range(1, segments[r].max() + 1)]


def test_packed_and_unpacked_give_the_same_per_pair_loss(tmp_path, corpus):
  config = make_config(tmp_path, packing=True, packed_length=48)
  data = input_pipeline.create_datasets(config, "r")
  packed = next(data.train)
  model = model_lib.build_model(config)  # dropout off: the two forward passes must agree
  params = support.initial_params(model)
  packed_losses = _per_pair_losses(model, params, packed, packed["targets_segmentation"])
  # The same pairs, one per row, laid out here from the packed ids, without the pipeline.
  pairs = []
  for r in range(packed["inputs"].shape[0]):
    for s in range(1, packed["targets_segmentation"][r].max() + 1):
      pairs.append(tuple(packed[k][r][packed[f"{k}_segmentation"][r] == s]
                         for k in ("inputs", "targets")))
  assert len(pairs) == len(packed_losses) > 20
  unpacked = {k: np.zeros((len(pairs), 48), np.int32) for k in ("inputs", "targets")}
  for i, (src, tgt) in enumerate(pairs):
    unpacked["inputs"][i, :len(src)] = src
    unpacked["targets"][i, :len(tgt)] = tgt
  np.testing.assert_allclose(packed_losses, _per_pair_losses(model, params, unpacked),
                             rtol=2e-5, atol=1e-4)


def test_eval_batches_cover_the_dev_split_once_and_keep_raw_text(tmp_path, corpus):
  config = make_config(tmp_path)
  data = input_pipeline.create_datasets(config, "r", rows_multiple=4)
  assert data.splits["validation"] == corpus["valid"]  # raw text, file order, nothing dropped
  assert data.splits["test"] == corpus["test"]
  batches = list(data.eval_batches())
  assert [fingerprint(b) for b in batches] == [fingerprint(b) for b in data.eval_batches()]
  rows = []
  for b in batches:
    assert set(b) == {"inputs", "targets"} and b["inputs"].shape[0] % 4 == 0
    rows += [r for r in unpacked_rows(b) if r != ((), ())]  # drop all-PAD filler rows
  reference = pair_ids(data.tokenizer, corpus["valid"])
  cap = config.model.max_len - 1  # the long pair is cut to the model's positions, not dropped
  reference = [(s[:cap], t[:cap]) for s, t in reference]
  assert collections.Counter(rows) == collections.Counter(reference)
  assert max(len(t) for _, t in reference) == cap


def test_processes_read_disjoint_shards_with_identical_shapes(tmp_path, corpus, monkeypatch):
  from jax.experimental import multihost_utils

  monkeypatch.setattr(multihost_utils, "sync_global_devices", lambda name: None)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  config = make_config(tmp_path)
  per_process = []
  for p in (0, 1):  # process 0 fills the cache, process 1 only reads it
    monkeypatch.setattr(jax, "process_index", lambda p=p: p)
    per_process.append(input_pipeline.create_datasets(config, "r", rows_multiple=2))
  kept = kept_reference(config, per_process[0].tokenizer, corpus["train"])
  epoch = per_process[0].stats["batches_per_epoch"]
  assert per_process[1].stats["shapes"] == per_process[0].stats["shapes"]
  seen = [collections.Counter(), collections.Counter()]
  for _ in range(epoch):
    b0, b1 = next(per_process[0].train), next(per_process[1].train)
    assert b0["inputs"].shape == b1["inputs"].shape and b0["inputs"].shape[0] % 2 == 0
    # Each process's share of the global budget.
    assert b0["inputs"].size <= config.data.tokens_per_batch // 2
    seen[0].update(unpacked_rows(b0))
    seen[1].update(unpacked_rows(b1))
  assert not set(seen[0]) & set(seen[1]) and set(seen[0]) | set(seen[1]) == kept
  e0, e1 = list(per_process[0].eval_batches()), list(per_process[1].eval_batches())
  assert [b["inputs"].shape for b in e0] == [b["inputs"].shape for b in e1]
  rows = [r for b in e0 + e1 for r in unpacked_rows(b) if r != ((), ())]
  assert len(rows) == len(set(rows)) == len(corpus["valid"])


def test_batch_too_small_for_the_devices_fails_before_anything_is_written(tmp_path, corpus):
  with pytest.raises(ValueError, match=r"tokens_per_batch=100 is smaller than one maximal pair: "
                     r"the longest rows hold 40 tokens .* 4 row\(s\) .* must be ≥ 160"):
    input_pipeline.create_datasets(make_config(tmp_path, tokens_per_batch=100), "r",
                                   rows_multiple=4)
  assert not (tmp_path / "cache").exists()


def test_training_set_empty_after_filtering(tmp_path):
  write_corpus(tmp_path / "corpus", min_words=6)
  config = make_config(tmp_path, max_source_len=5, max_target_len=5)
  with pytest.raises(ValueError, match=r"training set is empty after filtering: of 600 pairs "
                     r"in .*train\.en.*0 have an empty side and 600 exceed .*max_source_len=5"):
    input_pipeline.create_datasets(config, "r")


def test_vocabulary_larger_than_the_model_is_refused(tmp_path, corpus):
  config = make_config(tmp_path)
  tok = input_pipeline.create_datasets(config, "r").tokenizer
  config.data.vocab_path = tok.path
  config.model.vocab_size = 150
  with pytest.raises(ValueError, match="has 200 pieces but config.model.vocab_size=150"):
    input_pipeline.create_datasets(config, "r")


def test_tatoeba_small_config_reads_the_shared_corpus(shared_data, tmp_path):
  from configs import tatoeba_small

  config = tatoeba_small.get_config()
  assert pathlib.Path(config.data.files_dir) == shared_data / "tatoeba-deu-eng"
  model = model_lib.build_model(config)
  shapes = jax.eval_shape(lambda: model_lib.init_params(model, jax.random.key(0)))
  assert 2e6 < model_lib.count_params(shapes) < 8e6
  config.data.cache_dir = str(tmp_path / "cache")
  data = input_pipeline.create_datasets(config, str(tmp_path / "run"), rows_multiple=8)
  assert data.tokenizer.vocab_size == config.model.vocab_size == 8000
  assert data.stats["train_pairs"] == 15_565 and data.stats["kept_pairs"] > 15_000
  assert len(data.splits["validation"]) == len(data.splits["test"]) == 1000
  batch = next(data.train)
  assert batch["inputs"].shape[0] % 8 == 0
  assert batch["inputs"].size <= config.data.tokens_per_batch


def _train_iterators(config, monkeypatch, processes: int, rows_multiple: int):
  """The training iterators of each of `processes` processes, each with `rows_multiple` local
  data-parallel devices, emulated in this process: the process count and index as
  `create_datasets` sees them."""
  from jax.experimental import multihost_utils

  monkeypatch.setattr(multihost_utils, "sync_global_devices", lambda name: None)
  monkeypatch.setattr(jax, "process_count", lambda: processes)
  iterators = []
  for p in range(processes):
    monkeypatch.setattr(jax, "process_index", lambda p=p: p)
    iterators.append(input_pipeline.create_datasets(config, "r", rows_multiple=rows_multiple)
                     .train)
  return iterators


@pytest.fixture
def tatoeba_config(shared_data, tmp_path):
  from tests import support

  config = support.tatoeba_tiny(shared_data, steps=10)
  config.data.update(cache_dir=str(tmp_path / "cache"), read_threads=1, prefetch_batches=2)
  return config


def test_a_position_from_other_processes_or_devices_is_refused_and_the_same_resume(
    tatoeba_config, monkeypatch):
  """2 processes of 2 devices stop at step 5; their position is refused by 1 process of 4, by
  2 processes of 4 devices (other batch shapes) and under another seed, and 2 processes of 2
  devices again go on with the batches an uninterrupted run sees."""
  config = tatoeba_config
  uninterrupted = [[fingerprint(b) for b in take(it, 12)]
                   for it in _train_iterators(config, monkeypatch, 2, 2)]
  first = _train_iterators(config, monkeypatch, 2, 2)
  assert [[fingerprint(b) for b in take(it, 5)] for it in first] == [u[:5] for u in
                                                                     uninterrupted]
  state = json.loads(json.dumps(first[0].get_state()))  # as stored in a checkpoint
  assert first[1].get_state() == state and state["next_index"] == 5

  (one,) = _train_iterators(config, monkeypatch, 1, 4)
  with pytest.raises(ConfigError) as refused:
    one.set_state(state)
  assert str(refused.value) == (
      "the checkpoint's data position belongs to 2 × 2 (processes × batch rows per process "
      "in multiples of: local data-parallel devices × config.grad_accum_steps), this run has "
      "1 × 4: from step 5 on, this run's batches would not be the ones an uninterrupted run "
      "sees. To continue that order, resume on 2 × 2 as it was saved; to go on in this run's "
      "order (the epoch in progress then repeats some pairs and skips others), pass "
      "--config.data.allow_new_order_on_resume=True")
  more_devices = _train_iterators(config, monkeypatch, 2, 4)
  with pytest.raises(ConfigError, match=r"belongs to 2 × 2 .*, this run has 2 × 4: from step 5"):
    more_devices[0].set_state(state)
  older = {"next_index": 5, "fingerprint": "0123456789abcdef"}  # saved without its pipeline
  with pytest.raises(ConfigError, match=r"^the checkpoint's data position was saved by another "
                     r"input pipeline .*: from step 5 on.* resume with the settings it was "
                     r"saved with; .* pass --config.data.allow_new_order_on_resume=True$"):
    more_devices[0].set_state(older)

  config.seed = 1  # a run's seed orders its batches too
  with pytest.raises(ConfigError, match=r"^the checkpoint's data position belongs to "
                     r"config.seed=0, this run has 1: .* To continue that order, resume with "
                     r"config.seed=0; "):
    _train_iterators(config, monkeypatch, 2, 2)[0].set_state(state)

  config.seed = 0
  again = _train_iterators(config, monkeypatch, 2, 2)
  for it, expected in zip(again, uninterrupted):
    it.set_state(state)
    assert [fingerprint(b) for b in take(it, 7)] == expected[5:]


def test_the_opt_in_goes_on_in_the_new_order_with_a_warning(tatoeba_config, monkeypatch,
                                                             caplog):
  config = tatoeba_config
  first = _train_iterators(config, monkeypatch, 2, 2)
  take(first[0], 5)
  state = json.loads(json.dumps(first[0].get_state()))
  (fresh,) = _train_iterators(config, monkeypatch, 1, 4)
  expected = [fingerprint(b) for b in take(fresh, 8)][5:]
  config.data.allow_new_order_on_resume = True
  (one,) = _train_iterators(config, monkeypatch, 1, 4)
  one.set_state(state)
  assert [fingerprint(b) for b in take(one, 3)] == expected
  (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert warning.startswith("the checkpoint's data position belongs to 2 × 2 ")
  assert warning.endswith("config.data.allow_new_order_on_resume=True: going on from step 5 "
                          "in this run's data order (the epoch in progress repeats some pairs "
                          "and skips others)")
