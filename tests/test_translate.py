"""Translation with a tiny random Transformer: cached decoding against the full forward pass,
batching against one sentence at a time, and the text-level wrapper."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from transformer import attention, decode, translate
from transformer.model import build_model, init_params
from transformer.tokens import EOS_ID, PAD_ID

VOCAB = 13


def _config(positional="sinusoidal", max_len=64, beam_size=4, max_extra_len=6):
  config = base.get_config()
  config.model.update(vocab_size=VOCAB, d_model=16, d_ff=32, num_heads=2, d_k=8, d_v=8,
                      num_layers=2, positional=positional, max_len=max_len)
  config.decode.update(beam_size=beam_size, max_extra_len=max_extra_len, batch_size=2)
  return config


def _model(config, seed=0):
  model = build_model(config)
  return model, init_params(model, jax.random.key(seed))


class CharTokenizer:
  """Letters a..j are ids 3..12; the interface of the project's tokenizer."""

  vocab_size = VOCAB

  def encode(self, text):
    return [ord(c) - ord("a") + 3 for c in text if "a" <= c <= "j"]

  def decode(self, ids):
    out = []
    for i in ids:
      if i == EOS_ID:
        break
      if i > 2:
        out.append(chr(i - 3 + ord("a")))
    return "".join(out)


@pytest.mark.parametrize("positional, attention_impl",
                         [("sinusoidal", "reference"), ("learned", "reference"),
                          ("sinusoidal", "xla")])
def test_cached_decoding_matches_the_full_forward_pass(positional, attention_impl):
  config = _config(positional)
  config.model.attention_impl = attention_impl
  model, params = _model(config)
  inputs = jnp.array([[5, 6, 7, 8, 9, 1], [5, 6, 1, 0, 0, 0]])  # the second row is padded
  steps = 20  # past the first prefix length the steps read (16)
  assert attention.prefix_lengths(steps) == (16, 20)
  tokens_to_logits, cache, _ = translate.decoding_setup(model, params, inputs, steps, beam_size=1)
  step = jax.jit(tokens_to_logits)
  ids = jnp.full((2, 1), PAD_ID, jnp.int32)
  cached, fed = [], []
  for _ in range(steps):
    logits, cache = step(ids, cache)  # [2, V]
    cached.append(logits)
    # Follow the greedy path, skipping PAD/EOS so the full pass sees no target padding.
    ids = (jnp.argmax(logits[:, 3:], axis=-1) + 3)[:, None].astype(jnp.int32)
    fed.append(ids[:, 0])
  targets = jnp.stack(fed, axis=1)  # [2, steps]
  full = model.apply({"params": params}, inputs, targets)  # [2, steps, V]
  np.testing.assert_allclose(jnp.stack(cached, axis=1), full, atol=1e-5, rtol=1e-5)


def test_each_source_decodes_as_if_alone():
  config = _config()
  model, params = _model(config, seed=1)
  sources = [[4, 5, 6, 7, 8, 9, 10, 1], [11, 1], [3, 12, 5, 1]]
  inputs = np.zeros((3, 8), np.int32)
  for row, source in enumerate(sources):
    inputs[row, :len(source)] = source
  together = np.asarray(translate.translate_batch(model, params, inputs, config.decode))
  assert together.shape == (3, 8 + 6)
  for row, source in enumerate(sources):
    alone = np.asarray(translate.translate_batch(model, params, np.array([source]),
                                                 config.decode))[0]
    n = list(alone).index(EOS_ID) + 1
    assert n <= len(source) + 6  # its own input length + max_extra_len
    np.testing.assert_array_equal(together[row, :n], alone[:n])
    assert np.all(together[row, n:] == PAD_ID)


def test_beam_size_one_is_greedy_with_the_model():
  config = _config(beam_size=1)
  model, params = _model(config, seed=2)
  inputs = jnp.array([[4, 5, 6, 7, 1], [8, 9, 1, 0, 0]])
  greedy = translate.translate_batch(model, params, inputs, config.decode)

  @jax.jit
  def beam_one(inputs):
    tokens_to_logits, cache, _ = translate.decoding_setup(model, params, inputs, 11, beam_size=1)
    return decode.beam_search(tokens_to_logits, cache, jnp.array([11, 9]), 11, beam_size=1,
                              alpha=0.6)[0]

  np.testing.assert_array_equal(beam_one(inputs), greedy)


def _without_eos(tokens_to_logits):
  """The callback with EOS held back, so that every hypothesis runs to its length limit."""

  def fn(ids, cache):
    logits, cache = tokens_to_logits(ids, cache)
    return logits.at[:, EOS_ID].add(-1e4), cache

  return fn


@pytest.mark.parametrize("beam_size", [2, 4])
def test_shared_beam_history_equals_copying_it(beam_size):
  """The beam layout (history shared through `beam_origin`, attention over the prefix written
  so far) against the plain search that copies every beam's cache rows when beams are
  reordered and attends over the whole cache: same hypotheses, same scores. EOS is held back
  so the searches run to 40 steps, through every prefix length (16, 32, 40)."""
  config = _config()
  model, params = _model(config, seed=3)
  inputs = jnp.array([[4, 5, 6, 7, 8, 9, 10, 1], [11, 1, 0, 0, 0, 0, 0, 0],
                      [3, 12, 5, 1, 0, 0, 0, 0]])
  max_lengths, steps = jnp.array([40, 15, 33]), 40
  assert attention.prefix_lengths(steps) == (16, 32, 40)

  @jax.jit
  def shared(inputs):
    tokens_to_logits, cache, reorder = translate.decoding_setup(model, params, inputs, steps,
                                                                beam_size)
    assert any(k.endswith("/beam_origin") for k in cache)
    return decode.beam_search(_without_eos(tokens_to_logits), cache, max_lengths, steps,
                              beam_size=beam_size, alpha=0.6, reorder_cache=reorder)

  @jax.jit
  def copied(inputs):
    cache = translate.init_cache(model, params, inputs, steps)

    def tokens_to_logits(ids, cache):
      logits, variables = model.apply({"params": params, "cache": cache}, None, None, ids,
                                      decode=True, mutable=["cache"], method="decode")
      return logits[:, 0], variables["cache"]

    return decode.beam_search(_without_eos(tokens_to_logits), cache, max_lengths, steps,
                              beam_size=beam_size, alpha=0.6)

  (ids, scores), (ref_ids, ref_scores) = shared(inputs), copied(inputs)
  lengths = np.argmax(np.asarray(ids) == EOS_ID, axis=1) + 1
  np.testing.assert_array_equal(lengths, max_lengths)
  np.testing.assert_array_equal(ids, ref_ids)
  np.testing.assert_allclose(scores, ref_scores, rtol=1e-5)


def test_reordered_beams_see_their_own_history():
  """Step by step with random reorders, past the first prefix length: each beam's logits equal
  the full forward pass over the tokens its history holds (its ancestors' tokens, then its
  own)."""
  config = _config()
  model, params = _model(config, seed=4)
  inputs = jnp.array([[4, 5, 6, 7, 1], [8, 9, 1, 0, 0]])
  batch, beams, steps = 2, 3, 20
  tokens_to_logits, cache, reorder = translate.decoding_setup(model, params, inputs, steps,
                                                              beams)
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


def test_prefix_lengths_double_up_to_the_cache():
  assert attention.prefix_lengths(82) == (16, 32, 64, 82)
  assert attention.prefix_lengths(64) == (16, 32, 64)
  assert attention.prefix_lengths(10) == (10,)


def test_translate_texts_keeps_order_and_empty_lines():
  # Greedy keeps compiling short; batching and ordering do not depend on the search.
  config = _config(beam_size=1, max_extra_len=4)
  model, params = _model(config, seed=3)
  tokenizer = CharTokenizer()
  sentences = ["abc", "", "jihgfedcba", "de", "   ", "fgh", "a"]
  results = translate.translate_texts(model, params, tokenizer, sentences, config)
  assert len(results) == len(sentences)
  assert results[1] == "" and results[4] == ""
  for text, result in zip(sentences, results):
    if text.strip():
      alone = translate.translate_texts(model, params, tokenizer, [text], config,
                                        progress=False)
      assert [result] == alone
  assert any(results[i] for i in (0, 2, 3, 5, 6)), "all outputs empty: weak test"


def test_too_long_input_is_truncated_with_a_warning_naming_the_line():
  config = _config(positional="learned", max_len=8, max_extra_len=2)
  model, params = _model(config, seed=4)
  tokenizer = CharTokenizer()
  with pytest.warns(UserWarning, match="line 2: source has 13 tokens"):
    results = translate.translate_texts(model, params, tokenizer, ["abc", "abcdefghijab"],
                                        config, progress=False)
  with pytest.warns(UserWarning, match="line 2: .* output is limited to .*max_len=8"):
    truncated = translate.translate_texts(model, params, tokenizer, ["abc", "abcdefg"], config,
                                          progress=False)
  assert results == truncated


def test_tokenizer_larger_than_the_model_is_refused():
  config = _config()
  model, params = _model(config)
  tokenizer = CharTokenizer()
  tokenizer.vocab_size = VOCAB + 5
  with pytest.raises(ValueError, match="config.model.vocab_size"):
    translate.translate_texts(model, params, tokenizer, ["abc"], config, progress=False)
