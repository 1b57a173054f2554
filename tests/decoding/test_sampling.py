"""Sampling against the distribution it should draw from, computed in NumPy (float64) from the
definitions (transformer/decoding/sampling.py): temperature, then top k, then the top-p
nucleus. Token frequencies over many draws must match it within 5 standard errors, tokens
outside it must never be drawn, and each case checks that a wrong temperature or a wrong
nucleus would have been caught. Same seed, same samples, whatever the batch."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.decoding.test_decode import ToyModel, _strip
from transformer.decoding import sampling
from transformer.tokens import EOS_ID

# First-token logits over 8 tokens; EOS (id 1) is never drawn first (its logit is far below).
_LOGITS = np.log(np.array([0.25, 1e-30, 0.4, 0.15, 0.1, 0.05, 0.03, 0.02]))
_DRAWS = 40_000


def _expected(temperature: float, top_k: int, top_p: float) -> np.ndarray:
  logits = _LOGITS / temperature
  probs = np.exp(logits - logits.max())
  probs /= probs.sum()
  order = np.argsort(-probs, kind="stable")
  keep = np.zeros(len(probs), bool)
  total = 0.0
  for rank, token in enumerate(order):
    if (top_k and rank >= top_k) or total >= top_p:
      break
    keep[token], total = True, total + probs[token]
  kept = np.where(keep, probs, 0.0)
  return kept / kept.sum()


def _fixed_logits(ids, cache):  # the same distribution at every step, whatever came before
  return jnp.broadcast_to(jnp.asarray(_LOGITS, jnp.float32), (ids.shape[0], len(_LOGITS))), cache


@functools.lru_cache(maxsize=None)
def _first_tokens(how: sampling.Sampling) -> np.ndarray:
  search = jax.jit(lambda cache, ids: sampling.sample_search(
      _fixed_logits, cache, jnp.full((_DRAWS,), 2), 2, ids, how))
  ids = search({"rows": jnp.zeros((_DRAWS,))}, jnp.arange(_DRAWS))
  assert np.all(np.asarray(ids[:, 1]) == EOS_ID)  # forced at the limit
  return np.asarray(ids[:, 0])


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 3, 1.0), (1.0, 0, 0.7), (1.5, 5, 0.8)])
def test_draws_follow_the_tempered_truncated_distribution(temperature, top_k, top_p):
  expected = _expected(temperature, top_k, top_p)
  counts = np.bincount(_first_tokens(sampling.Sampling(temperature, top_k, top_p)),
                       minlength=len(_LOGITS))
  frequencies = counts / _DRAWS
  assert np.all(counts[expected == 0] == 0), counts
  bound = 5 * np.sqrt(expected * (1 - expected) / _DRAWS) + 1e-12
  np.testing.assert_array_less(np.abs(frequencies - expected), bound)
  # The test can fail: another temperature, or a nucleus that stops before the token that
  # crosses top_p, is far outside the bound.
  wrong_temperature = _expected(temperature * 1.25, top_k, top_p)
  assert np.max(np.abs(wrong_temperature - expected) - bound) > 0
  if top_p < 1:
    wrong_nucleus = _expected(temperature, top_k, top_p - 0.15)
    assert np.sum(wrong_nucleus > 0) < np.sum(expected > 0)


def test_same_seed_same_samples_whatever_the_batch():
  model = ToyModel(seed=3, vocab=6, batch=8, scale=1.0)
  limits = jnp.array([5, 6, 4, 6, 5, 6, 3, 6])
  how = sampling.Sampling(temperature=1.2, top_k=4, top_p=0.9, seed=7)

  @functools.partial(jax.jit, static_argnames=("how", "batch_sizes"))
  def sample(cache, limits, ids, how, batch_sizes=()):
    return sampling.sample_search(model.tokens_to_logits, cache, limits, 6, ids, how,
                                  batch_sizes=batch_sizes)

  together = np.asarray(sample(model.cache(), limits, jnp.arange(8), how))
  assert len({_strip(row) for row in together}) > 4, together  # draws, not one answer
  np.testing.assert_array_equal(together, sample(model.cache(), limits, jnp.arange(8), how))
  # Sentences leaving the batch as they finish, and each sentence alone, draw the same.
  np.testing.assert_array_equal(
      together, sample(model.cache(), limits, jnp.arange(8), how, batch_sizes=(4, 2)))
  for b in (0, 5):
    alone = sample(model.cache(np.array([b])), limits[b:b + 1], jnp.array([b]), how)
    np.testing.assert_array_equal(together[b:b + 1], alone)
  other_seed = sample(model.cache(), limits, jnp.arange(8),
                      sampling.Sampling(temperature=1.2, top_k=4, top_p=0.9, seed=8))
  assert not np.array_equal(together, other_seed)


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=0.0), "temperature=0.0 must be > 0"),
    (dict(top_k=-1), "top_k=-1 must be an integer >= 0"),
    (dict(top_p=1.5), r"top_p=1.5 must be in \(0, 1\]"),
])
def test_bad_settings_are_one_line(kwargs, message):
  with pytest.raises(ValueError, match=message):
    sampling.Sampling(**kwargs)
