"""Cached incremental decoding: greedy search and beam search (paper §6.1).

Decoding knows the model only through a callback

    tokens_to_logits(ids [batch * beam, 1], cache) -> (logits [batch * beam, V] float32, cache)

that feeds each row's previous token (PAD_ID, the start symbol, at the first step) and returns
the next-token logits and the updated cache, any pytree. Its leaves carry batch (or
batch * beam) as their leading dimension, except scalar leaves (a step counter such as the
model's 'position'), which are shared by all rows and left alone.

Conventions shared by both searches and by the tests' exhaustive reference:
- A hypothesis is the output tokens up to and including its EOS; |Y| counts them, EOS included.
- `max_lengths[b]` bounds |Y| for sentence b: at that length only EOS may follow, with its own
  log-probability (nothing is renormalised), so every returned hypothesis ends in EOS. With the
  source counted with its EOS, "input length + 50" (§6.1) is `source_tokens + 50` either way:
  the bound on words without EOS is then the source's words without EOS plus 50.
- Scores are sums of log-probabilities divided by the GNMT length penalty
  `((5 + |Y|) / 6)^α` (Wu et al. 2016), as in the paper's tensor2tensor decoder.

Beam search keeps `beam` live hypotheses (none ending in EOS) and the `beam` best finished ones.
Each step ranks all `beam * V` extensions; an extension ending in EOS is finished only if it
ranks among the top `beam` (so beam size 1 is exactly greedy search); the next live beams are
the best `beam` extensions not ending in EOS. Finished hypotheses are never extended. A
sentence's search ends when (a) `beam` hypotheses have finished, (b) no live hypothesis can beat
the best finished one even at the sentence's longest allowed length (tensor2tensor's
`stop_early`; the paper's "terminate early when possible"), or (c) its length limit is reached.
(b) never changes the best result; (a) is fairseq's rule and is what makes beam 1 greedy.
Tensor2tensor instead finishes EOS extensions ranked among the top 2 * beam and does not use (a).
`nbest_search` returns the n best finished hypotheses (n <= beam), its rule (b) comparing with
the n-th; `beam_search` returns the best. Greedy search is `token_by_token` with the argmax;
`transformer.decoding.sampling` is the same loop with a draw.

`ops` (a `backend_ops.DecodingOps`) says how each step's top k and log-normaliser are
computed: `backend_ops.LIBRARY` (the default: `lax.top_k`, `jax.nn.logsumexp`) or
`backend_ops.CPU` (the same results, faster on XLA:CPU).

Finished sentences may leave the batch (`batch_sizes`): a sentence's search never reads another
sentence's rows, so once at most `n` sentences are still searched, the search keeps only those
rows (and some finished ones, to fill `n`) and goes on with `n` rows, each size a loop of its
own shape. The results are the same; the steps of the last sentences cost less.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from transformer.decoding import backend_ops
from transformer.decoding import batch_rows
from transformer.tokens import EOS_ID, PAD_ID

TokensToLogits = Callable[[jax.Array, Any], tuple[jax.Array, Any]]

# Score of an empty slot. Finite, so that sums and comparisons with it never make NaN, and far
# below any real score (a real score would need ~1e7 tokens at log-probability -50).
NEG_INF = -1.0e9
# Scores above this belong to real hypotheses; an empty slot's extensions stay below it.
_REAL = NEG_INF / 2


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
  """GNMT length penalty `((5 + |Y|) / 6)^α`; `length` counts the hypothesis' EOS."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def _check_lengths(max_lengths: jax.Array, max_decode_len: int) -> jax.Array:
  if max_decode_len < 1:
    raise ValueError(f"max_decode_len={max_decode_len} must be at least 1")
  # Never beyond the buffers (and the model's cache); at least one token (the EOS).
  return jnp.clip(jnp.asarray(max_lengths, jnp.int32), 1, max_decode_len)


class GreedyState(NamedTuple):
  step: jax.Array  # [] tokens decoded so far
  seqs: jax.Array  # [batch, length + 1]; position 0 holds the start symbol
  done: jax.Array  # [batch] bool, EOS produced
  max_lengths: jax.Array  # [batch] int, the sentences' bounds on output tokens
  rows: Any  # leaves [batch, ...]: what `choose` reads of each sentence (None for greedy)
  cache: Any  # leaves [batch, ...] or scalars


# `choose(logits [B, V] float32, step [], rows) -> int [B]`: the token each sentence emits.
Choose = Callable[[jax.Array, jax.Array, Any], jax.Array]


def greedy_search(
    tokens_to_logits: TokensToLogits,
    cache: Any,
    max_lengths: jax.Array,  # int [B]
    max_decode_len: int,
    *,
    eos_id: int = EOS_ID,
    ops: backend_ops.DecodingOps = backend_ops.LIBRARY,
    batch_sizes: Sequence[int] = (),
) -> jax.Array:  # int32 [B, max_decode_len]
  """Picks the most probable token at each step until EOS or the sentence's limit.

  Args:
    tokens_to_logits: the model callback (see the module docstring), batch `B`.
    cache: the callback's initial cache, leaves `[B, ...]` or scalars.
    max_lengths: per-sentence bound on output tokens, EOS included; EOS is forced there.
    max_decode_len: static length of the output buffer (and bound on `max_lengths`).
    eos_id: the end-of-sentence id.
    ops: picks the argmax with `ops.top_k` (see the module docstring).
    batch_sizes: sentences the batch shrinks to as sentences finish (see the module
      docstring); the cache's leaves must then all lead with `B` rows (or be scalars).

  Returns:
    Output ids `[B, max_decode_len]`: each row's tokens, its EOS, then PAD_ID.
  """
  def argmax(logits, step, rows):
    del step, rows
    return ops.top_k(logits, 1)[1][:, 0]

  return token_by_token(tokens_to_logits, cache, max_lengths, max_decode_len, argmax,
                        eos_id=eos_id, batch_sizes=batch_sizes)


def token_by_token(
    tokens_to_logits: TokensToLogits,
    cache: Any,
    max_lengths: jax.Array,  # int [B]
    max_decode_len: int,
    choose: Choose,
    rows: Any = None,
    *,
    eos_id: int = EOS_ID,
    batch_sizes: Sequence[int] = (),
) -> jax.Array:  # int32 [B, max_decode_len]
  """One hypothesis per sentence, its tokens chosen one at a time by `choose` (the argmax
  for greedy search, a draw for sampling) until EOS or the sentence's limit, where EOS is
  forced.

  Args:
    tokens_to_logits, cache, max_lengths, max_decode_len, eos_id, batch_sizes: as
      `greedy_search`'s.
    choose: `(logits [B', V] float32, step, rows) -> int [B']`, for the `B'` sentences the
      loop holds (fewer as they finish, with `batch_sizes`).
    rows: a tree of leaves `[B, ...]`, each sentence's own data for `choose` (its random
      key), following the sentence as the batch shrinks.

  Returns:
    Output ids `[B, max_decode_len]`: each row's tokens, its EOS, then PAD_ID.
  """
  max_lengths = _check_lengths(max_lengths, max_decode_len)
  batch = max_lengths.shape[0]
  state = GreedyState(
      step=jnp.array(0, jnp.int32),
      seqs=jnp.full((batch, max_decode_len + 1), PAD_ID, jnp.int32),
      done=jnp.zeros((batch,), bool),
      max_lengths=max_lengths,
      rows=rows,
      cache=cache)

  def cond(s: GreedyState):
    return (s.step < max_decode_len) & ~jnp.all(s.done)

  def body(s: GreedyState):
    ids = jax.lax.dynamic_slice_in_dim(s.seqs, s.step, 1, axis=1)  # [B, 1]
    logits, cache = tokens_to_logits(ids, s.cache)  # [B, V]
    token = choose(logits.astype(jnp.float32), s.step, s.rows).astype(jnp.int32)  # [B]
    token = jnp.where(s.step + 1 >= s.max_lengths, eos_id, token)
    token = jnp.where(s.done, PAD_ID, token)
    seqs = s.seqs.at[:, s.step + 1].set(token)
    return s._replace(step=s.step + 1, seqs=seqs, done=s.done | (token == eos_id), cache=cache)

  return batch_rows.shrinking_loop(cond, body, state, active=lambda s: ~s.done,
                                   result=lambda s: s.seqs[:, 1:], beams=1,
                                   batch_sizes=batch_sizes)


class BeamState(NamedTuple):
  step: jax.Array  # [] tokens decoded so far
  alive_seqs: jax.Array  # [batch, beam, length + 1]; position 0 holds the start symbol
  alive_log_probs: jax.Array  # [batch, beam] sums of log-probabilities; NEG_INF = empty
  finished_seqs: jax.Array  # [batch, beam, length + 1]
  finished_scores: jax.Array  # [batch, beam] length-penalised, best first; NEG_INF = empty
  num_finished: jax.Array  # [batch] hypotheses finished so far
  active: jax.Array  # [batch] bool, the sentence's search is still running
  max_lengths: jax.Array  # [batch] int, the sentences' bounds on output tokens
  cache: Any  # leaves [batch * beam, ...] or scalars


def beam_search(tokens_to_logits: TokensToLogits, cache: Any, max_lengths: jax.Array,
                max_decode_len: int, **kwargs) -> tuple[jax.Array, jax.Array]:
  """`nbest_search` for the best hypothesis alone: `(ids [B, max_decode_len], scores [B])`,
  each sentence's best hypothesis (its tokens, its EOS, then PAD_ID) and its length-penalised
  log-probability. Takes `nbest_search`'s arguments but `nbest`."""
  ids, scores = nbest_search(tokens_to_logits, cache, max_lengths, max_decode_len, nbest=1,
                             **kwargs)
  return ids[:, 0], scores[:, 0]


def nbest_search(
    tokens_to_logits: TokensToLogits,
    cache: Any,
    max_lengths: jax.Array,  # int [B]
    max_decode_len: int,
    *,
    beam_size: int,
    alpha: float,
    nbest: int = 1,
    eos_id: int = EOS_ID,
    reorder_cache: Callable[[Any, jax.Array], Any] | None = None,
    ops: backend_ops.DecodingOps = backend_ops.LIBRARY,
    batch_sizes: Sequence[int] = (),
) -> tuple[jax.Array, jax.Array]:  # int32 [B, nbest, max_decode_len], float32 [B, nbest]
  """Beam search with the GNMT length penalty and early stopping (see the module docstring),
  returning each sentence's `nbest` best finished hypotheses, best first.

  With `nbest > 1` the early stop (b) compares the live hypotheses with the `nbest`-th
  finished one instead of the best, so that none that could still enter the list is dropped;
  the best hypothesis is the same for every `nbest`.

  Args:
    tokens_to_logits: the model callback, called on `B * beam_size` rows.
    cache: the callback's initial cache. Without `reorder_cache`: one row per sentence
      (leaves `[B, ...]`, or scalars), copied to every beam here and reordered by copying rows.
      With it: already laid out for the beams, in the callback's own layout.
    reorder_cache: `(cache, parents [B, beam]) -> cache`, making new beam j of sentence b
      continue old beam `parents[b, j]`; lets a model share beams' history instead of
      copying it (see `transformer.decoding.beam_cache`).
    max_lengths: per-sentence bound on output tokens, EOS included; EOS is forced there.
    max_decode_len: static length of the output buffer (and bound on `max_lengths`).
    beam_size: live hypotheses kept per sentence (the paper: 4).
    alpha: length-penalty exponent α ≥ 0 (the paper: 0.6).
    nbest: hypotheses returned per sentence, 1 to `beam_size`.
    eos_id: the end-of-sentence id.
    ops: top k and log-normaliser (see the module docstring).
    batch_sizes: sentences the batch shrinks to as sentences finish (see the module
      docstring); the cache's leaves must then all lead with `B` or `B * beam_size` rows
      (or be scalars).

  Returns:
    `(ids [B, nbest, max_decode_len], scores [B, nbest])`: each sentence's best hypotheses
    (their tokens, their EOS, then PAD_ID) and their length-penalised log-probabilities,
    best first. A slot no hypothesis reached holds PAD_ID only and score `NEG_INF`.
  """
  if beam_size < 1:
    raise ValueError(f"beam_size={beam_size} must be at least 1")
  if not 1 <= nbest <= beam_size:
    raise ValueError(f"nbest={nbest} must be in 1..beam_size={beam_size}")
  if alpha < 0:
    # Early stopping bounds a live hypothesis by its score at the longest length, which
    # needs a penalty that grows with length.
    raise ValueError(f"length penalty alpha={alpha} must be >= 0")
  max_lengths = _check_lengths(max_lengths, max_decode_len)
  k = beam_size
  state = _initial_beam_state(max_lengths, max_decode_len, k,
                              cache if reorder_cache else batch_rows.expand_to_beams(cache, k))
  if reorder_cache is None:
    reorder_cache = lambda c, parents: batch_rows.gather_beams(c, parents, parents.shape[0], k)

  def cond(s: BeamState):
    return (s.step < max_decode_len) & jnp.any(s.active)

  def body(s: BeamState):
    ids = jax.lax.dynamic_slice_in_dim(s.alive_seqs, s.step, 1, axis=2)  # [batch, beam, 1]
    batch = s.active.shape[0]  # the loop's own batch, the whole one or fewer
    logits, cache = tokens_to_logits(ids.reshape(batch * k, 1), s.cache)  # [batch*beam, V]
    return _beam_step(s, logits.astype(jnp.float32).reshape(batch, k, -1), cache,
                      reorder_cache=reorder_cache, alpha=alpha, eos_id=eos_id, ops=ops,
                      nbest=nbest)

  return batch_rows.shrinking_loop(
      cond, body, state, active=lambda s: s.active,
      result=lambda s: (s.finished_seqs[:, :nbest, 1:], s.finished_scores[:, :nbest]),
      beams=k, batch_sizes=batch_sizes)


def _initial_beam_state(max_lengths: jax.Array, max_decode_len: int, k: int,
                        cache: Any) -> BeamState:
  """Before the first step: one live hypothesis (the empty one) per sentence, nothing
  finished; `cache` is already laid out for the beams."""
  batch, length = max_lengths.shape[0], max_decode_len + 1
  return BeamState(
      step=jnp.array(0, jnp.int32),
      alive_seqs=jnp.full((batch, k, length), PAD_ID, jnp.int32),
      # The other beams start empty.
      alive_log_probs=jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (batch, 1)),
      finished_seqs=jnp.full((batch, k, length), PAD_ID, jnp.int32),
      finished_scores=jnp.full((batch, k), NEG_INF, jnp.float32),
      num_finished=jnp.zeros((batch,), jnp.int32),
      active=jnp.ones((batch,), bool),
      max_lengths=max_lengths,
      cache=cache)


def _beam_step(s: BeamState, logits: jax.Array, cache: Any, *,
               reorder_cache: Callable[[Any, jax.Array], Any], alpha: float, eos_id: int,
               ops: backend_ops.DecodingOps, nbest: int) -> BeamState:
  """One step of the search, given the callback's `logits` (float32 `[batch, beam, V]`) for
  the live beams' last tokens and the `cache` it returned."""
  i, (batch, k, vocab) = s.step, logits.shape
  # Extension scores: alive + log p = logits + (alive - logsumexp(logits)).
  offset = s.alive_log_probs - ops.logsumexp(logits)  # [batch, beam]
  # At a sentence's limit only EOS may follow, scored with its own log-probability.
  at_limit = i + 1 >= s.max_lengths  # [batch]
  forbidden = at_limit[:, None, None] & (jnp.arange(vocab) != eos_id)  # [batch, 1, V]
  candidates = jnp.where(forbidden, NEG_INF, logits + offset[:, :, None])  # [batch, beam, V]

  # The best 2 * beam extensions hold at least `beam` not ending in EOS (at most one EOS
  # extension per beam), enough to refill the live beams.
  top_scores, top_index = ops.top_k(candidates.reshape(batch, k * vocab), 2 * k)
  top_beam = top_index // vocab  # [batch, 2*beam]
  top_token = (top_index % vocab).astype(jnp.int32)  # [batch, 2*beam]
  gather = batch_rows.gather_per_sentence
  top_seqs = gather(s.alive_seqs, top_beam).at[:, :, i + 1].set(top_token)
  top_is_eos = top_token == eos_id  # [batch, 2*beam]

  # Live: the best `beam` extensions that do not end in EOS. The -inf key ranks an EOS
  # extension below every other one, empty ones included, so no live row ever holds EOS.
  alive_key = jnp.where(top_is_eos, -jnp.inf, top_scores)
  _, alive_pos = ops.top_k(alive_key, k)  # [batch, beam]
  alive_log_probs = jnp.take_along_axis(top_scores, alive_pos, axis=1)
  alive_seqs = gather(top_seqs, alive_pos)  # [batch, beam, length]
  cache = reorder_cache(cache, jnp.take_along_axis(top_beam, alive_pos, axis=1))

  # Finished: EOS extensions ranked among the best `beam`, while the sentence is searched.
  new = top_is_eos[:, :k] & (top_scores[:, :k] > _REAL) & s.active[:, None]  # [batch, beam]
  new_scores = jnp.where(new, top_scores[:, :k] / length_penalty(i + 1, alpha), NEG_INF)
  # Existing finished hypotheses come first, so a tie keeps the earlier one.
  merged_scores = jnp.concatenate([s.finished_scores, new_scores], axis=1)  # [batch, 2*beam]
  finished_scores, finished_pos = ops.top_k(merged_scores, k)
  finished_seqs = gather(jnp.concatenate([s.finished_seqs, top_seqs[:, :k]], axis=1),
                         finished_pos)
  num_finished = s.num_finished + jnp.sum(new, axis=1)

  # A live hypothesis' score can only fall as it grows (log-probabilities are <= 0) and its
  # penalty is largest at the sentence's limit: this is the best it could ever reach. The
  # search goes on while it could still enter the `nbest` finished hypotheses returned.
  best_alive_bound = alive_log_probs[:, 0] / length_penalty(s.max_lengths, alpha)  # [batch]
  active = (s.active & (i + 1 < s.max_lengths) & (num_finished < k)
            & (best_alive_bound > finished_scores[:, nbest - 1]))
  return BeamState(i + 1, alive_seqs, alive_log_probs, finished_seqs, finished_scores,
                   num_finished, active, s.max_lengths, cache)
