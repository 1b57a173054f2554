"""Scaled dot-product attention and multi-head attention (paper §3.2).

Glossary: B batch, T query length, S key length, H heads, K d_k, V_ d_v, D d_model.

`scaled_dot_product_attention` is the reference: a plain function of arrays, checked against
NumPy in the tests. `MultiHeadAttention` uses it by default; `attention_impl='xla'|'cudnn'`
swaps in `jax.nn.dot_product_attention` (cuDNN flash attention on NVIDIA GPUs) for speed.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

# Masked logits get this instead of -inf: a fully masked row (a padding query) then softmaxes
# to a uniform distribution rather than NaN, and its output is never used.
_MASK_VALUE = -1e30

ATTENTION_IMPLS = ("reference", "xla", "cudnn")


def scaled_dot_product_attention(
    q: jax.Array,  # [..., T, K]
    k: jax.Array,  # [..., S, K]
    v: jax.Array,  # [..., S, V_]
    mask: jax.Array | None = None,  # bool, broadcastable to [..., T, S]; True = attend
    *,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """`softmax(Q K^T / sqrt(d_k)) V` (paper eq. 1).

  Args:
    q: queries `[..., T, K]`.
    k: keys `[..., S, K]`.
    v: values `[..., S, V_]`.
    mask: boolean mask broadcastable to `[..., T, S]`; False positions get a large negative
      logit before the softmax.
    dropout_rate: dropout on the attention weights (the paper uses none).
    dropout_rng: PRNG key, required when `dropout_rate > 0`.

  Returns:
    `(output [..., T, V_], weights [..., T, S])`; the weights are float32.
  """
  d_k = q.shape[-1]
  q = q / jnp.sqrt(d_k).astype(q.dtype)
  logits = jnp.einsum("...tk,...sk->...ts", q, k).astype(jnp.float32)
  if mask is not None:
    logits = jnp.where(mask, logits, _MASK_VALUE)
  weights = jax.nn.softmax(logits, axis=-1)
  probs = weights
  if dropout_rate > 0.0:
    if dropout_rng is None:
      raise ValueError("dropout_rate > 0 needs a dropout_rng")
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
    probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
  out = jnp.einsum("...ts,...sv->...tv", probs.astype(v.dtype), v)
  return out, weights


class HeadProjection(nn.Module):
  """`[B, L, D] -> [B, H, L, size]` with a kernel `[D, H, size]` (the paper's W_i, no bias).

  Heads-major output feeds the reference attention and the decode caches without transposes.
  """

  num_heads: int
  size: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.param("kernel", nn.initializers.xavier_uniform(in_axis=-3, out_axis=(-2, -1)),
                        (x.shape[-1], self.num_heads, self.size))
    x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=self.dtype)
    return jnp.einsum("bld,dhk->bhlk", x, kernel)


class HeadMerge(nn.Module):
  """`[B, H, T, V_] -> [B, T, D]`: concatenated heads times W^O `[H, V_, D]`, no bias."""

  d_model: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.param("kernel", nn.initializers.xavier_uniform(in_axis=(-3, -2), out_axis=-1),
                        (x.shape[1], x.shape[-1], self.d_model))
    x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=self.dtype)
    return jnp.einsum("bhtv,hvd->btd", x, kernel)


class MultiHeadAttention(nn.Module):
  """Multi-head attention with separate `d_k` and `d_v` (paper §3.2.2, Table 3 row B).

  Projections have no bias, as in the paper's `Q W_i^Q`. With `decode=True` the layer keeps a
  cache, heads-major `[B, H, L, K]`: for `kind='self'` each call appends one step's
  keys/values; for `kind='cross'` the keys/values of the encoder output are projected once
  (on the call that creates the cache) and reused by every later step.

  Attributes:
    num_heads: H.
    d_k: size of each head's queries and keys.
    d_v: size of each head's values.
    d_model: output size (the model width).
    kind: 'self' or 'cross'; only changes what is cached in decode mode.
    attention_dropout_rate: dropout on attention weights (off in the paper).
    attention_impl: 'reference' | 'xla' | 'cudnn'.
    dtype: computation dtype.
  """

  num_heads: int
  d_k: int
  d_v: int
  d_model: int
  kind: str = "self"
  attention_dropout_rate: float = 0.0
  attention_impl: str = "reference"
  dtype: Any = jnp.float32

  def _project(self, name: str, x: jax.Array, size: int) -> jax.Array:
    return HeadProjection(self.num_heads, size, dtype=self.dtype, name=name)(x)

  @nn.compact
  def __call__(
      self,
      inputs_q: jax.Array,  # [B, T, D]
      inputs_kv: jax.Array | None,  # [B, S, D]; None in cached cross-attention steps
      mask: jax.Array | None = None,  # bool [B, 1, T, S]
      *,
      train: bool = False,
      decode: bool = False,
  ) -> jax.Array:  # [B, T, D]
    query = self._project("query", inputs_q, self.d_k)  # [B, H, T, K]
    if decode and self.kind == "cross":
      # Created (and computed) once, on the cache-building call; later steps reuse them.
      key = self.variable("cache", "cross_key", self._project, "key", inputs_kv, self.d_k).value
      value = self.variable(
          "cache", "cross_value", self._project, "value", inputs_kv, self.d_v).value
    else:
      key = self._project("key", inputs_kv, self.d_k)  # [B, H, S, K]
      value = self._project("value", inputs_kv, self.d_v)  # [B, H, S, V_]
      if decode:
        key, value, mask = self._self_attention_cache(key, value, mask)

    if self.attention_impl == "reference":
      dropout_rng = None
      rate = self.attention_dropout_rate if train else 0.0
      if rate > 0.0:
        dropout_rng = self.make_rng("dropout")
      out, _ = scaled_dot_product_attention(query, key, value, mask, dropout_rate=rate,
                                            dropout_rng=dropout_rng)  # [B, H, T, V_]
    else:
      if self.d_k != self.d_v:
        # jax.nn.dot_product_attention needs one head size for queries, keys and values.
        raise ValueError(
            f"attention_impl={self.attention_impl!r} needs d_k == d_v (got d_k={self.d_k}, "
            f"d_v={self.d_v}); use attention_impl='reference' for Table 3 row (B)")
      # jax.nn.dot_product_attention takes [B, T, H, K]; 'xla' lets JAX pick cuDNN where it
      # can, 'cudnn' insists on it.
      query, key, value = (jnp.swapaxes(x, 1, 2) for x in (query, key, value))
      out = jax.nn.dot_product_attention(
          query, key, value, mask=mask,
          implementation=None if self.attention_impl == "xla" else "cudnn")
      out = jnp.swapaxes(out, 1, 2)  # [B, H, T, V_]

    return HeadMerge(self.d_model, dtype=self.dtype, name="out")(out)

  def _self_attention_cache(self, key, value, mask):
    """Writes this step's keys/values at the cache index; returns the whole cache and mask."""
    initialized = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.array(0, dtype=jnp.int32))
    if not initialized:
      # The building call only sizes the cache ([B, H, max_len, K]); it attends normally.
      return key, value, mask
    batch, _, max_len, _ = cached_key.value.shape
    if key.shape[2] != 1:
      raise ValueError(f"cached decoding takes one token per step, got {key.shape[2]}")
    i = index.value
    cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key, (0, 0, i, 0))
    cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, value, (0, 0, i, 0))
    index.value = i + 1
    # Causal in decode mode: the step at position i sees cache slots 0..i.
    step_mask = (jnp.arange(max_len) <= i)[None, None, None, :]  # [1, 1, 1, max_len]
    step_mask = jnp.broadcast_to(step_mask, (batch, 1, 1, max_len))
    return cached_key.value, cached_value.value, step_mask
