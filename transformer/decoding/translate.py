"""Translation with a trained model: the model-facing side of `transformer.decoding.decode`.

Glossary: B batch, S source length, L output length, V vocabulary, beam beam size.

`translate_batch` encodes a padded batch once, builds the decoder's cache (the cross-attention
keys/values are projected once per sentence), lays it out for the beams (`beam_cache`) and
runs beam search (or greedy search for beam size 1) compiled whole, the finished sentences
leaving the batch as it goes (`shrinking_sizes`). `translate_texts` turns sentences into
batches of a few fixed shapes, so that XLA compiles a bounded number of programs, and back
into text.

How the searches compute their top k and log-normaliser, and how a step reads the
self-attention cache, is a `backend_ops.DecodingOps` passed in (`ops`); `translate_texts`
takes it from `config.cpu_workarounds` (`backend_ops.for_setting`).
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from transformer.decoding import backend_ops
from transformer.decoding import beam_cache
from transformer.decoding import decode
from transformer.decoding import ensemble
from transformer.decoding import sampling as sampling_lib
from transformer.model import position_schemes
from transformer.model.transformer import DecoderCache
from transformer.tokens import EOS_ID, PAD_ID

# Padded source lengths: few enough that the compiled programs stay few, close enough that
# little time goes on padding. Longer sources round up to a multiple of the last step.
_LENGTH_BUCKETS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
_LONG_STEP = 128
# As sentences finish, a batch shrinks by this factor at a time (the finished ones leave it)
# down to `_SMALLEST_BATCH` sentences. Each size is one more loop to compile. A step costs a
# fixed part plus a part per sentence (tatoeba_small on 2 CPU cores: 0.4 ms + 0.3 ms per
# sentence at beam 4, 0.45 + 0.08 greedy), so below 8 sentences little is left to save.
_SHRINK_FACTOR = 4
_SMALLEST_BATCH = 8


def shrinking_sizes(batch_size: int) -> tuple[int, ...]:
  """The batch sizes a search of `batch_size` sentences shrinks to as they finish
  (`decode`'s `batch_sizes`): 128 -> (32, 8)."""
  sizes = []
  size = batch_size // _SHRINK_FACTOR
  while size >= _SMALLEST_BATCH:
    sizes.append(size)
    size //= _SHRINK_FACTOR
  return tuple(sizes)


def init_cache(model, params, inputs: jax.Array, max_decode_len: int, *,
               ops: backend_ops.DecodingOps) -> DecoderCache:
  """Encodes `inputs [B, S]` once and builds the decoder cache for `max_decode_len` steps,
  its self-attention caches read with `ops.cache_read`."""
  encoded = model.apply({"params": params}, inputs, method="encode")  # [B, S, D]
  cache = model.apply({"params": params}, encoded, inputs, max_decode_len,
                      method="init_cache")
  return cache._replace(self_attention=tuple(c.replace(read=ops.cache_read)
                                             for c in cache.self_attention))


def decoding_setup(
    model, params, inputs: jax.Array, max_decode_len: int, beam_size: int, *,
    ops: backend_ops.DecodingOps) -> tuple[Callable, DecoderCache, Callable | None]:
  """The `tokens_to_logits` callback, its initial cache (`init_cache`) and its beam reorder
  function.

  Returns:
    `(tokens_to_logits, cache, reorder_cache)`: the callback takes `B * beam_size` rows.
    For greedy search (beam size 1) `cache` is the model's, with `B` rows, and
    `reorder_cache` is None. For beam search `cache` is in the layout of
    `beam_cache.beam_layout` and `reorder_cache` is `beam_cache.reorder`: beams share their
    history's keys/values instead of copying them at every step.
  """
  cache = init_cache(model, params, inputs, max_decode_len, ops=ops)
  reorder = None
  if beam_size > 1:
    cache = beam_cache.beam_layout(cache, beam_size, transposed_keys=ops.transposed_keys)
    reorder = beam_cache.reorder

  def tokens_to_logits(ids, cache):  # ids: [B * beam, 1] -> logits [B * beam, V]
    return model.apply({"params": params}, ids, cache, method="decode_step")

  return tokens_to_logits, cache, reorder


def search(model, params, inputs: jax.Array, max_lengths: jax.Array, max_decode_len: int, *,
           beam_size: int, alpha: float, ops: backend_ops.DecodingOps,
           batch_sizes: Sequence[int] = (), nbest: int = 1,
           sampling: sampling_lib.Sampling | None = None,
           sentence_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array | None]:
  """Beam search, greedy search for beam size 1, or sampling, from source ids `inputs [B, S]`.

  Args:
    model, params: a `Transformer` and its parameters, or a tuple of models and a tuple of
      their parameters, decoding as an ensemble (`ensemble.combine`).
    inputs: int32 `[B, S]` source ids.
    max_lengths: int `[B]`, each sentence's bound on output tokens, EOS included.
    max_decode_len: static length of the output (and of the decoder cache).
    beam_size: hypotheses per sentence.
    alpha: the length-penalty exponent.
    ops: how the search and the cache reads run (`backend_ops`).
    batch_sizes: the batch sizes the search shrinks to as sentences finish
      (`shrinking_sizes`); none: every sentence stays until the batch ends.
    nbest: hypotheses per sentence (beam search only, at most `beam_size`).
    sampling: draw each sentence's tokens instead of searching (`sampling.sample_search`).
    sentence_ids: int `[B]`, each row's sentence number, which keys its draws (sampling).

  Returns:
    `(ids, scores)`: int32 `[B, nbest, max_decode_len]`, each sentence's hypotheses, EOS, then
    PAD_ID; and their length-penalised log-probabilities `[B, nbest]` for beam search (None
    for greedy search and sampling).
  """
  beams = 1 if sampling else beam_size
  if isinstance(model, tuple):  # an ensemble: a callback and a cache for each model
    tokens_to_logits, cache, reorder = ensemble.combine(
        [decoding_setup(m, p, inputs, max_decode_len, beams, ops=ops)
         for m, p in zip(model, params)])
  else:
    tokens_to_logits, cache, reorder = decoding_setup(model, params, inputs, max_decode_len,
                                                      beams, ops=ops)
  if sampling is not None:
    ids = sampling_lib.sample_search(tokens_to_logits, cache, max_lengths, max_decode_len,
                                     sentence_ids, sampling, batch_sizes=batch_sizes)
    return ids[:, None], None
  if beam_size == 1:
    ids = decode.greedy_search(tokens_to_logits, cache, max_lengths, max_decode_len, ops=ops,
                               batch_sizes=batch_sizes)
    return ids[:, None], None
  return decode.nbest_search(tokens_to_logits, cache, max_lengths, max_decode_len,
                             beam_size=beam_size, alpha=alpha, nbest=nbest,
                             reorder_cache=reorder, ops=ops, batch_sizes=batch_sizes)


@functools.partial(jax.jit, static_argnames=("model", "beam_size", "alpha", "max_extra_len",
                                             "ops", "shrink", "nbest", "sampling"))
def _translate(model, params, inputs, sentence_ids, *, beam_size, alpha, max_extra_len, ops,
               shrink, nbest, sampling):
  batch, source_len = inputs.shape
  max_len = min(m.cfg.max_len for m in (model if isinstance(model, tuple) else (model,)))
  max_decode_len = min(source_len + max_extra_len, max_len)
  source_tokens = jnp.sum(inputs != PAD_ID, axis=1)  # [B], the source EOS included
  # An all-padding row (batch filler) ends at once with EOS; others get input length + 50.
  max_lengths = jnp.where(source_tokens == 0, 1, source_tokens + max_extra_len)
  return search(model, params, inputs, max_lengths, max_decode_len, beam_size=beam_size,
                alpha=alpha, ops=ops, batch_sizes=shrinking_sizes(batch) if shrink else (),
                nbest=nbest, sampling=sampling, sentence_ids=sentence_ids)


def translate_batch(model, params, inputs: jax.Array, decode_config, *,
                    ops: backend_ops.DecodingOps, shrink: bool = True) -> jax.Array:
  """The best translation of each row of a padded batch (`decode_batch`'s first): int32
  `[B, L]`."""
  return decode_batch(model, params, inputs, decode_config, ops=ops, shrink=shrink)[0][:, 0]


def decode_batch(model, params, inputs: jax.Array, decode_config, *,
                 ops: backend_ops.DecodingOps, shrink: bool = True, nbest: int = 1,
                 sampling: sampling_lib.Sampling | None = None,
                 sentence_ids=None) -> tuple[jax.Array, jax.Array | None]:
  """Translates a padded batch; compiled once per input shape and decoding setting.

  Args:
    model: a `Transformer` from `build_model`.
    params: its parameters.
    inputs: int32 `[B, S]` source ids, each ending in EOS_ID, padded with PAD_ID.
    decode_config: `config.decode` (beam_size, length_penalty, max_extra_len); beam size 1
      means greedy search.
    ops: how the search and the cache reads run (`backend_ops.for_setting` of
      `config.cpu_workarounds`).
    shrink: finished sentences leave the batch (`shrinking_sizes`); False keeps every
      sentence until the batch ends (the same translations, more work).
    nbest, sampling, sentence_ids: as `search`'s (`sentence_ids` default: the row numbers).

  Returns:
    `(ids, scores)` as `search`'s: ids int32 `[B, nbest, L]` with
    `L = min(S + max_extra_len, model max_len)`, each row's output tokens, EOS, then PAD_ID.
    A row may use at most its own source tokens + max_extra_len.
  """
  inputs = jnp.asarray(inputs)
  if inputs.ndim != 2 or not jnp.issubdtype(inputs.dtype, jnp.integer):
    raise ValueError(f"inputs must be an integer [batch, length] array, got {inputs.dtype} "
                     f"{inputs.shape}")
  if sentence_ids is None:
    sentence_ids = np.arange(inputs.shape[0])
  return _translate(model, params, inputs.astype(jnp.int32),
                    jnp.asarray(sentence_ids, jnp.int32),
                    beam_size=int(decode_config.beam_size),
                    alpha=float(decode_config.length_penalty),
                    max_extra_len=int(decode_config.max_extra_len), ops=ops, shrink=shrink,
                    nbest=nbest, sampling=sampling)


def _bucket(length: int, max_len: int) -> int:
  """Padded source length for a batch whose longest source has `length` tokens."""
  if length > max_len:  # only schemes without a bound on positions get here
    return -(-length // _LONG_STEP) * _LONG_STEP
  # Never past max_len: a learned position table has no row for it, even for padding.
  return min(next((b for b in _LENGTH_BUCKETS if b >= length), max_len), max_len)


def _batch_rows(n: int, batch_size: int) -> int:
  """Rows of a batch holding `n` sentences: batch_size, or a power of two for a small rest."""
  return min(batch_size, 1 << max(n - 1, 0).bit_length())


def _encode_sources(tokenizer, sentences: Sequence[str], config) -> dict[int, list[int]]:
  """Source ids (with EOS) of each non-empty sentence by index, truncated where needed."""
  max_len = config.model.max_len
  learned = position_schemes.get(config.model.positional).bounded
  encoded = {}
  for index, text in enumerate(sentences):
    if not text.strip():
      continue
    ids = list(tokenizer.encode(text)) + [EOS_ID]
    if learned and len(ids) > max_len:
      warnings.warn(f"line {index + 1}: source has {len(ids)} tokens, more than the "
                    f"{max_len} positions the model learned (config.model.max_len); "
                    f"translating only its first {max_len - 1} tokens")
      ids = ids[:max_len - 1] + [EOS_ID]
    elif len(ids) + config.decode.max_extra_len > max_len:
      warnings.warn(f"line {index + 1}: source has {len(ids)} tokens; its output is limited "
                    f"to config.model.max_len={max_len} tokens instead of input length + "
                    f"{config.decode.max_extra_len}")
    encoded[index] = ids
  return encoded


def on_one_device(params):
  """`params` to decode with: a tree replicated over several devices (a data-parallel or
  pmap run's parameters during training) becomes its copy on one of this process's devices;
  any other tree is returned as it is.

  A search compiled for replicated parameters runs whole on every device, each finding the
  same translations: on 8 devices, 8 times the work for nothing. Sharded parameters (FSDP or
  tensor parallel) stay as they are, decoded across their devices.
  """
  leaves = jax.tree.leaves(params)
  if not leaves or not all(isinstance(x, jax.Array) and len(x.sharding.device_set) > 1
                           and x.sharding.is_fully_replicated for x in leaves):
    return params
  device = leaves[0].addressable_shards[0].device
  if not all(device in x.sharding.device_set for x in leaves):  # replicated over other sets
    return params
  return jax.tree.map(
      lambda x: next(s.data for s in x.addressable_shards if s.device == device), params)


def translate_texts(model, params, tokenizer, sentences: Sequence[str], config,
                    *, progress: bool = True, shrink: bool = True) -> list[str]:
  """Translates sentences in length-sorted batches and returns them in input order: the best
  hypothesis of each (`decode_texts`)."""
  decoded = decode_texts(model, params, tokenizer, sentences, config, progress=progress,
                         shrink=shrink)
  return [hypotheses[0][0] if hypotheses else "" for hypotheses in decoded]


def decode_texts(model, params, tokenizer, sentences: Sequence[str], config,
                 *, progress: bool = True, shrink: bool = True, nbest: int = 1,
                 sampling: sampling_lib.Sampling | None = None, first_id: int = 0
                 ) -> list[list[tuple[str, float | None]]]:
  """Decodes sentences in length-sorted batches: each one's hypotheses, in input order.

  Args:
    model: a `Transformer` from `build_model(config)`, or a tuple of them: an ensemble
      (`ensemble.combine`) sharing the tokenizer. Sources are bucketed and truncated by
      `config` (the first model's); outputs are bounded by the smallest `max_len`.
    params: its parameters (e.g. averaged checkpoints), or a tuple of each model's;
      replicated ones are decoded on one device (`on_one_device`).
    tokenizer: has `encode(text) -> list[int]` (no EOS), `decode(ids) -> str` (stops at EOS,
      drops PAD) and `vocab_size`.
    sentences: source sentences; empty (or blank) ones translate to ''.
    config: the experiment config (`config.decode`, `config.model.max_len`,
      `config.cpu_workarounds`).
    progress: show a tqdm progress bar.
    shrink: finished sentences leave their batch (`decode_batch`).
    nbest: hypotheses per sentence (beam search, at most `config.decode.beam_size`).
    sampling: draw each translation (`sampling.Sampling`); sentence i draws with key
      `fold_in(key(seed), first_id + i)`, whatever the batch.
    first_id: the number of the first sentence (a stream's later lines keep their numbers).

  Returns:
    Per input sentence, `(translation, score)` of its hypotheses, best first: `nbest` of them
    for beam search (the score length-penalised, as the search ranks them), one with score
    None for greedy search and sampling, none for an empty (or blank) sentence.
  """
  # The tokenizer's fit to config.model.vocab_size is checked where it is loaded
  # (`tokenizer.load_tokenizer`), decode.batch_size by `config_checks.validate`.
  batch_size = int(config.decode.batch_size)
  ops = backend_ops.for_setting(config.cpu_workarounds)
  params = on_one_device(params)
  encoded = _encode_sources(tokenizer, sentences, config)
  # Longest first: the biggest program compiles first and the progress bar's rate is honest.
  order = sorted(encoded, key=lambda i: len(encoded[i]), reverse=True)
  results = [[] for _ in sentences]
  with tqdm.tqdm(total=len(order), desc="translating", unit="sent",
                 disable=not progress) as bar:
    for start in range(0, len(order), batch_size):
      chunk = order[start:start + batch_size]
      length = _bucket(len(encoded[chunk[0]]), config.model.max_len)
      inputs = np.full((_batch_rows(len(chunk), batch_size), length), PAD_ID, np.int32)
      sentence_ids = np.zeros(inputs.shape[0], np.int32)
      for row, index in enumerate(chunk):
        inputs[row, :len(encoded[index])] = encoded[index]
        sentence_ids[row] = first_id + index
      ids, scores = decode_batch(model, params, inputs, config.decode, ops=ops, shrink=shrink,
                                 nbest=nbest, sampling=sampling, sentence_ids=sentence_ids)
      ids = np.asarray(ids)
      scores = None if scores is None else np.asarray(scores)
      for row, index in enumerate(chunk):
        results[index] = [
            (tokenizer.decode([int(t) for t in ids[row, n]]),
             None if scores is None else float(scores[row, n]))
            for n in range(ids.shape[1]) if scores is None or scores[row, n] > decode.NEG_INF / 2]
      bar.update(len(chunk))
  return results
