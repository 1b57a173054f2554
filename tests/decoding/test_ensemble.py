"""Ensembles (transformer/decoding/ensemble.py) on the toy model of test_decode: one model, or
two copies of it, decodes as the model does; two different models decode with the mean of
their log-probabilities, renormalised, recomputed here in NumPy (float64) at every step of the
hypotheses the searches return."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.decoding.test_decode import ToyModel, _penalty, _strip
from transformer.decoding import decode
from transformer.decoding import ensemble
from transformer.tokens import PAD_ID

_LIMITS = jnp.array([4, 5, 3, 5])


def _setups(*models):
  return [(m.tokens_to_logits, m.cache(), None) for m in models]


def _searches(step, cache):
  """(greedy, beam-3) searches with the callback `step` from `cache`."""
  greedy = jax.jit(lambda c: decode.greedy_search(step, c, _LIMITS, 5))
  beam = jax.jit(lambda c: decode.beam_search(step, c, _LIMITS, 5, beam_size=3, alpha=0.6))
  return (lambda: greedy(cache)), (lambda: beam(cache))


def _alone(model):
  return _searches(model.tokens_to_logits, model.cache())


def _together(*models):
  step, cache, _ = ensemble.combine(_setups(*models))
  return _searches(step, cache)


def _numpy_log_probs(models, sentence: int, tokens) -> np.ndarray:
  """[len(tokens), V]: the ensemble's log-probabilities before each token, in float64."""
  states = [m.h0[sentence] for m in models]
  rows, previous = [], PAD_ID
  for token in tokens:
    logs = []
    for i, m in enumerate(models):
      states[i] = np.tanh(states[i] @ m.a + m.e[previous])
      logits = states[i] @ m.u
      logs.append(logits - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max())
    mean = np.mean(logs, axis=0)
    rows.append(mean - np.log(np.sum(np.exp(mean))))
    previous = token
  return np.array(rows)


def test_one_model_or_two_copies_decode_as_the_model():
  model = ToyModel(seed=4, vocab=6, batch=4)
  greedy, beam = _alone(model)
  for members in ((model,), (model, model)):
    greedy_e, beam_e = _together(*members)
    np.testing.assert_array_equal(greedy_e(), greedy())
    (ids, scores), (ids_e, scores_e) = beam(), beam_e()
    np.testing.assert_array_equal(ids_e, ids)
    np.testing.assert_allclose(scores_e, scores, rtol=1e-5)


def test_two_models_decode_with_their_mean_log_probabilities():
  models = (ToyModel(seed=5, vocab=6, batch=4), ToyModel(seed=6, vocab=6, batch=4))
  greedy, beam = _together(*models)
  alone = [_alone(m)[0]() for m in models]
  together = np.asarray(greedy())
  assert not all(np.array_equal(together, a) for a in alone), "the ensemble is one model"
  for b in range(4):
    tokens = _strip(together[b])
    log_probs = _numpy_log_probs(models, b, tokens)
    # Greedy: each token is the argmax of the ensemble's distribution (EOS where forced).
    for i, token in enumerate(tokens[:-1]):
      assert token == int(np.argmax(log_probs[i])), (b, i)
  ids, scores = beam()
  for b in range(4):
    tokens = _strip(ids[b])
    log_probs = _numpy_log_probs(models, b, tokens)
    expected = sum(log_probs[i, t] for i, t in enumerate(tokens)) / _penalty(len(tokens), 0.6)
    np.testing.assert_allclose(scores[b], expected, rtol=1e-5)


def test_an_ensemble_needs_models_set_up_alike():
  model = ToyModel(seed=4, vocab=6, batch=1)
  with pytest.raises(ValueError, match="at least one model"):
    ensemble.combine([])
  with pytest.raises(ValueError, match="set up for different searches"):
    ensemble.combine([(model.tokens_to_logits, model.cache(), None),
                      (model.tokens_to_logits, model.cache(), lambda c, p: c)])
