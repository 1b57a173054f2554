"""Greedy and beam search against independent references, on a toy recurrent "model".

The toy model is a tiny RNN written twice: in JAX as a `tokens_to_logits` callback with a
cache (a per-row state and a scalar step counter, like the Transformer's 'position'), and in
NumPy (float64) for the exhaustive reference that scores every possible output.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.decoding import backend_ops
from transformer.decoding import decode
from transformer.tokens import EOS_ID, PAD_ID


class ToyModel:
  """`h' = tanh(h A + E[id])`, `logits = h' U`; the source sets each sentence's initial h."""

  def __init__(self, seed: int, vocab: int, batch: int, hidden: int = 8, scale: float = 2.0):
    rng = np.random.default_rng(seed)
    self.vocab = vocab
    self.a = rng.normal(size=(hidden, hidden)) / np.sqrt(hidden)
    self.e = rng.normal(size=(vocab, hidden))
    self.u = rng.normal(size=(hidden, vocab)) * scale / np.sqrt(hidden)
    self.h0 = rng.normal(size=(batch, hidden))  # one "source" per sentence

  def cache(self, rows=None):
    h0 = self.h0 if rows is None else self.h0[rows]
    return {"h": jnp.asarray(h0, jnp.float32), "position": jnp.array(0, jnp.int32)}

  def tokens_to_logits(self, ids, cache):  # ids [rows, 1]
    h = jnp.tanh(cache["h"] @ jnp.asarray(self.a, jnp.float32)
                 + jnp.asarray(self.e, jnp.float32)[ids[:, 0]])
    logits = h @ jnp.asarray(self.u, jnp.float32)
    return logits, {"h": h, "position": cache["position"] + 1}

  def log_prob(self, sentence: int, tokens) -> float:
    """float64 log-probability of `tokens` (the output, EOS included) for one sentence."""
    h, total, previous = self.h0[sentence], 0.0, PAD_ID
    for token in tokens:
      h = np.tanh(h @ self.a + self.e[previous])
      logits = h @ self.u
      total += logits[token] - (np.log(np.sum(np.exp(logits - logits.max()))) + logits.max())
      previous = token
    return total


def _penalty(length, alpha):
  return ((5.0 + length) / 6.0) ** alpha


def exhaustive_nbest(model: ToyModel, sentence: int, limit: int, alpha: float, n: int):
  """The `n` best (tokens, score) over every output of <= `limit` tokens that ends in its only
  EOS, best first."""
  others = [t for t in range(model.vocab) if t != EOS_ID]
  scored = []
  for length in range(1, limit + 1):
    for prefix in itertools.product(others, repeat=length - 1):
      tokens = (*prefix, EOS_ID)
      scored.append((model.log_prob(sentence, tokens) / _penalty(length, alpha), tokens))
  scored.sort(reverse=True)
  gaps = [a[0] - b[0] for a, b in zip(scored[:n], scored[1:n + 1])]
  assert min(gaps) > 1e-4, "near tie: pick another seed"
  return [(tokens, score) for score, tokens in scored[:n]]


def exhaustive_best(model: ToyModel, sentence: int, limit: int, alpha: float):
  """Best (tokens, score) over every output of <= `limit` tokens that ends in its only EOS."""
  return exhaustive_nbest(model, sentence, limit, alpha, 1)[0]


def _strip(row) -> tuple:
  """Tokens up to and including the first EOS; asserts only PAD_ID follows."""
  row = [int(t) for t in row]
  end = row.index(EOS_ID) + 1
  assert all(t == PAD_ID for t in row[end:]), row
  return tuple(row[:end])


@functools.lru_cache(maxsize=None)  # one compiled search per model and setting
def _compiled(model, beam_size, alpha, ops):
  if beam_size is None:
    return jax.jit(functools.partial(decode.greedy_search, model.tokens_to_logits, ops=ops),
                   static_argnums=(2,))
  return jax.jit(functools.partial(decode.beam_search, model.tokens_to_logits,
                                   beam_size=beam_size, alpha=alpha, ops=ops),
                 static_argnums=(2,))


def _beam(model, limits, max_len, beam_size, alpha, rows=None, ops=backend_ops.LIBRARY):
  fn = _compiled(model, beam_size, alpha, ops)
  return fn(model.cache(rows), jnp.asarray(limits), max_len)


def _greedy(model, limits, max_len, rows=None, ops=backend_ops.LIBRARY):
  fn = _compiled(model, None, None, ops)
  return fn(model.cache(rows), jnp.asarray(limits), max_len)


@pytest.mark.reference_numerics
@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_wide_beam_finds_the_exhaustive_best(alpha):
  # 5 tokens, outputs of at most 4: 85 possible outputs and at most 80 extensions a step, so a
  # beam of 100 keeps everything and must return the exact best under the length penalty.
  limits = [2, 3, 4]
  model = ToyModel(seed=1, vocab=5, batch=3)
  ids, scores = _beam(model, limits, 6, beam_size=100, alpha=alpha)
  for b, limit in enumerate(limits):
    tokens, best = exhaustive_best(model, b, limit, alpha)
    assert _strip(ids[b]) == tokens
    np.testing.assert_allclose(scores[b], best, rtol=1e-5)


@pytest.mark.reference_numerics
def test_wide_beam_nbest_is_the_exhaustive_nbest():
  # As above: a beam of 100 keeps every one of the 85 outputs, so its 5 best finished
  # hypotheses are the 5 best outputs, in order, scored as the NumPy reference scores them
  # (a limit of 2 allows exactly 5).
  limits, n = [2, 3, 4], 5
  model = ToyModel(seed=1, vocab=5, batch=3)
  search = jax.jit(functools.partial(decode.nbest_search, model.tokens_to_logits, beam_size=100,
                                     alpha=0.6, nbest=n),
                   static_argnames=("max_decode_len", "batch_sizes"))
  ids, scores = search(model.cache(), jnp.asarray(limits), max_decode_len=6)
  assert ids.shape == (3, n, 6) and scores.shape == (3, n)
  # Finished sentences leaving the batch change no list.
  shrunk = search(model.cache(), jnp.asarray(limits), max_decode_len=6, batch_sizes=(2, 1))
  np.testing.assert_array_equal(shrunk[0], ids)
  np.testing.assert_array_equal(shrunk[1], scores)
  for b, limit in enumerate(limits):
    expected = exhaustive_nbest(model, b, limit, 0.6, n)
    assert [_strip(row) for row in ids[b]] == [tokens for tokens, _ in expected]
    np.testing.assert_allclose(scores[b], [score for _, score in expected], rtol=1e-5)


def test_nbest_is_refused_beyond_the_beam():
  model = ToyModel(seed=2, vocab=5, batch=1)
  with pytest.raises(ValueError, match=r"nbest=5 must be in 1..beam_size=4"):
    decode.nbest_search(model.tokens_to_logits, model.cache(), jnp.array([3]), 3, beam_size=4,
                        alpha=0.6, nbest=5)


@pytest.mark.parametrize("ops", [backend_ops.LIBRARY, backend_ops.CPU], ids=["library", "cpu"])
@pytest.mark.parametrize("beam_size", [1, 2, 4])
def test_narrow_beam_returns_a_true_score_no_better_than_the_best(beam_size, ops):
  # A narrow beam may miss the best output; it must still score what it returns correctly.
  limits = [3, 4, 4, 2]
  model = ToyModel(seed=2, vocab=5, batch=4)
  ids, scores = _beam(model, limits, 5, beam_size=beam_size, alpha=0.6, ops=ops)
  for b, limit in enumerate(limits):
    tokens = _strip(ids[b])
    assert len(tokens) <= limit
    true = model.log_prob(b, tokens) / _penalty(len(tokens), 0.6)
    np.testing.assert_allclose(scores[b], true, rtol=1e-5)
    assert scores[b] <= exhaustive_best(model, b, limit, 0.6)[1] + 1e-5


@pytest.mark.parametrize("alpha, ops", [(0.0, backend_ops.LIBRARY), (0.6, backend_ops.LIBRARY),
                                        (2.0, backend_ops.LIBRARY), (0.6, backend_ops.CPU)],
                         ids=["0.0-library", "0.6-library", "2.0-library", "0.6-cpu"])
def test_beam_size_one_is_greedy(alpha, ops):
  # With α > 0 a longer output can outscore greedy's, but a beam of one stops at its first EOS.
  limits = [3, 7, 12, 12, 20, 20, 20, 20, 20, 1]
  model = ToyModel(seed=3, vocab=7, batch=10)
  greedy = _greedy(model, limits, 20, ops=ops)
  ids, _ = _beam(model, limits, 20, beam_size=1, alpha=alpha, ops=ops)
  np.testing.assert_array_equal(ids, greedy)
  lengths = [len(_strip(row)) for row in greedy]
  assert any(n < limit for n, limit in zip(lengths, limits)), "no early EOS: weak test"
  assert lengths[-1] == 1


def test_beam_of_one_stops_at_its_first_eos():
  # Step 1: EOS 0.4, token 2 0.3, tokens 0/3/4 0.1; step 2: EOS ~1. With α = 2 the longer
  # output scores log(0.3) / (7/6)^2 = -0.885 > log(0.4) / 1 = -0.916: a beam of two finds it,
  # a beam of one (greedy) stops at its first EOS.
  table = jnp.log(jnp.array([[0.1, 0.4, 0.3, 0.1, 0.1], [1e-6, 1.0, 1e-6, 1e-6, 1e-6]]))

  def by_position(ids, cache):
    logits = jnp.broadcast_to(table[jnp.minimum(cache["position"], 1)], (ids.shape[0], 5))
    return logits, {"position": cache["position"] + 1}

  cache = {"position": jnp.array(0, jnp.int32)}
  for beam_size, expected in [(1, (EOS_ID,)), (2, (2, EOS_ID))]:
    ids, score = decode.beam_search(by_position, cache, jnp.array([5]), 5, beam_size=beam_size,
                                    alpha=2.0)
    assert _strip(ids[0]) == expected
    length = len(expected)
    np.testing.assert_allclose(score[0], np.log([0.4, 0.3])[length - 1] / _penalty(length, 2.0),
                               rtol=1e-4)


@pytest.mark.reference_numerics
def test_greedy_matches_step_by_step_argmax():
  model = ToyModel(seed=4, vocab=6, batch=2)
  ids = _greedy(model, [9, 9], 9)
  for b in range(2):
    tokens, prefix = _strip(ids[b]), []
    chosen = tokens[:-1] if len(tokens) == 9 else tokens  # the last is forced at the limit
    for token in chosen:
      options = [model.log_prob(b, (*prefix, t)) for t in range(model.vocab)]
      assert token == int(np.argmax(options))
      prefix.append(token)


def test_finished_hypotheses_are_never_extended():
  fed = []
  model = ToyModel(seed=5, vocab=5, batch=3)

  def recording(ids, cache):
    jax.debug.callback(lambda x: fed.append(np.asarray(x)), ids)
    return model.tokens_to_logits(ids, cache)

  fn = jax.jit(functools.partial(decode.beam_search, recording, beam_size=4, alpha=0.6),
               static_argnums=(2,))
  ids, _ = fn(model.cache(), jnp.array([6, 6, 6]), 6)
  jax.block_until_ready(ids)
  fed = np.concatenate(fed)
  assert fed.size > 0 and not np.any(fed == EOS_ID)  # no row ever continues after an EOS
  for row in np.asarray(ids):
    _strip(row)  # one EOS, then only padding


def test_search_stops_early_when_no_live_beam_can_win():
  # EOS is by far the most likely first token: nothing longer can beat it, so one step only.
  calls = []
  model = ToyModel(seed=6, vocab=5, batch=2)
  model.u[:, :] = 0.0  # uniform, then EOS made ~e^12 times likelier than any other token
  bias = np.zeros(model.vocab)
  bias[EOS_ID] = 12.0

  def biased(ids, cache):
    jax.debug.callback(lambda: calls.append(1))
    logits, cache = model.tokens_to_logits(ids, cache)
    return logits + jnp.asarray(bias, jnp.float32), cache

  fn = jax.jit(functools.partial(decode.beam_search, biased, beam_size=4, alpha=0.6),
               static_argnums=(2,))
  ids, _ = fn(model.cache(), jnp.array([30, 30]), 30)
  jax.block_until_ready(ids)
  assert len(calls) == 1
  assert [_strip(row) for row in np.asarray(ids)] == [(EOS_ID,), (EOS_ID,)]


@pytest.mark.parametrize("search", ["beam", "greedy"])
def test_each_sentence_decodes_as_if_alone(search):
  limits = [2, 9, 5, 12]
  model = ToyModel(seed=7, vocab=6, batch=4)
  run = (lambda lim, rows=None: _beam(model, lim, 12, 4, 0.6, rows)[0]) if search == "beam" \
      else (lambda lim, rows=None: _greedy(model, lim, 12, rows))
  together = np.asarray(run(limits))
  for b, limit in enumerate(limits):
    alone = np.asarray(run([limit], rows=[b]))[0]
    np.testing.assert_array_equal(together[b], alone)
    assert len(_strip(together[b])) <= limit


def test_bad_arguments_fail_before_compiling():
  model = ToyModel(seed=0, vocab=5, batch=1)
  with pytest.raises(ValueError, match="alpha"):
    decode.beam_search(model.tokens_to_logits, model.cache(), jnp.array([3]), 3, beam_size=2,
                       alpha=-1.0)
  with pytest.raises(ValueError, match="beam_size"):
    decode.beam_search(model.tokens_to_logits, model.cache(), jnp.array([3]), 3, beam_size=0,
                       alpha=0.6)


@pytest.mark.parametrize("search", ["beam", "greedy"])
def test_finished_sentences_leaving_the_batch_change_no_result(search):
  # Limits from 1 to 16 tokens: sentences finish at many steps, so the batch of 8 shrinks
  # to 4, 2 and 1 while some are still searched.
  limits = jnp.array([16, 1, 3, 12, 2, 16, 5, 9])
  model = ToyModel(seed=8, vocab=6, batch=8)
  rows_fed = []

  def recording(ids, cache):
    jax.debug.callback(lambda x: rows_fed.append(x.shape[0]), ids)
    return model.tokens_to_logits(ids, cache)

  def run(batch_sizes):
    if search == "greedy":
      fn = functools.partial(decode.greedy_search, recording, batch_sizes=batch_sizes)
    else:
      fn = functools.partial(decode.beam_search, recording, beam_size=3, alpha=0.6,
                             batch_sizes=batch_sizes)
    return jax.block_until_ready(jax.jit(fn, static_argnums=(2,))(model.cache(), limits, 16))

  whole = run(())
  assert set(rows_fed) == {8 if search == "greedy" else 24}
  rows_fed.clear()
  shrinking = run((4, 2, 1))
  beams = 1 if search == "greedy" else 3
  assert {4 * beams, 2 * beams, beams} <= set(rows_fed), "the batch never shrank: weak test"
  # The same tokens; scores to float32 rounding: XLA may sum a smaller batch's rows in
  # another order, which moves a score by an ulp.
  for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(shrinking)):
    if jnp.issubdtype(a.dtype, jnp.integer):
      np.testing.assert_array_equal(a, b)
    else:
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=0)
  ids = whole if search == "greedy" else whole[0]
  assert len({len(_strip(row)) for row in np.asarray(ids)}) >= 4, "few lengths: weak test"


def test_an_nbest_list_is_headed_by_the_beams_best():
  # A narrow beam (it misses hypotheses): going on until nothing can enter the 3 best changes
  # neither the best hypothesis nor its score.
  limits = jnp.array([3, 4, 4, 2])
  model = ToyModel(seed=2, vocab=5, batch=4)
  kwargs = dict(beam_size=4, alpha=0.6)
  best, best_scores = decode.beam_search(model.tokens_to_logits, model.cache(), limits, 5,
                                         **kwargs)
  listed, scores = decode.nbest_search(model.tokens_to_logits, model.cache(), limits, 5,
                                       nbest=3, **kwargs)
  np.testing.assert_array_equal(listed[:, 0], best)
  np.testing.assert_array_equal(scores[:, 0], best_scores)
  assert np.all(np.diff(np.asarray(scores), axis=1) <= 0)
