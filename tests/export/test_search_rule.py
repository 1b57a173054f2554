"""The project's rule as the exported-model searches apply it: the GNMT penalty is the
decoder's, the limit is the decoder's per-sentence bound, and the ranking is by normalised
score (not by summed log-probability), earlier first on a tie."""

import jax.numpy as jnp
import numpy as np
import pytest

from transformer.decoding import decode
from transformer.export import search_rule


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_the_penalty_is_the_decoder_s(alpha):
  lengths = np.arange(1, 80)
  np.testing.assert_allclose([search_rule.gnmt_penalty(n, alpha) for n in lengths],
                             np.asarray(decode.length_penalty(jnp.asarray(lengths), alpha)),
                             rtol=1e-6)


def test_the_limit_is_source_tokens_with_eos_plus_extra_capped_by_max_len():
  assert search_rule.output_limit(7, 50, None) == 58
  assert search_rule.output_limit(7, 50, 40) == 40
  assert search_rule.output_limit(0, 50, 256) == 51


def test_sentences_are_grouped_by_limit_in_chunks():
  ids_of = {0: [5] * 3, 1: [5] * 9, 2: [5] * 3, 3: [5] * 3, 5: [5] * 30}
  chunks = search_rule.by_limit(ids_of, max_extra_len=10, max_len=25, max_batch_size=2)
  assert chunks == [(14, [0, 2]), (14, [3]), (20, [1]), (25, [5])]


def test_the_best_is_by_normalised_score_earlier_on_a_tie():
  short, long = [7, 1], [7, 7, 7, 7, 7, 7, 1]
  # The long one has the lower sum but the better score once divided by its penalty.
  assert search_rule.best([(short, -3.0), (long, -3.5)], alpha=1.0) == long
  assert search_rule.best([(short, -3.0), (long, -3.5)], alpha=0.0) == short
  assert search_rule.best([(short, -2.0), ([8, 1], -2.0)], alpha=0.6) == short


def test_blank_sentences_are_left_out():
  class Tok:
    def encode(self, text):
      return [len(w) for w in text.split()]

  assert search_rule.encode_nonblank(Tok(), ["a bb", "  ", "", "ccc"]) == {0: [1, 2], 3: [3]}
