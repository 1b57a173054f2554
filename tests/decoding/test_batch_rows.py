"""The rows of a search's batch: beams per sentence, and sentences leaving it."""

import jax.numpy as jnp
import numpy as np
import pytest

from transformer.decoding import batch_rows


def test_expand_and_gather_beams_leave_scalars_alone():
  tree = {"x": jnp.arange(6).reshape(2, 3), "position": jnp.array(7)}
  expanded = batch_rows.expand_to_beams(tree, 2)
  np.testing.assert_array_equal(expanded["x"], [[0, 1, 2], [0, 1, 2], [3, 4, 5], [3, 4, 5]])
  assert expanded["position"].shape == () and int(expanded["position"]) == 7
  marked = {"x": jnp.arange(4)[:, None] * jnp.ones((1, 3), int), "position": jnp.array(7)}
  gathered = batch_rows.gather_beams(marked, jnp.array([[1, 1], [0, 1]]), batch_size=2, old_beams=2)
  np.testing.assert_array_equal(gathered["x"][:, 0], [1, 1, 2, 3])
  assert int(gathered["position"]) == 7


def test_select_sentences_keeps_sentence_and_beam_rows_and_names_a_bad_leaf():
  tree = {"per_sentence": jnp.arange(3) * 10, "per_beam": jnp.arange(6),
          "position": jnp.array(7)}
  kept = batch_rows.select_sentences(tree, jnp.array([2, 0]), batch_size=3, beams=2)
  np.testing.assert_array_equal(kept["per_sentence"], [20, 0])
  np.testing.assert_array_equal(kept["per_beam"], [4, 5, 0, 1])
  assert int(kept["position"]) == 7
  with pytest.raises(ValueError, match=r"shape \(5,\) has neither 3 rows"):
    batch_rows.select_sentences({"odd": jnp.arange(5)}, jnp.array([0]), batch_size=3, beams=2)
