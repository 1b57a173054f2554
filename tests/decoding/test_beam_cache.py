"""The beam layout against plain references, with a tiny random Transformer: the search that
copies every beam's cache when beams are reordered, the full forward pass over each beam's
own history, and exhaustive search; for the paper's positions and for each scheme whose
positions enter self-attention, which a step must see at its absolute position."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from tests import support
from transformer.decoding import backend_ops
from transformer.decoding import beam_cache
from transformer.decoding import decode
from transformer.decoding import translate
from transformer.model.transformer import build_model
from transformer.tokens import EOS_ID, PAD_ID

VOCAB = 13
RELATIVE = ("rope", "t5", "shaw", "alibi")


def _model(seed: int, vocab: int = VOCAB, **overrides):
  config = base.get_config()
  config.model.update(dict(dict(vocab_size=vocab, d_model=16, d_ff=32, num_heads=2, d_k=8,
                                d_v=8, num_layers=2), **overrides))
  model = build_model(config)
  return model, support.initial_params(model, seed)


def _without_eos(tokens_to_logits):
  """The callback with EOS held back, so that every hypothesis runs to its length limit."""

  def fn(ids, cache):
    logits, cache = tokens_to_logits(ids, cache)
    return logits.at[:, EOS_ID].add(-1e4), cache

  return fn


@functools.cache  # one compiled reference per setting
def _copying_search(model, beam_size, max_lengths, steps):
  """Beam search over the model's own cache, every beam's rows copied at each reorder, with
  the library ops and whole-cache reads."""

  @jax.jit
  def run(params, inputs):
    def tokens_to_logits(ids, cache):
      return model.apply({"params": params}, ids, cache, method="decode_step")

    cache = translate.init_cache(model, params, inputs, steps, ops=backend_ops.LIBRARY)
    return decode.beam_search(_without_eos(tokens_to_logits), cache, jnp.array(max_lengths),
                              steps, beam_size=beam_size, alpha=0.6)

  return run


# Both layouts at beam 4; the CPU layout's reorder also at beam 2, there with the batch
# shrinking as sentences finish (3 sentences, then the third alone after step 33).
@pytest.mark.parametrize("beam_size,cpu_workarounds,batch_sizes",
                         [(4, "off", ()), (4, "on", ()), (2, "on", (1,))])
def test_shared_beam_history_equals_copying_it(beam_size, cpu_workarounds, batch_sizes):
  """The beam layout (history shared through origin tables, one copy of the encoder's
  keys/values per sentence) against the search that copies every beam's cache rows, with the
  library ops and whole-cache reads: same hypotheses, same scores. EOS is held back so the
  searches run to 40 steps, through every prefix length read with the CPU workarounds (16,
  32, 40). With `batch_sizes` the finished sentences' rows of the layout leave the batch."""
  model, params = _model(seed=3)
  ops = backend_ops.for_setting(cpu_workarounds)
  inputs = jnp.array([[4, 5, 6, 7, 8, 9, 10, 1], [11, 1, 0, 0, 0, 0, 0, 0],
                      [3, 12, 5, 1, 0, 0, 0, 0]])
  max_lengths, steps = (33, 15, 40), 40

  @jax.jit
  def shared(inputs):
    tokens_to_logits, cache, reorder = translate.decoding_setup(model, params, inputs, steps,
                                                                beam_size, ops=ops)
    layout = beam_cache.TransposedBeamKVCache if ops.transposed_keys else beam_cache.BeamKVCache
    assert all(type(c) is layout and c.read is ops.cache_read for c in cache.self_attention)
    return decode.beam_search(_without_eos(tokens_to_logits), cache, jnp.array(max_lengths),
                              steps, beam_size=beam_size, alpha=0.6, reorder_cache=reorder,
                              ops=ops, batch_sizes=batch_sizes)

  ids, scores = shared(inputs)
  ref_ids, ref_scores = _copying_search(model, beam_size, max_lengths, steps)(params, inputs)
  lengths = np.argmax(np.asarray(ids) == EOS_ID, axis=1) + 1
  np.testing.assert_array_equal(lengths, max_lengths)
  np.testing.assert_array_equal(ids, ref_ids)
  np.testing.assert_allclose(scores, ref_scores, rtol=1e-5)


@pytest.mark.parametrize("cpu_workarounds, positional", [
    ("on", "sinusoidal"), ("off", "sinusoidal"), *[("on", p) for p in RELATIVE]])
def test_reordered_beams_see_their_own_history(cpu_workarounds, positional):
  """Step by step with random reorders, past the first prefix length: each beam's logits equal
  the full forward pass over the tokens its history holds (its ancestors' tokens, then its
  own). The relative schemes with one layer: how a step sees positions is the same in every
  layer, and the paper's two layers show each layer reading its own history."""
  model, params = _model(seed=4, positional=positional,
                         num_layers=2 if positional == "sinusoidal" else 1)
  inputs = jnp.array([[4, 5, 6, 7, 1], [8, 9, 1, 0, 0]])
  batch, beams, steps = 2, 3, 20
  tokens_to_logits, cache, reorder = translate.decoding_setup(
      model, params, inputs, steps, beams, ops=backend_ops.for_setting(cpu_workarounds))
  step, reorder = jax.jit(tokens_to_logits), jax.jit(reorder)
  # The full pass over each row's history, padded to `steps` tokens with a filler that the
  # causal mask hides from the position compared.
  full = jax.jit(lambda targets: model.apply({"params": params},
                                             jnp.repeat(inputs, beams, axis=0), targets))
  rng = np.random.default_rng(0)
  history = [[[PAD_ID] for _ in range(beams)] for _ in range(batch)]  # each beam's inputs
  for t in range(steps):
    ids = np.array([h[-1] for sentence in history for h in sentence], np.int32)[:, None]
    logits, cache = step(jnp.asarray(ids), cache)  # [batch * beams, V]
    targets = np.full((batch * beams, steps), 3, np.int32)  # shifted right inside the model
    for row, h in enumerate(h for sentence in history for h in sentence):
      targets[row, :t] = h[1:]
    np.testing.assert_allclose(logits, full(jnp.asarray(targets))[:, t], atol=1e-5, rtol=1e-5)
    parents = rng.integers(0, beams, (batch, beams))
    cache = reorder(cache, jnp.asarray(parents, jnp.int32))
    history = [[history[b][p] + [int(rng.integers(3, VOCAB))] for p in parents[b]]
               for b in range(batch)]


# EOS's log-probability lowered by a constant, which α = 2 divides by more for a longer
# output: the best outputs run to several steps, where the positions in the cache matter.
_EOS_PENALTY = 6.0


def _adjusted(logits):
  """PAD never chosen (inside a target the full pass reads it as padding), EOS held back."""
  return logits.at[..., PAD_ID].set(-1e9).at[..., EOS_ID].add(-_EOS_PENALTY)


def _penalty(length, alpha):
  return ((5.0 + length) / 6.0) ** alpha


@pytest.mark.parametrize("positional", [
    pytest.param("sinusoidal", marks=pytest.mark.reference_numerics), *RELATIVE])
def test_wide_beam_finds_the_exhaustive_best(positional):
  """A beam wider than the outputs it can hold (tokens 2-4 and EOS, at most 4 of them: 40
  outputs) returns the best of all, scored by the full forward pass, under the GNMT penalty
  with α = 2."""
  vocab, alpha, limits, steps = 5, 2.0, (2, 3, 4), 6
  model, params = _model(seed=5, vocab=vocab, positional=positional, num_layers=1)
  inputs = np.array([[2, 3, 4, 1], [4, 4, 1, 0], [3, 2, 2, 1]])
  ops = backend_ops.for_setting("on")

  @jax.jit  # the encoder and the search in one program, as translation compiles them
  def search(params, inputs):
    tokens_to_logits, cache, reorder = translate.decoding_setup(model, params, inputs, steps,
                                                                50, ops=ops)

    def adjusted(ids, cache):
      logits, cache = tokens_to_logits(ids, cache)
      return _adjusted(logits), cache

    return decode.beam_search(adjusted, cache, jnp.array(limits), steps, beam_size=50,
                              alpha=alpha, reorder_cache=reorder, ops=ops)

  ids, scores = search(params, inputs)
  outputs = [(*p, EOS_ID) for n in range(1, 5) for p in itertools.product((2, 3, 4), repeat=n - 1)]
  targets = np.zeros((len(outputs), 4), np.int32)
  for row, tokens in enumerate(outputs):
    targets[row, :len(tokens)] = tokens
  full = jax.jit(lambda x: _adjusted(model.apply({"params": params}, x, jnp.asarray(targets))))
  lengths = []
  for b, limit in enumerate(limits):
    logits = np.asarray(full(np.repeat(inputs[b:b + 1], len(outputs), axis=0)), np.float64)
    top = logits.max(-1, keepdims=True)
    log_p = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    ranked = sorted(((sum(log_p[row, t, tok] for t, tok in enumerate(tokens))
                      / _penalty(len(tokens), alpha), tokens)
                     for row, tokens in enumerate(outputs) if len(tokens) <= limit),
                    reverse=True)
    (best, tokens), (second, _) = ranked[0], ranked[1]
    assert best - second > 1e-4, "near tie: pick another seed"
    found = [int(t) for t in ids[b]]
    assert tuple(found[:found.index(EOS_ID) + 1]) == tokens
    lengths.append(len(tokens))
    np.testing.assert_allclose(scores[b], best, rtol=1e-5)
  assert max(lengths) >= 3, "the best outputs end at once: a weak test"
