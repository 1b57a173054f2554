"""Each CPU formulation of `backend_ops` gives its library formulation's results: `lax.top_k`,
`jax.nn.logsumexp`, and an attention read over the whole cache; `config.cpu_workarounds`
picks between them."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.decoding import backend_ops
from transformer.model import attention

# Against NumPy or PyTorch written from the papers: compiled as users' programs are (conftest).
pytestmark = pytest.mark.reference_numerics


def test_settings_resolve_to_the_cpu_or_the_library_ops():
  on_cpu = jax.default_backend() == "cpu"
  assert backend_ops.for_setting("auto") is (backend_ops.CPU if on_cpu else backend_ops.LIBRARY)
  assert backend_ops.for_setting("on") is backend_ops.CPU
  assert backend_ops.for_setting("off") is backend_ops.LIBRARY
  with pytest.raises(ValueError, match="'yes' is not 'auto', 'on' or 'off'"):
    backend_ops.for_setting("yes")


def test_ops_are_static_arguments():
  """Equal ops hash equal, so a search compiled with them is compiled once per choice."""
  jitted = jax.jit(lambda x, ops: ops.logsumexp(x), static_argnums=1)
  x = jnp.arange(6.0).reshape(2, 3)
  for ops in (backend_ops.LIBRARY, backend_ops.CPU):
    np.testing.assert_allclose(jitted(x, ops), jax.nn.logsumexp(x, axis=-1), rtol=1e-6)
  assert dataclasses.replace(backend_ops.CPU) == backend_ops.CPU != backend_ops.LIBRARY
  assert hash(dataclasses.replace(backend_ops.CPU)) == hash(backend_ops.CPU)


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
  top_k = jax.jit(lambda x: backend_ops.CPU.top_k(x, k))
  values, indices = top_k(jnp.asarray(x))
  expected_values, expected_indices = backend_ops.LIBRARY.top_k(jnp.asarray(x), k)
  np.testing.assert_array_equal(values, expected_values)
  np.testing.assert_array_equal(indices, expected_indices)


def test_logsumexp_matches_jax():
  rng = np.random.default_rng(0)
  x = (rng.normal(size=(6, 3, 37000)) * 30).astype(np.float32)
  x[0, 0, :100] = 500.0  # large logits (exp overflows without the shift)
  x[1, :, 7] = -1e9  # the searches' score of an empty slot
  got = jax.jit(backend_ops.CPU.logsumexp)(jnp.asarray(x))
  np.testing.assert_allclose(got, backend_ops.LIBRARY.logsumexp(jnp.asarray(x)), rtol=1e-6)
  np.testing.assert_allclose(got, jax.nn.logsumexp(jnp.asarray(x), axis=-1), rtol=1e-6)


def test_prefix_lengths_double_up_to_the_cache():
  assert backend_ops.prefix_lengths(82) == (16, 32, 64, 82)
  assert backend_ops.prefix_lengths(64) == (16, 32, 64)
  assert backend_ops.prefix_lengths(10) == (10,)


@pytest.mark.parametrize("ops", [backend_ops.CPU, backend_ops.LIBRARY], ids=["cpu", "library"])
def test_cache_reads_read_the_first_length_above_the_position(ops):
  read_lengths = []

  def attend_first(length):  # records the static length each branch reads
    read_lengths.append(length)
    return jnp.full((), length)

  read_at = jax.jit(lambda p: ops.cache_read(attend_first, p, 40))
  got = [int(read_at(p)) for p in (0, 15, 16, 31, 32, 39)]
  if ops is backend_ops.CPU:
    assert got == [16, 16, 32, 32, 40, 40]
    assert sorted(read_lengths) == [16, 32, 40]  # one branch per prefix length, traced once
  else:
    assert got == [40] * 6 and read_lengths == [40]  # the whole cache, no branches
  assert backend_ops.LIBRARY.cache_read is attention.read_whole  # the model cache's default
