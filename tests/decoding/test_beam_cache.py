"""The beam layout against plain references, with a tiny random Transformer: the search that
copies every beam's cache when beams are reordered, and the full forward pass over each beam's
own history."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from transformer.decoding import backend_ops
from transformer.decoding import beam_cache
from transformer.decoding import decode
from transformer.decoding import translate
from transformer.model.transformer import build_model, init_params
from transformer.tokens import EOS_ID, PAD_ID

VOCAB = 13


def _model(seed: int):
  config = base.get_config()
  config.model.update(vocab_size=VOCAB, d_model=16, d_ff=32, num_heads=2, d_k=8, d_v=8,
                      num_layers=2)
  model = build_model(config)
  return model, jax.jit(lambda: init_params(model, jax.random.key(seed)))()


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


# Both layouts at beam 4; the CPU layout's reorder also at beam 2.
@pytest.mark.parametrize("beam_size,cpu_workarounds", [(4, "off"), (4, "on"), (2, "on")])
def test_shared_beam_history_equals_copying_it(beam_size, cpu_workarounds):
  """The beam layout (history shared through origin tables, one copy of the encoder's
  keys/values per sentence) against the search that copies every beam's cache rows, with the
  library ops and whole-cache reads: same hypotheses, same scores. EOS is held back so the
  searches run to 40 steps, through every prefix length read with the CPU workarounds (16,
  32, 40)."""
  model, params = _model(seed=3)
  ops = backend_ops.for_setting(cpu_workarounds)
  inputs = jnp.array([[4, 5, 6, 7, 8, 9, 10, 1], [11, 1, 0, 0, 0, 0, 0, 0],
                      [3, 12, 5, 1, 0, 0, 0, 0]])
  max_lengths, steps = (40, 15, 33), 40

  @jax.jit
  def shared(inputs):
    tokens_to_logits, cache, reorder = translate.decoding_setup(model, params, inputs, steps,
                                                                beam_size, ops=ops)
    layout = beam_cache.TransposedBeamKVCache if ops.transposed_keys else beam_cache.BeamKVCache
    assert all(type(c) is layout and c.read is ops.cache_read for c in cache.self_attention)
    return decode.beam_search(_without_eos(tokens_to_logits), cache, jnp.array(max_lengths),
                              steps, beam_size=beam_size, alpha=0.6, reorder_cache=reorder,
                              ops=ops)

  ids, scores = shared(inputs)
  ref_ids, ref_scores = _copying_search(model, beam_size, max_lengths, steps)(params, inputs)
  lengths = np.argmax(np.asarray(ids) == EOS_ID, axis=1) + 1
  np.testing.assert_array_equal(lengths, max_lengths)
  np.testing.assert_array_equal(ids, ref_ids)
  np.testing.assert_allclose(scores, ref_scores, rtol=1e-5)


@pytest.mark.parametrize("cpu_workarounds", ["on", "off"])
def test_reordered_beams_see_their_own_history(cpu_workarounds):
  """Step by step with random reorders, past the first prefix length: each beam's logits equal
  the full forward pass over the tokens its history holds (its ancestors' tokens, then its
  own)."""
  model, params = _model(seed=4)
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
