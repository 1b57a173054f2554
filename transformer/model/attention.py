"""Scaled dot-product attention, multi-head attention (paper §3.2) and its decoding caches.

Glossary: B batch, T query length, S key length, L cache length, H heads, G key/value heads,
K d_k, V_ d_v, D d_model.

`scaled_dot_product_attention` is the reference: a plain function of arrays, checked against
NumPy in the tests. `MultiHeadAttention` uses it by default; `attention_impl='xla'|'cudnn'`
swaps in `jax.nn.dot_product_attention` (cuDNN flash attention on NVIDIA GPUs) for speed.

Keys and values may have fewer heads than queries (`num_kv_heads`, G dividing H): query head h
then reads key/value head h // (H / G), multi-query attention for G = 1 (Shazeer 2019) and
grouped-query attention otherwise (Ainslie et al. 2023); the caches hold the G heads only.
Positions other than the paper's enter self-attention here, through the layer's `positions`
(a `position_schemes.LayerPositions`, which its scheme builds): rotated queries and keys, or
terms added to the logits, keys and values, computed from the absolute positions of the
queries and of the keys, which the caches supply in decoding.

Cached decoding runs one token per row and step, with explicit caches passed in and out:
`MultiHeadAttention.decode_self` writes the step's keys/values into the layer's `KVCache`
and attends over the positions written; `decode_cross` attends over the encoder output's
keys/values, projected once per sentence into an `EncoderKV`. The layer uses a cache only
through its `update` and `attend` methods, so a search may lay caches out its own way
(`transformer.decoding.beam_cache`) and choose how much of it a step reads (the cache's
`read`, a `CacheRead`; by default `read_whole`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import struct

from transformer.model import config as model_config
from transformer.model import position_schemes
from transformer.model import positions as positions_lib

# Masked logits get this instead of -inf: a fully masked row (a padding query) then softmaxes
# to a uniform distribution rather than NaN, and its output is never used.
_MASK_VALUE = -1e30

# `(query [B, H, T, K], keys [B, G, S, K], values [B, G, S, V_], mask, key_positions)
# -> [B, H, T, V_]`, the mask broadcastable to `[B, 1, T, S]`: a layer's attention, as the
# caches call it. Self-attention caches pass the absolute positions of their keys, `[S]`;
# cross-attention caches pass none (the argument is left out).
Attend = Callable[..., jax.Array]

# `(attend_first, position, length) -> out`: how a cached decoding step reads its cache.
# `attend_first(n)` attends over the cache's first `n` positions (a static int) under a mask of
# the positions written; positions 0..position (traced) hold keys and `length` is the cache's.
# A read returns `attend_first(n)` for some n > position, which it may pick by position.
CacheRead = Callable[[Callable[[int], jax.Array], jax.Array, int], jax.Array]


def read_whole(attend_first: Callable[[int], jax.Array], position: jax.Array,
               length: int) -> jax.Array:
  """The default `CacheRead`: the whole cache, the unwritten positions masked."""
  del position
  return attend_first(length)


def scaled_dot_product_attention(
    q: jax.Array,  # [..., H, T, K]
    k: jax.Array,  # [..., G, S, K]
    v: jax.Array,  # [..., G, S, V_]
    mask: jax.Array | None = None,  # bool, broadcastable to [..., H, T, S]; True = attend
    *,
    terms: positions_lib.AttentionTerms = positions_lib.AttentionTerms(),
    scale: float | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """`softmax(Q K^T / sqrt(d_k)) V` (paper eq. 1), with what positions add to it.

  Args:
    q: queries `[..., H, T, K]`.
    k: keys `[..., G, S, K]`, G dividing H: query head h reads key head h // (H / G).
    v: values `[..., G, S, V_]`.
    mask: boolean mask broadcastable to `[..., H, T, S]`; False positions get a large
      negative logit before the softmax.
    terms: from the positions (`position_schemes.LayerPositions.terms`): a bias added to the
      logits after the scaling (T5, ALiBi), and Shaw et al.'s `a^K_ij` added to key j and
      `a^V_ij` to value j for query i (their eqs. 4 and 3).
    scale: what the queries are multiplied by; None: 1/sqrt(d_k), the paper's.
    dropout_rate: dropout on the attention weights (the paper uses none).
    dropout_rng: PRNG key, required when `dropout_rate > 0`.

  Returns:
    `(output [..., H, T, V_], weights [..., H, T, S])`; the weights are float32.
  """
  groups = k.shape[-3]
  if scale is None:
    q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  else:
    q = q * jnp.asarray(scale, q.dtype)
  logits = _merge_groups(jnp.einsum("...grtk,...gsk->...grts", _split_groups(q, groups), k))
  if terms.keys is not None:
    logits = logits + jnp.einsum("...htk,...tsk->...hts", q, terms.keys)
  logits = logits.astype(jnp.float32)
  if terms.bias is not None:
    logits = logits + terms.bias
  if mask is not None:
    logits = jnp.where(mask, logits, _MASK_VALUE)
  weights = jax.nn.softmax(logits, axis=-1)
  probs = weights
  if dropout_rate > 0.0:
    if dropout_rng is None:
      raise ValueError("dropout_rate > 0 needs a dropout_rng")
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
    probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
  probs = probs.astype(v.dtype)
  out = _merge_groups(jnp.einsum("...grts,...gsv->...grtv", _split_groups(probs, groups), v))
  if terms.values is not None:
    out = out + jnp.einsum("...hts,...tsv->...htv", probs, terms.values)
  return out, weights


def unit_length(x: jax.Array) -> jax.Array:
  """`x / max(|x|, 1e-12)` along the last axis (PyTorch's `F.normalize`, as Henry et al.'s
  code), computed in float32."""
  y = x.astype(jnp.float32)
  y = y * jax.lax.rsqrt(jnp.maximum(jnp.sum(y * y, axis=-1, keepdims=True), 1e-24))
  return y.astype(x.dtype)


def _split_groups(x: jax.Array, groups: int) -> jax.Array:
  """`[..., H, T, size] -> [..., G, H / G, T, size]`: the query heads of each key head."""
  return x.reshape(*x.shape[:-3], groups, x.shape[-3] // groups, *x.shape[-2:])


def _merge_groups(x: jax.Array) -> jax.Array:
  """`[..., G, H / G, T, size] -> [..., H, T, size]`."""
  return x.reshape(*x.shape[:-4], -1, *x.shape[-2:])


class KVCache(struct.PyTreeNode):
  """One layer's self-attention keys and values in cached decoding, heads-major.

  Each step writes its position (`update`), then attends over the positions written so far,
  reading as much of the cache as `read` says (static: not an array of the pytree).
  """

  keys: jax.Array  # [B, G, L, K]
  values: jax.Array  # [B, G, L, V_]
  read: CacheRead = struct.field(pytree_node=False, default=read_whole)

  @classmethod
  def empty(cls, batch: int, heads: int, length: int, d_k: int, d_v: int,
            dtype: Any) -> KVCache:
    return cls(jnp.zeros((batch, heads, length, d_k), dtype),
               jnp.zeros((batch, heads, length, d_v), dtype))

  def update(self, key: jax.Array, value: jax.Array, position: jax.Array) -> KVCache:
    """Writes one step's `key [B, G, K]` and `value [B, G, V_]` at `position`."""
    start = (0, 0, position, 0)
    return self.replace(
        keys=jax.lax.dynamic_update_slice(self.keys, key[:, :, None], start),
        values=jax.lax.dynamic_update_slice(self.values, value[:, :, None], start))

  def attend(self, query: jax.Array, position: jax.Array, attend: Attend) -> jax.Array:
    """`query [B, H, K]` at `position` over positions 0..position -> `[B, H, V_]`."""
    def attend_first(length):
      mask = (jnp.arange(length) <= position)[None, None, None, :]  # [1, 1, 1, length]
      out = attend(query[:, :, None], self.keys[:, :, :length], self.values[:, :, :length],
                   mask, jnp.arange(length))
      return out[:, :, 0]

    return self.read(attend_first, position, self.keys.shape[2])


class EncoderKV(NamedTuple):
  """One layer's cross-attention keys and values of the encoder output, heads-major."""

  keys: jax.Array  # [B, G, S, K]
  values: jax.Array  # [B, G, S, V_]
  valid: jax.Array  # bool [B, S]: real source tokens, not padding

  def attend(self, query: jax.Array, attend: Attend) -> jax.Array:
    """`query [B, H, K]` -> `[B, H, V_]`."""
    out = attend(query[:, :, None], self.keys, self.values, self.valid[:, None, None, :])
    return out[:, :, 0]


class HeadProjection(nn.Module):
  """`x W` with a kernel `[D, H, size]` (the paper's W_i; with `use_bias`, Marian's `x W + b`,
  b `[H, size]`), heads-major output, which feeds the attention and the decoding caches
  without transposes."""

  d_model: int
  num_heads: int
  size: int
  dtype: Any = jnp.float32
  use_bias: bool = False

  def setup(self):
    self.kernel = self.param(
        "kernel", nn.initializers.xavier_uniform(in_axis=-3, out_axis=(-2, -1)),
        (self.d_model, self.num_heads, self.size))
    if self.use_bias:
      self.bias = self.param("bias", nn.initializers.zeros, (self.num_heads, self.size))

  def __call__(self, x: jax.Array) -> jax.Array:  # [B, L, D] -> [B, H, L, size]
    x, kernel = nn.dtypes.promote_dtype(x, self.kernel, dtype=self.dtype)
    y = jnp.einsum("bld,dhk->bhlk", x, kernel)
    return y + self.bias[:, None].astype(y.dtype) if self.use_bias else y

  def step(self, x: jax.Array) -> jax.Array:  # one token per row: [B, D] -> [B, H, size]
    x, kernel = nn.dtypes.promote_dtype(x, self.kernel, dtype=self.dtype)
    y = jnp.einsum("bd,dhk->bhk", x, kernel)
    return y + self.bias.astype(y.dtype) if self.use_bias else y


class HeadMerge(nn.Module):
  """Concatenated heads times W^O, a kernel `[H, V_, D]`; with `use_bias`, plus b `[D]`."""

  num_heads: int
  d_v: int
  d_model: int
  dtype: Any = jnp.float32
  use_bias: bool = False

  def setup(self):
    self.kernel = self.param(
        "kernel", nn.initializers.xavier_uniform(in_axis=(-3, -2), out_axis=-1),
        (self.num_heads, self.d_v, self.d_model))
    if self.use_bias:
      self.bias = self.param("bias", nn.initializers.zeros, (self.d_model,))

  def __call__(self, x: jax.Array) -> jax.Array:  # [B, H, T, V_] -> [B, T, D]
    x, kernel = nn.dtypes.promote_dtype(x, self.kernel, dtype=self.dtype)
    y = jnp.einsum("bhtv,hvd->btd", x, kernel)
    return y + self.bias.astype(y.dtype) if self.use_bias else y

  def step(self, x: jax.Array) -> jax.Array:  # one token per row: [B, H, V_] -> [B, D]
    x, kernel = nn.dtypes.promote_dtype(x, self.kernel, dtype=self.dtype)
    y = jnp.einsum("bhv,hvd->bd", x, kernel)
    return y + self.bias.astype(y.dtype) if self.use_bias else y


class MultiHeadAttention(nn.Module):
  """Multi-head attention with separate `d_k` and `d_v` (paper §3.2.2, Table 3 row B).

  Projections have no bias, as in the paper's `Q W_i^Q` (`biases`: Marian's). `__call__`
  attends from whole sequences (training, the encoder, teacher forcing); `decode_self` and
  `decode_cross` are one step of cached decoding.

  Attributes:
    num_heads: H.
    d_k: size of each head's queries and keys.
    d_v: size of each head's values.
    d_model: input and output size (the model width).
    num_kv_heads: G, the key/value heads (0: one per query head, the paper's).
    biases: a bias on each projection (Marian's; the paper's have none).
    qk_norm: normalise each head's queries and keys: 'l2' to unit length, the logits scaled by
      one learned g (Henry et al. 2020), or 'rms' with RMSNorm's learned scale per channel (the
      RMSNorm form of Dehghani et al. 2023's LayerNorm); 'none', the paper's.
    qk_norm_length: Henry et al.'s L, which sets g's initial value log2(L^2 - L).
    positions: what the model's position scheme does in self-attention
      (`position_schemes.PositionScheme.self_attention`); None where it does nothing, and in
      cross-attention, which sees no positions.
    attention_dropout_rate: dropout on attention weights (off in the paper).
    attention_impl: 'reference' | 'xla' | 'cudnn'.
    dtype: computation dtype.
  """

  num_heads: int
  d_k: int
  d_v: int
  d_model: int
  num_kv_heads: int = 0
  biases: bool = False
  qk_norm: model_config.QKNorm = "none"
  qk_norm_length: int = 64
  positions: position_schemes.LayerPositions | None = None
  attention_dropout_rate: float = 0.0
  attention_impl: model_config.AttentionImpl = "reference"
  dtype: Any = jnp.float32

  def setup(self):
    kv_heads = self.num_kv_heads or self.num_heads
    b = self.biases
    self.query = HeadProjection(self.d_model, self.num_heads, self.d_k, self.dtype, b)
    self.key = HeadProjection(self.d_model, kv_heads, self.d_k, self.dtype, b)
    self.value = HeadProjection(self.d_model, kv_heads, self.d_v, self.dtype, b)
    self.out = HeadMerge(self.num_heads, self.d_v, self.d_model, self.dtype, b)
    match self.qk_norm:
      case "none":
        pass
      case "rms":
        self.query_norm = nn.RMSNorm(epsilon=1e-6, dtype=self.dtype)
        self.key_norm = nn.RMSNorm(epsilon=1e-6, dtype=self.dtype)
      case "l2":
        # One g per layer, shared by its heads; log2 of the number of off-diagonal logits of
        # a sentence of L tokens (Henry et al. 2020).
        length = self.qk_norm_length
        self.qk_scale = self.param("qk_scale", nn.initializers.constant(
            math.log2(length * length - length)), ())
      case _:
        raise model_config.unknown("qk_norm", self.qk_norm)

  def __call__(
      self,
      inputs_q: jax.Array,  # [B, T, D]
      inputs_kv: jax.Array,  # [B, S, D]
      mask: jax.Array | None = None,  # bool [B, 1, T, S]
      *,
      positions: jax.Array | None = None,  # int [B or 1, T]; self-attention (T = S) only
      train: bool = False,
  ) -> jax.Array:  # [B, T, D]
    rate = self.attention_dropout_rate if train else 0.0
    dropout_rng = self.make_rng("dropout") if rate > 0.0 else None
    at = None if positions is None else positions[:, None]  # [B or 1, 1, T], over the heads
    query = self._prepare(self.query(inputs_q), at, "query")
    key = self._prepare(self.key(inputs_kv), at, "key")
    out = self._attend(query, key, self.value(inputs_kv), mask, positions, positions,
                       dropout_rate=rate, dropout_rng=dropout_rng)
    return self.out(out)

  def encoder_kv(self, encoded: jax.Array, valid: jax.Array) -> EncoderKV:
    """Keys/values of the encoder output `encoded [B, S, D]` (`valid`: bool `[B, S]`),
    projected once per sentence for every decoding step's `decode_cross`."""
    return EncoderKV(self._prepare(self.key(encoded), None, "key"), self.value(encoded), valid)

  def decode_self(self, x: jax.Array, cache: Any, position: jax.Array) -> tuple[jax.Array, Any]:
    """Self-attention for one decoding step at `position`.

    Args:
      x: the step's inputs `[B, D]`, one token per row.
      cache: a `KVCache` (or a layout with its `update`/`attend`,
        `transformer.decoding.beam_cache`).
      position: the step's absolute position `[]`.

    Returns:
      `(output [B, D], cache)`, the cache holding this step's keys/values at `position`.
    """
    key = self._prepare(self.key.step(x), position, "key")
    cache = cache.update(key, self.value.step(x), position)

    def attend(query, keys, values, mask, key_positions):
      return self._attend(query, keys, values, mask, position[None], key_positions)

    out = cache.attend(self._prepare(self.query.step(x), position, "query"), position, attend)
    return self.out.step(out), cache

  def decode_cross(self, x: jax.Array, cache: Any) -> jax.Array:
    """Cross-attention for one decoding step: `x [B, D]` over `cache` (an `EncoderKV`, or a
    layout with its `attend`) -> `[B, D]`."""
    query = self._prepare(self.query.step(x), None, "query")
    return self.out.step(cache.attend(query, self._attend))

  def _prepare(self, x: jax.Array, at: jax.Array | None, which: str) -> jax.Array:
    """Projected queries or keys `[B, heads, (T,) K]`, normalised (`qk_norm`) and rotated
    (RoPE) at positions `at`, broadcastable to `x.shape[:-1]` (None: cross-attention). With
    qk_norm='l2' the queries carry g, which the attention then uses as its whole scale."""
    if self.qk_norm == "rms":
      x = (self.query_norm if which == "query" else self.key_norm)(x)
    elif self.qk_norm == "l2":
      x = unit_length(x)
      if which == "query":
        x = x * self.qk_scale.astype(x.dtype)
    if at is not None and self.positions is not None:
      x = self.positions.rotate(x, at)
    return x

  def _attend(self, query, key, value, mask, q_positions=None, k_positions=None, *,
              dropout_rate=0.0, dropout_rng=None):
    """`[B, H, T, K]` queries over `[B, G, S, K|V_]` keys/values -> `[B, H, T, V_]`, with
    `attention_impl`; queries at `q_positions [..., T]` and keys at `k_positions [..., S]`
    (self-attention; None for cross-attention)."""
    terms = positions_lib.AttentionTerms()
    if q_positions is not None and self.positions is not None:
      terms = self.positions.terms(q_positions, k_positions)
    scale = 1.0 if self.qk_norm == "l2" else None  # the queries carry g (`_prepare`)
    match self.attention_impl:
      case "reference":
        out, weights = scaled_dot_product_attention(query, key, value, mask, terms=terms,
                                                    scale=scale, dropout_rate=dropout_rate,
                                                    dropout_rng=dropout_rng)
        # [B, H, T, S], kept only when 'intermediates' is mutable
        # (transformer.research.inspection); a no-op in training and decoding.
        self.sow("intermediates", "attention_weights", weights)
        return out
      case "xla" | "cudnn":
        # 'xla' lets JAX pick cuDNN where it can, 'cudnn' insists on it.
        implementation = None if self.attention_impl == "xla" else "cudnn"
      case _:
        raise model_config.unknown("attention_impl", self.attention_impl)
    # jax.nn.dot_product_attention needs d_k == d_v (config_checks.validate says so), takes
    # [B, T, H, K], reads G key/value heads itself, and a bias of four dimensions.
    query, key, value = (jnp.swapaxes(x, 1, 2) for x in (query, key, value))
    bias = terms.bias
    if bias is not None:
      bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
    out = jax.nn.dot_product_attention(query, key, value, bias=bias, mask=mask, scale=scale,
                                       implementation=implementation)
    return jnp.swapaxes(out, 1, 2)
