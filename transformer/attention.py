"""Scaled dot-product attention and multi-head attention (paper §3.2).

Glossary: B batch, T query length, S key length, H heads, K d_k, V_ d_v, D d_model.

`scaled_dot_product_attention` is the reference: a plain function of arrays, checked against
NumPy in the tests. `MultiHeadAttention` uses it by default; `attention_impl='xla'|'cudnn'`
swaps in `jax.nn.dot_product_attention` (cuDNN flash attention on NVIDIA GPUs) for speed.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

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
    if x.shape[1] == 1:
      # A decoding step: a plain [B, D] x [D, H * size] product. (XLA:CPU otherwise transposes
      # the kernel at every step.)
      y = x[:, 0] @ kernel.reshape(x.shape[-1], -1)
      return y.reshape(x.shape[0], self.num_heads, 1, self.size)
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
    if x.shape[2] == 1:  # a decoding step, as in HeadProjection
      y = x.reshape(x.shape[0], -1) @ kernel.reshape(-1, self.d_model)
      return y[:, None, :]
    return jnp.einsum("bhtv,hvd->btd", x, kernel)


class MultiHeadAttention(nn.Module):
  """Multi-head attention with separate `d_k` and `d_v` (paper §3.2.2, Table 3 row B).

  Projections have no bias, as in the paper's `Q W_i^Q`. With `decode=True` the layer keeps a
  cache, heads-major `[B, H, L, K]`: for `kind='self'` each call appends one step's
  keys/values and attends over the positions written so far (`attend_over_prefix`); for
  `kind='cross'` the keys/values of the encoder output are projected once
  (on the call that creates the cache) and reused by every later step. Beam search: cross
  keys/values kept once per sentence serve all its beams (more query rows than cached rows),
  and a self-attention cache in the layout of `beam_cache` is read through its
  `beam_origin` table (`_beam_self_attention`, whatever `attention_impl` says).

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
    beams = None  # decoding beam search: query rows are [sentence, beam] pairs
    step = None  # a cached decoding step's position: only the cache's prefix is read
    if decode and self.kind == "cross":
      # Created (and computed) once, on the cache-building call; later steps reuse them.
      key = self.variable("cache", "cross_key", self._project, "key", inputs_kv, self.d_k).value
      value = self.variable(
          "cache", "cross_value", self._project, "value", inputs_kv, self.d_v).value
      if key.shape[0] != query.shape[0]:  # one copy per sentence, shared by its beams
        beams = query.shape[0] // key.shape[0]
        mask = _beams_to_queries(mask, beams)  # [B * beams, 1, 1, S] -> [B, 1, beams, S]
    else:
      key = self._project("key", inputs_kv, self.d_k)  # [B, H, S, K]
      value = self._project("value", inputs_kv, self.d_v)  # [B, H, S, V_]
      if decode and self.has_variable("cache", "beam_origin"):  # see `beam_cache`
        out = self._beam_self_attention(query, key, value)
        return HeadMerge(self.d_model, dtype=self.dtype, name="out")(out)
      if decode:
        key, value, mask, step = self._self_attention_cache(key, value, mask)
    if beams is not None:
      # A sentence's beams become its query positions, [B * beams, H, 1, K] -> [B, H, beams, K]:
      # one attention call per sentence over its keys.
      query = _beams_to_queries(query, beams)

    rate = self.attention_dropout_rate if train else 0.0
    dropout_rng = self.make_rng("dropout") if rate > 0.0 else None
    if step is None:
      out = self._attend(query, key, value, mask, rate, dropout_rng)
    else:
      def attend(length, query, key, value, mask):
        return self._attend(query, key[:, :, :length], value[:, :, :length],
                            mask[..., :length], rate, dropout_rng)

      out = attend_over_prefix(step, key.shape[2], attend, query, key, value, mask)
    if beams is not None:
      out = _queries_to_beams(out, beams)
    return HeadMerge(self.d_model, dtype=self.dtype, name="out")(out)

  def _attend(self, query, key, value, mask, dropout_rate, dropout_rng):
    """`[B, H, T, K]` queries over `[B, H, S, K|V_]` keys/values -> `[B, H, T, V_]`, with
    `attention_impl`."""
    if self.attention_impl == "reference":
      out, weights = scaled_dot_product_attention(query, key, value, mask,
                                                  dropout_rate=dropout_rate,
                                                  dropout_rng=dropout_rng)
      # [B, H, T, S], kept only when 'intermediates' is mutable (transformer.inspect); a no-op
      # in training and decoding.
      self.sow("intermediates", "attention_weights", weights)
      return out
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
    return jnp.swapaxes(out, 1, 2)

  def _self_attention_cache(self, key, value, mask):
    """Writes this step's keys/values at the cache index.

    Returns:
      `(keys, values, mask, step)`: the whole cache `[B, H, max_len, K|V_]`, the causal mask
      `[B, 1, 1, max_len]` and the step's position; on the cache-building call the inputs
      unchanged and step None.
    """
    initialized = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.array(0, dtype=jnp.int32))
    if not initialized:
      # The building call only sizes the cache ([B, H, max_len, K]); it attends normally.
      return key, value, mask, None
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
    return cached_key.value, cached_value.value, step_mask, i

  def _beam_self_attention(self, query, key, value):
    """One beam-search step over the beam layout of `beam_cache`.

    Each beam writes this step's key/value in its own slot; beam j of a sentence attends over
    all its sentence's slots, masked to the slot that holds its own history at each position
    (`beam_origin`), so reordering beams moves only that table, never keys or values.

    Args:
      query, key, value: this step's `[B * beams, H, 1, K|V_]`.

    Returns:
      `[B * beams, H, 1, V_]`.
    """
    if key.shape[2] != 1:
      raise ValueError(f"cached decoding takes one token per step, got {key.shape[2]}")
    key_t = self.variable("cache", "cached_key", None)  # [B, H, K, L * beams], transposed
    cached_value = self.variable("cache", "cached_value", None)  # [B, H, L * beams, V_]
    origin = self.variable("cache", "beam_origin", None)  # [B, beams, L] int32
    index = self.variable("cache", "cache_index", None)
    batch, beams, max_len = origin.value.shape
    heads = query.shape[1]
    i = index.value
    index.value = i + 1
    # Slots are position-major (column t * beams + m), so a step writes one contiguous block.
    key = key.reshape(batch, beams, heads, -1).transpose(0, 2, 3, 1)  # [B, H, K, beams]
    key_t.value = jax.lax.dynamic_update_slice(key_t.value, key, (0, 0, 0, i * beams))
    value = _beams_to_queries(value, beams)  # [B, H, beams, V_]
    cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, value,
                                                      (0, 0, i * beams, 0))
    own = jnp.broadcast_to(jnp.arange(beams, dtype=jnp.int32)[None, :, None], (batch, beams, 1))
    origin.value = jax.lax.dynamic_update_slice(origin.value, own, (0, 0, i))

    q = _beams_to_queries(query, beams) / jnp.sqrt(query.shape[-1]).astype(query.dtype)

    def attend(length, q, key_t, value, origin):
      # Mask [B, 1, beams (query j), length * beams (position t, slot m)]: t <= i and
      # m = origin[j, t].
      slot = jnp.arange(beams)[None, None, None, :]
      mask = ((origin[:, :, :length, None] == slot)
              & (jnp.arange(length) <= i)[None, None, :, None])  # [B, beams, length, beams]
      mask = mask.reshape(batch, 1, beams, length * beams)
      # Keys stored transposed make this a plain [beams, K] x [K, n] product per head.
      logits = jnp.einsum("bhjk,bhkn->bhjn", q, key_t[..., :length * beams])
      logits = jnp.where(mask, logits.astype(jnp.float32), _MASK_VALUE)
      weights = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
      return jnp.einsum("bhjn,bhnv->bhjv", weights, value[:, :, :length * beams])

    out = attend_over_prefix(i, max_len, attend, q, key_t.value, cached_value.value,
                             origin.value)
    return _queries_to_beams(out, beams)


def prefix_lengths(max_len: int, shortest: int = 16) -> tuple[int, ...]:
  """Static prefix lengths a decoding step may read: powers of two from `shortest`, then
  `max_len`. A step at position i reads the first of them above i: never more than twice the
  positions written (past `shortest`), with one compiled branch per length."""
  lengths = []
  n = shortest
  while n < max_len:
    lengths.append(n)
    n *= 2
  return (*lengths, max_len)


def attend_over_prefix(step: jax.Array, max_len: int, attend: Callable[..., jax.Array],
                       *operands: jax.Array) -> jax.Array:
  """`attend(length, *operands)` for the first of `prefix_lengths(max_len)` above `step`.

  A cached decoding step at position `step` needs the cache's positions 0..step only; reading
  that prefix (rounded up to a few static lengths, one `lax.switch` branch each) rather than
  the whole cache (input length + 50) makes a step's cost follow the hypothesis' length.
  """
  lengths = prefix_lengths(max_len)
  branch = jnp.sum(jnp.asarray(lengths) <= step)  # the first length above the step
  return jax.lax.switch(branch, [functools.partial(attend, n) for n in lengths], *operands)


def _beams_to_queries(x: jax.Array, beams: int) -> jax.Array:
  """`[B * beams, H, 1, K] -> [B, H, beams, K]`."""
  rows, heads, _, size = x.shape
  return x.reshape(rows // beams, beams, heads, size).swapaxes(1, 2)


def _queries_to_beams(x: jax.Array, beams: int) -> jax.Array:
  """`[B, H, beams, V_] -> [B * beams, H, 1, V_]`."""
  batch, heads, _, size = x.shape
  return x.swapaxes(1, 2).reshape(batch * beams, heads, 1, size)


_SELF_CACHE_LEAVES = ("cached_key", "cached_value")


def beam_cache(cache: dict[str, jax.Array], beams: int) -> dict[str, jax.Array]:
  """Lays out a freshly built self-attention decode cache for beam search.

  Args:
    cache: flat cache (`'/'`-joined paths) for B sentences, as the model's building call made
      it; only the self-attention leaves are read (other leaves pass through unchanged).
    beams: beams per sentence.

  Returns:
    The cache with each self-attention layer's keys as `[B, H, K, L * beams]` (transposed),
    values as `[B, H, L * beams, V_]` (column `t * beams + m`: position t of slot m, written by
    beam m at step t), and a `beam_origin [B, beams, L]` table (the slot holding each beam's
    position t), reordered by `reorder_beam_cache` instead of copying keys and values.
  """
  out = dict(cache)
  for path, x in cache.items():
    prefix, leaf = path.rsplit("/", 1)
    if leaf in _SELF_CACHE_LEAVES:
      batch, heads, length, size = x.shape
      shape = (heads, size, length * beams) if leaf == "cached_key" else (heads, length * beams,
                                                                           size)
      out[path] = jnp.zeros((batch, *shape), x.dtype)
      out[f"{prefix}/beam_origin"] = jnp.zeros((batch, beams, length), jnp.int32)
  return out


def reorder_beam_cache(cache: dict[str, jax.Array], parents: jax.Array) -> dict[str, jax.Array]:
  """New beam j of sentence b continues old beam `parents[b, j]`: only `beam_origin` moves."""
  return {path: jnp.take_along_axis(x, parents[:, :, None], axis=1)
          if path.endswith("/beam_origin") else x for path, x in cache.items()}
