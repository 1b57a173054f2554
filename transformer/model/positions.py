"""The mathematics of the position schemes: added to the embeddings (§3.5), or inside
self-attention.

Glossary: B batch, T query length, S key length, H heads, K d_k, V_ d_v, D d_model.

`config.model.positional` picks one scheme, an object of `position_schemes` that says where
each of these enters the model and the exports:

- 'sinusoidal' (the paper, §3.5) and 'learned' (Table 3 row E): a vector per position added to
  the scaled embeddings (`sinusoidal_encoding`; the learned table lives in the embedder).
- 'rope' (Su et al. 2021, RoFormer): each self-attention query and key rotated by its
  position (`rotate`), so that their product depends on the distance alone.
- 't5' (Raffel et al. 2020, §2.1): a learned scalar per head and distance bucket added to the
  self-attention logits (`t5_bucket`, `T5Bias`); one table per stack, shared by its layers.
- 'shaw' (Shaw et al. 2018): learned vectors per clipped distance added to the keys and the
  values of self-attention (`ShawTables`, eqs. 3 and 4); one pair of tables per layer.
- 'alibi' (Press et al. 2022): a fixed penalty, a head's slope times the distance, on the
  self-attention logits (`alibi_slopes`, `alibi_bias`).

With the last four nothing is added to the embeddings, and cross-attention sees no positions
in any scheme (the encoder's output carries them). Every function here takes the positions of
the queries `[..., T]` and of the keys `[..., S]`, so one code path serves whole sequences
(positions from the batch, packed rows included) and cached decoding (the step's absolute
position against the positions the cache holds).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
# RoPE's θ_i = 10000^(-2i/K) (Su et al. 2021, eq. 15): the sinusoids' frequencies (§3.5).
ROPE_BASE = 10000.0
# T5's buckets: 32 per direction pair, logarithmic up to 128 positions, one beyond (Raffel et
# al. 2020; the values of its released code).
T5_BUCKETS = 32
T5_MAX_DISTANCE = 128


def sinusoidal_encoding(positions: jax.Array, d_model: int) -> jax.Array:
  """`PE(pos, 2i) = sin(pos / 10000^(2i/d))`, `PE(pos, 2i+1) = cos(...)` (paper §3.5).

  Args:
    positions: integer positions, any shape `[...]`.
    d_model: D (even).

  Returns:
    float32 `[..., D]`, sines at even and cosines at odd channels, as in the formula.
  """
  i = jnp.arange(d_model // 2, dtype=jnp.float32)
  inv_freq = 1.0 / (10000.0 ** (2.0 * i / d_model))  # [D/2]
  angles = positions[..., None].astype(jnp.float32) * inv_freq  # [..., D/2]
  pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., D/2, 2]
  return pe.reshape(*positions.shape, d_model)


def rotate(x: jax.Array, positions: jax.Array) -> jax.Array:
  """RoPE: channels (2i, 2i+1) of each vector rotated by the angle `position · θ_i`.

  Args:
    x: queries or keys `[..., K]` (K even).
    positions: integer positions broadcastable to `x.shape[:-1]`.

  Returns:
    `x` rotated, in its dtype (the angles are computed in float32).
  """
  k = x.shape[-1]
  inv_freq = ROPE_BASE ** (-jnp.arange(0, k, 2, dtype=jnp.float32) / k)  # [K/2]
  angles = jnp.asarray(positions, jnp.float32)[..., None] * inv_freq  # [..., K/2]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  even, odd = x[..., 0::2].astype(jnp.float32), x[..., 1::2].astype(jnp.float32)
  out = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)  # [..., K/2, 2]
  return out.reshape(x.shape).astype(x.dtype)


def t5_bucket(relative: jax.Array, bidirectional: bool, num_buckets: int = T5_BUCKETS,
              max_distance: int = T5_MAX_DISTANCE) -> jax.Array:
  """T5's bucket of each `relative = key position - query position`.

  Half the buckets hold distances one by one, the rest logarithmically wider ranges up to
  `max_distance`, beyond which all share the last. Bidirectional (the encoder) gives keys
  before and after the query their own halves; otherwise (the decoder) only keys at or before
  the query are told apart.
  """
  relative = jnp.asarray(relative, jnp.int32)
  distance = -relative  # how far back the key lies
  bucket = jnp.zeros_like(relative)
  if bidirectional:
    num_buckets //= 2
    bucket = bucket + (distance < 0) * num_buckets
    distance = jnp.abs(distance)
  else:
    distance = jnp.maximum(distance, 0)
  exact = num_buckets // 2
  scaled = (jnp.log(jnp.maximum(distance, exact).astype(jnp.float32) / exact)
            / math.log(max_distance / exact) * (num_buckets - exact))
  wide = jnp.minimum(exact + scaled.astype(relative.dtype), num_buckets - 1)
  return bucket + jnp.where(distance < exact, distance, wide)


def alibi_slopes(num_heads: int) -> np.ndarray:
  """ALiBi's per-head slopes (Press et al. 2022, §3): for n heads a power of two, the
  geometric sequence 2^(-8/n), 2^(-16/n), …, 2^(-8); otherwise those of the power of two
  below n, then every other slope of twice that many heads."""
  def geometric(n):
    return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

  below = 2 ** int(math.floor(math.log2(num_heads)))
  slopes = geometric(below) + geometric(2 * below)[0::2][:num_heads - below]
  return np.asarray(slopes, np.float32)


def alibi_bias(q_positions: jax.Array, k_positions: jax.Array, num_heads: int) -> jax.Array:
  """`-slope_h · |key position - query position|`: `[..., T]`, `[..., S]` -> float32
  `[..., H, T, S]`. In the decoder's causal attention this is Press et al.'s bias; the
  encoder, which they do not define, penalises distance both ways alike."""
  distance = jnp.abs(k_positions[..., None, :] - q_positions[..., :, None])  # [..., T, S]
  slopes = jnp.asarray(alibi_slopes(num_heads))[:, None, None]  # [H, 1, 1]
  return -slopes * distance[..., None, :, :].astype(jnp.float32)


def shaw_index(q_positions: jax.Array, k_positions: jax.Array, clip: int) -> jax.Array:
  """`clip(key position - query position, -k, k) + k`: `[..., T, S]` rows of Shaw et al.'s
  tables (§3.2)."""
  relative = k_positions[..., None, :] - q_positions[..., :, None]
  return jnp.clip(relative, -clip, clip) + clip


class T5Bias(nn.Module):
  """T5's relative attention bias: a learned scalar per bucket and head, one table per stack
  (Raffel et al. 2020 share it across layers)."""

  num_heads: int
  bidirectional: bool  # True in the encoder, False in the decoder

  @nn.compact
  def __call__(self, q_positions: jax.Array, k_positions: jax.Array) -> jax.Array:
    """`[..., T]`, `[..., S]` -> float32 `[..., H, T, S]`."""
    table = self.param("embedding", nn.initializers.normal(0.02),
                       (T5_BUCKETS, self.num_heads))  # [buckets, H]
    buckets = t5_bucket(k_positions[..., None, :] - q_positions[..., :, None],
                        self.bidirectional)  # [..., T, S]
    return jnp.moveaxis(table[buckets], -1, -3)


class ShawTables(nn.Module):
  """One layer's relative position representations `a^K` and `a^V` (Shaw et al. 2018, §3):
  2k + 1 learned vectors each, shared by the heads."""

  clip: int  # k
  d_k: int
  d_v: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, q_positions: jax.Array, k_positions: jax.Array
               ) -> tuple[jax.Array, jax.Array]:
    """`[..., T]`, `[..., S]` -> `(a^K [..., T, S, K], a^V [..., T, S, V_])`."""
    init = nn.initializers.xavier_uniform()
    rows = 2 * self.clip + 1
    keys = self.param("keys", init, (rows, self.d_k))
    values = self.param("values", init, (rows, self.d_v))
    index = shaw_index(q_positions, k_positions, self.clip)
    return keys[index].astype(self.dtype), values[index].astype(self.dtype)


class AttentionTerms(NamedTuple):
  """What positions add to one attention call (`attention.scaled_dot_product_attention`)."""

  bias: jax.Array | None = None  # float32 [..., H, T, S], added to the logits
  keys: jax.Array | None = None  # [..., T, S, K]: a^K_ij, added to key j for query i
  values: jax.Array | None = None  # [..., T, S, V_]: a^V_ij, added to value j for query i
