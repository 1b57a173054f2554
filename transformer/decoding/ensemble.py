"""Ensembles: several models decoding as one, each with its own cache.

At each step every model reads the same last tokens with its own cached state and gives its
next-token log-probabilities; the ensemble's are their mean, renormalised (the normalised
geometric mean of the models' distributions). The searches take the combined callback like a
single model's (`transformer.decoding.decode`): the cache is the tuple of the models' caches,
and a beam reorder reorders each.

The models (seeds, runs, checkpoints of one run) must share the vocabulary.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from transformer.decoding import decode

# (tokens_to_logits, initial cache, beam reorder or None), as `translate.decoding_setup` returns.
Setup = tuple[decode.TokensToLogits, Any, Callable[[Any, jax.Array], Any] | None]


def mean_log_probs(logits: Sequence[jax.Array]) -> jax.Array:
  """The models' next-token logits `[N, V]` each -> the ensemble's log-probabilities `[N, V]`:
  the mean of their log-softmaxes, renormalised."""
  stacked = jnp.stack([jax.nn.log_softmax(x.astype(jnp.float32), axis=-1) for x in logits])
  return jax.nn.log_softmax(jnp.mean(stacked, axis=0), axis=-1)


def combine(setups: Sequence[Setup]) -> Setup:
  """One `(tokens_to_logits, cache, reorder)` that decodes with every model of `setups`.

  Raises:
    ValueError: no model, or some reorder their beams and others not (every setup must be
      made for the same search).
  """
  if not setups:
    raise ValueError("an ensemble needs at least one model")
  reorders = [reorder for _, _, reorder in setups]
  if len({r is None for r in reorders}) > 1:
    raise ValueError("the ensemble's models were set up for different searches")

  def tokens_to_logits(ids: jax.Array, caches: tuple) -> tuple[jax.Array, tuple]:
    outputs = [step(ids, cache) for (step, _, _), cache in zip(setups, caches)]
    return mean_log_probs([logits for logits, _ in outputs]), tuple(c for _, c in outputs)

  reorder = None
  if reorders[0] is not None:
    def reorder(caches: tuple, parents: jax.Array) -> tuple:
      return tuple(r(cache, parents) for r, cache in zip(reorders, caches))

  return tokens_to_logits, tuple(cache for _, cache, _ in setups), reorder
