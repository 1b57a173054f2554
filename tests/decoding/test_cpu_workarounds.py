"""Each CPU workaround gives its library formulation's results: `lax.top_k`, `jax.nn.logsumexp`,
and an attention read over the whole cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.decoding import cpu_workarounds


def test_settings_resolve_to_on_or_off():
  assert cpu_workarounds.enabled("auto") == (jax.default_backend() == "cpu")
  assert cpu_workarounds.enabled("on") and not cpu_workarounds.enabled("off")
  with pytest.raises(ValueError, match="'auto', 'on', 'off'"):
    cpu_workarounds.enabled("yes")


# Small rows (one pass over the row), and blocked rows: tiled exactly by a divisor near 128
# (1000 and 3000 by 125, 2560 by 128) or with a short last block (4037 has no such divisor);
# k = 20 is past the unrolled passes and calls lax.top_k.
@pytest.mark.parametrize("n, k", [(6, 2), (1000, 8), (4037, 8), (2560, 4), (3000, 1), (40, 20)])
def test_top_k_matches_lax_top_k_with_ties(n, k):
  rng = np.random.default_rng(n)
  x = rng.integers(-20, 20, size=(5, n)).astype(np.float32)  # many exact ties
  x[1] = -np.inf
  x[2, : n // 2] = -np.inf
  x[3] = rng.normal(size=n)
  top_k = jax.jit(lambda x: cpu_workarounds.top_k(x, k, enabled=True))
  values, indices = top_k(jnp.asarray(x))
  expected_values, expected_indices = jax.lax.top_k(jnp.asarray(x), k)
  np.testing.assert_array_equal(values, expected_values)
  np.testing.assert_array_equal(indices, expected_indices)


def test_logsumexp_matches_jax():
  rng = np.random.default_rng(0)
  x = (rng.normal(size=(6, 3, 37000)) * 30).astype(np.float32)
  x[0, 0, :100] = 500.0  # large logits (exp overflows without the shift)
  x[1, :, 7] = -1e9  # the searches' score of an empty slot
  got = jax.jit(lambda x: cpu_workarounds.logsumexp(x, enabled=True))(jnp.asarray(x))
  np.testing.assert_allclose(got, jax.nn.logsumexp(jnp.asarray(x), axis=-1), rtol=1e-6)


def test_prefix_lengths_double_up_to_the_cache():
  assert cpu_workarounds.prefix_lengths(82) == (16, 32, 64, 82)
  assert cpu_workarounds.prefix_lengths(64) == (16, 32, 64)
  assert cpu_workarounds.prefix_lengths(10) == (10,)


def test_read_prefix_reads_the_first_length_above_the_position():
  read_lengths = []

  def read(length):  # records the static length each branch reads
    read_lengths.append(length)
    return jnp.full((), length)

  read_at = jax.jit(lambda p, on: cpu_workarounds.read_prefix(read, p, 40, enabled=on),
                    static_argnums=1)
  assert [int(read_at(p, True)) for p in (0, 15, 16, 31, 32, 39)] == [16, 16, 32, 32, 40, 40]
  assert sorted(read_lengths) == [16, 32, 40]  # one branch per prefix length, traced once
  assert int(read_at(3, False)) == 40  # off: the whole cache, no branches
