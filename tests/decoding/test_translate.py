"""Translation with a tiny random Transformer: batching against one sentence at a time, beam
size 1 against greedy search, and the text-level wrapper. (Cached decoding is checked against
the full forward pass in test_model.py, the beam layout in test_beam_cache.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from configs import base
from tests import support
from transformer.decoding import backend_ops
from transformer.decoding import decode
from transformer.decoding import translate
from transformer.model.transformer import build_model
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
  return model, support.initial_params(model, seed)


def _ops(config):
  return backend_ops.for_setting(config.cpu_workarounds)


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


def test_each_source_decodes_as_if_alone(monkeypatch):
  # The batch of three shrinks to one sentence, the second (the longest, with the largest
  # limit), once the other two have finished (a batch of one has nothing to shrink):
  # finished sentences leaving the batch change no translation.
  monkeypatch.setattr(translate, "shrinking_sizes", lambda batch: (1,))
  translate._translate.clear_cache()
  config = _config()
  model, params = _model(config, seed=1)
  sources = [[11, 1], [4, 5, 6, 7, 8, 9, 10, 1], [3, 12, 5, 1]]
  inputs = np.zeros((3, 8), np.int32)
  for row, source in enumerate(sources):
    inputs[row, :len(source)] = source
  together = np.asarray(translate.translate_batch(model, params, inputs, config.decode,
                                                  ops=_ops(config)))
  assert together.shape == (3, 8 + 6)
  for row, source in enumerate(sources):
    # A batch of one, padded as in the batch (one compiled program for all three).
    alone = np.asarray(translate.translate_batch(model, params, inputs[row:row + 1],
                                                 config.decode, ops=_ops(config)))[0]
    n = list(alone).index(EOS_ID) + 1
    assert n <= len(source) + 6  # its own input length + max_extra_len
    np.testing.assert_array_equal(together[row, :n], alone[:n])
    assert np.all(together[row, n:] == PAD_ID)


def test_translate_texts_keeps_order_and_empty_lines(monkeypatch):
  # Greedy keeps compiling short; batching and ordering do not depend on the search.
  config = _config(beam_size=1, max_extra_len=4)
  model, params = _model(config, seed=3)
  tokenizer = CharTokenizer()
  sentences = ["abc", "", "jihgfedcba", "de", "   ", "fgh", "a"]
  shapes = []
  batch = translate.decode_batch
  monkeypatch.setattr(translate, "decode_batch",
                      lambda m, p, inputs, d, **kw: (shapes.append(inputs.shape)
                                                     or batch(m, p, inputs, d, **kw)))
  translate._translate.clear_cache()
  results = translate.translate_texts(model, params, tokenizer, sentences, config)
  # One compiled program per batch shape (rows, source bucket), whatever the search does
  # inside it (prefix-length branches included).
  assert len(shapes) == 3 and translate._translate._cache_size() == len(set(shapes))
  assert len(results) == len(sentences)
  assert results[1] == "" and results[4] == ""
  for text, result in zip(sentences, results):
    if text.strip():
      alone = translate.translate_texts(model, params, tokenizer, [text], config,
                                        progress=False)
      assert [result] == alone
  assert any(results[i] for i in (0, 2, 3, 5, 6)), "all outputs empty: weak test"


def test_beam_size_one_is_greedy_with_the_model():
  # The setting and a batch shape of `test_translate_texts_keeps_order_and_empty_lines` (just
  # above: its compiled programs are still in memory): one compiled greedy search for both.
  config = _config(beam_size=1, max_extra_len=4)
  model, params = _model(config, seed=2)
  inputs = jnp.array([[4, 5, 6, 7, 1, 0, 0, 0], [8, 9, 1, 0, 0, 0, 0, 0]])
  ops = _ops(config)
  greedy = translate.translate_batch(model, params, inputs, config.decode, ops=ops)

  @jax.jit
  def beam_one(inputs):  # 8 + 4 steps, each sentence its input length + 4
    tokens_to_logits, cache, _ = translate.decoding_setup(model, params, inputs, 12,
                                                          beam_size=1, ops=ops)
    return decode.beam_search(tokens_to_logits, cache, jnp.array([9, 7]), 12, beam_size=1,
                              alpha=0.6, ops=ops)[0]

  np.testing.assert_array_equal(beam_one(inputs), greedy)


def test_replicated_parameters_decode_on_one_device_with_the_same_translations(monkeypatch):
  """A training run's parameters, replicated over the 8 devices, are searched on one of
  them, not 8 times over; a tree with a sharded leaf (FSDP, tensor parallel) is left as it
  is."""
  # The setting and batch shapes of `test_translate_texts_keeps_order_and_empty_lines`: its
  # compiled programs serve; which device decodes does not depend on the search.
  config = _config(beam_size=1, max_extra_len=4)
  model, params = _model(config, seed=4)
  mesh = jax.make_mesh((8,), ("data",), devices=jax.devices())
  replicated = jax.device_put(params, NamedSharding(mesh, P()))
  devices = []
  batch = translate.decode_batch
  monkeypatch.setattr(translate, "decode_batch", lambda m, p, inputs, d, **kw: (
      devices.append({len(x.sharding.device_set) for x in jax.tree.leaves(p)})
      or batch(m, p, inputs, d, **kw)))
  sentences = ["abc", "jihgfedcba", "de"]
  tokenizer = CharTokenizer()
  from_replicated = translate.translate_texts(model, replicated, tokenizer, sentences, config,
                                              progress=False)
  assert devices and all(d == {1} for d in devices), devices
  devices.clear()
  assert from_replicated == translate.translate_texts(model, params, tokenizer, sentences,
                                                      config, progress=False)
  one = translate.on_one_device(replicated)
  jax.tree.map(np.testing.assert_array_equal, one, params)
  leaves, tree = jax.tree.flatten(replicated)
  split = jax.device_put(leaves[0], NamedSharding(mesh, P(*("data" if i == 0 else None
                                                              for i in range(leaves[0].ndim)))))
  mixed = jax.tree.unflatten(tree, [split] + leaves[1:])
  assert translate.on_one_device(mixed) is mixed


def test_too_long_input_is_truncated_with_a_warning_naming_the_line():
  # Greedy keeps compiling short; truncating the sources does not depend on the search.
  config = _config(positional="learned", max_len=8, beam_size=1, max_extra_len=2)
  model, params = _model(config, seed=4)
  tokenizer = CharTokenizer()
  with pytest.warns(UserWarning, match="line 2: source has 13 tokens"):
    results = translate.translate_texts(model, params, tokenizer, ["abc", "abcdefghijab"],
                                        config, progress=False)
  with pytest.warns(UserWarning, match="line 2: .* output is limited to .*max_len=8"):
    truncated = translate.translate_texts(model, params, tokenizer, ["abc", "abcdefg"], config,
                                          progress=False)
  assert results == truncated

