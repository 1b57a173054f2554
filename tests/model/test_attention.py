"""Scaled dot-product attention against a NumPy reference, with padding and causal masks; the
decoding caches against the same reference over the positions they hold."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.decoding import backend_ops
from transformer.model import attention

# Against NumPy or PyTorch written from the papers: compiled as users' programs are (conftest),
# each call jitted as a whole, as in a training step, not run operation by operation.
pytestmark = pytest.mark.reference_numerics

dot_product_attention = jax.jit(attention.scaled_dot_product_attention,
                                static_argnames="dropout_rate")


def numpy_attention(q, k, v, mask, scale=None):
  """softmax(QK^T/sqrt(d_k))V written independently in NumPy (float64); `scale` in place of
  1/sqrt(d_k) when given."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
  scores = q @ np.swapaxes(k, -1, -2) * scale
  if mask is not None:
    scores = np.where(mask, scores, -np.inf)
  scores -= scores.max(-1, keepdims=True)
  w = np.exp(scores)
  w /= w.sum(-1, keepdims=True)
  return w @ v, w


def _qkv(seed, b=2, h=3, t=5, s=7, dk=4, dv=6):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(b, h, t, dk)).astype(np.float32),
          rng.normal(size=(b, h, s, dk)).astype(np.float32),
          rng.normal(size=(b, h, s, dv)).astype(np.float32))


def test_matches_numpy_without_mask():
  q, k, v = _qkv(0)
  out, w = dot_product_attention(q, k, v)
  ref_out, ref_w = numpy_attention(q, k, v, None)
  np.testing.assert_allclose(out, ref_out, atol=1e-5)
  np.testing.assert_allclose(w, ref_w, atol=1e-6)


def test_matches_numpy_with_padding_mask():
  q, k, v = _qkv(1)
  lengths = np.array([7, 3])
  mask = (np.arange(7)[None, :] < lengths[:, None])[:, None, None, :]  # [B, 1, 1, S]
  out, w = dot_product_attention(q, k, v, mask)
  ref_out, ref_w = numpy_attention(q, k, v, mask)
  np.testing.assert_allclose(out, ref_out, atol=1e-5)
  assert np.all(np.asarray(w)[1, :, :, 3:] == 0.0)


def test_matches_numpy_with_causal_mask():
  q, k, v = _qkv(2, t=6, s=6)
  mask = np.tril(np.ones((6, 6), bool))
  out, w = dot_product_attention(q, k, v, mask)
  ref_out, _ = numpy_attention(q, k, v, mask)
  np.testing.assert_allclose(out, ref_out, atol=1e-5)
  assert np.all(np.triu(np.asarray(w)[0, 0], k=1) == 0.0)


def test_fully_masked_row_is_finite():
  q, k, v = _qkv(3)
  mask = np.zeros((1, 1, 5, 7), bool)
  out, _ = dot_product_attention(q, k, v, mask)
  assert np.all(np.isfinite(out))


def test_attention_dropout_needs_rng_and_keeps_expectation():
  q, k, v = _qkv(4)
  with pytest.raises(ValueError, match="dropout_rng"):
    dot_product_attention(q, k, v, dropout_rate=0.5)
  outs = [dot_product_attention(q, k, v, dropout_rate=0.5, dropout_rng=jax.random.key(i))[0]
          for i in range(200)]
  ref, _ = numpy_attention(q, k, v, None)
  np.testing.assert_allclose(np.mean(outs, 0), ref, atol=0.25)
  assert not np.allclose(outs[0], ref, atol=1e-3)


@pytest.mark.parametrize("impl", ["xla"])
def test_library_implementation_matches_reference(impl):
  """jax.nn.dot_product_attention behind the switch gives the reference's outputs."""
  layer = dict(num_heads=2, d_k=4, d_v=4, d_model=8)
  x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype(np.float32)
  mask = np.tril(np.ones((5, 5), bool))[None, None].repeat(2, 0)
  ref = attention.MultiHeadAttention(**layer)
  params = jax.jit(ref.init)(jax.random.key(1), x, x, mask)
  fast = attention.MultiHeadAttention(**layer, attention_impl=impl)
  np.testing.assert_allclose(jax.jit(fast.apply)(params, x, x, mask),
                             jax.jit(ref.apply)(params, x, x, mask), atol=1e-5)


def _reference_attend(q, k, v, mask, key_positions=None):
  del key_positions  # no position scheme here
  return attention.scaled_dot_product_attention(q, k, v, mask)[0]


# The model's default read, and the decoding side's prefix reads (`backend_ops.CPU`).
@pytest.mark.parametrize("read", [attention.read_whole, backend_ops.read_prefix],
                         ids=["whole", "prefix"])
def test_kv_cache_attends_over_the_positions_written(read):
  """Steps write keys/values one position at a time; each step's query sees positions 0..t,
  as NumPy attention over that prefix does, past the first prefix length read (16), however
  much of the cache its `read` reads."""
  b, h, steps, length, dk, dv = 2, 3, 20, 24, 4, 6
  rng = np.random.default_rng(5)
  q, k, v = (rng.normal(size=(steps, b, h, d)).astype(np.float32) for d in (dk, dk, dv))

  @jax.jit
  def run(q, k, v):
    def step(cache, t):
      cache = cache.update(k[t], v[t], t)
      return cache, cache.attend(q[t], t, _reference_attend)

    empty = attention.KVCache.empty(b, h, length, dk, dv, jnp.float32).replace(read=read)
    return jax.lax.scan(step, empty, jnp.arange(steps))[1]  # [steps, B, H, V_]

  out = run(q, k, v)
  for t in range(steps):
    ref, _ = numpy_attention(q[t][:, :, None], np.moveaxis(k[:t + 1], 0, 2),
                             np.moveaxis(v[:t + 1], 0, 2), None)
    np.testing.assert_allclose(out[t], ref[:, :, 0], atol=1e-5)


def test_encoder_kv_attends_over_real_source_tokens():
  q, k, v = _qkv(6, t=1)
  valid = np.arange(7)[None, :] < np.array([[7], [3]])  # [B, S]
  out = jax.jit(lambda q, k, v, valid: attention.EncoderKV(k, v, valid).attend(
      q, _reference_attend))(q[:, :, 0], k, v, valid)
  ref, _ = numpy_attention(q, k, v, valid[:, None, None, :])
  np.testing.assert_allclose(out, ref[:, :, 0], atol=1e-5)
