"""The beam layout of the decoder cache: beams share their history instead of copying it.

Glossary: B sentences, beams hypotheses per sentence (rows `b * beams + j`), L cache length,
S source length, H heads, G key/value heads, K d_k, V_ d_v.

Beam search reorders its hypotheses at every step; copying each beam's self-attention
keys/values to its new row would copy the whole cache once per step. Here each beam writes a
step's keys/values once, into its own slot, and an origin table `[B, beams, L]` says which
slot holds each beam's position t: reordering beams moves only that table (`reorder`, the
`reorder_cache` hook of `decode.beam_search`). A beam's query attends over all its
sentence's slots, masked to its own history. Cross-attention keys/values are kept once per
sentence and read by all its beams. The model sees these layers' caches only through the
methods of `attention.KVCache` and `attention.EncoderKV`, which these mirror; a step reads as
much of the self-attention cache as the model's cache it replaces would (its `read`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from transformer.model import attention
from transformer.model.transformer import DecoderCache


class BeamKVCache(struct.PyTreeNode):
  """One layer's self-attention keys/values for `beams` hypotheses per sentence.

  Slots are position-major: column `t * beams + m` holds the keys/values that slot m wrote at
  position t, so a step writes one contiguous block and a prefix of positions is a prefix of
  columns.
  """

  keys: jax.Array  # [B, G, L * beams, K]
  values: jax.Array  # [B, G, L * beams, V_]
  origin: jax.Array  # int32 [B, beams, L]: the slot holding beam j's position t; -1 = unwritten
  read: attention.CacheRead = struct.field(pytree_node=False, default=attention.read_whole)

  @classmethod
  def empty(cls, like: attention.KVCache, beams: int) -> BeamKVCache:
    """An empty cache for `beams` hypotheses of each sentence of `like` (`[B, G, L, K]`),
    read as `like` is."""
    batch, heads, length, _ = like.keys.shape

    def slots(x):  # [B, G, L, size] -> zeros [B, G, L * beams, size]
      return jnp.zeros((batch, heads, length * beams, x.shape[-1]), x.dtype)

    return cls(slots(like.keys), slots(like.values),
               jnp.full((batch, beams, length), -1, jnp.int32), like.read)

  def update(self, key: jax.Array, value: jax.Array, position: jax.Array) -> BeamKVCache:
    """Each beam writes its `key [B * beams, G, K]` and `value [B * beams, G, V_]` in its own
    slot at `position`."""
    batch, beams, _ = self.origin.shape
    column = position * beams
    own = jnp.broadcast_to(jnp.arange(beams, dtype=jnp.int32)[None, :, None], (batch, beams, 1))
    return self.replace(
        keys=self._write_keys(_by_sentence(key, batch), column),
        values=jax.lax.dynamic_update_slice(self.values, _by_sentence(value, batch),
                                            (0, 0, column, 0)),
        origin=jax.lax.dynamic_update_slice(self.origin, own, (0, 0, position)))

  def attend(self, query: jax.Array, position: jax.Array, attend: attention.Attend) -> jax.Array:
    """Each beam's `query [B * beams, H, K]` over its own history -> `[B * beams, H, V_]`."""
    batch, beams, max_len = self.origin.shape
    query = _by_sentence(query, batch)  # [B, H, beams, K]: a sentence's beams are its queries

    def attend_first(length):
      # Beam j sees column (t, m) where m = origin[j, t]; unwritten positions match no slot.
      mask = self.origin[:, :, :length, None] == jnp.arange(beams)  # [B, beams, length, beams]
      mask = mask.reshape(batch, 1, beams, length * beams)
      columns = length * beams
      key_positions = jnp.arange(columns) // beams  # column (t, m) holds position t
      return attend(query, self._key_columns(columns), self.values[:, :, :columns], mask,
                    key_positions)

    return _by_row(self.read(attend_first, position, max_len))

  def reorder(self, parents: jax.Array) -> BeamKVCache:
    """New beam j of sentence b continues old beam `parents[b, j]` (int `[B, beams]`)."""
    return self.replace(origin=jnp.take_along_axis(self.origin, parents[:, :, None], axis=1))

  def _write_keys(self, key: jax.Array, column: jax.Array) -> jax.Array:
    """The keys with `key [B, G, beams, K]` written from `column` on."""
    return jax.lax.dynamic_update_slice(self.keys, key, (0, 0, column, 0))

  def _key_columns(self, columns: int) -> jax.Array:  # [B, G, columns, K]
    return self.keys[:, :, :columns]


class TransposedBeamKVCache(BeamKVCache):
  """`BeamKVCache` with its keys stored transposed, `[B, G, K, L * beams]`, for XLA:CPU
  (`backend_ops.CPU`). The attention's scores are then a plain product of the beams'
  queries and the stored keys (XLA folds the transposed view into it), where XLA:CPU would
  copy the keys it reads into that layout at every step."""

  @classmethod
  def empty(cls, like: attention.KVCache, beams: int) -> TransposedBeamKVCache:
    plain = BeamKVCache.empty(like, beams)
    return cls(plain.keys.swapaxes(2, 3), plain.values, plain.origin, plain.read)

  def _write_keys(self, key: jax.Array, column: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_slice(self.keys, key.swapaxes(2, 3), (0, 0, 0, column))

  def _key_columns(self, columns: int) -> jax.Array:  # [B, G, columns, K]
    return self.keys[..., :columns].swapaxes(2, 3)


class SharedEncoderKV(attention.EncoderKV):
  """One layer's cross-attention keys/values (`attention.EncoderKV`), one copy per sentence
  for all its beams."""

  def attend(self, query: jax.Array, attend: attention.Attend) -> jax.Array:
    """`query [B * beams, H, K]` -> `[B * beams, H, V_]`: one attention call per sentence,
    its beams as the queries."""
    out = attend(_by_sentence(query, self.keys.shape[0]), self.keys, self.values,
                 self.valid[:, None, None, :])
    return _by_row(out)


def beam_layout(cache: DecoderCache, beams: int, *, transposed_keys: bool) -> DecoderCache:
  """`cache` (the model's, before the first step, one row per sentence) laid out for `beams`
  hypotheses per sentence: empty `BeamKVCache`s (`TransposedBeamKVCache`s with
  `transposed_keys`), each read as the model's cache it replaces, cross-attention shared by a
  sentence's beams."""
  layout = TransposedBeamKVCache if transposed_keys else BeamKVCache
  return cache._replace(
      self_attention=tuple(layout.empty(c, beams) for c in cache.self_attention),
      cross_attention=tuple(SharedEncoderKV(*c) for c in cache.cross_attention))


def reorder(cache: DecoderCache, parents: jax.Array) -> DecoderCache:
  """New beam j of sentence b continues old beam `parents[b, j]`: only origin tables move."""
  return cache._replace(self_attention=tuple(c.reorder(parents) for c in cache.self_attention))


def _by_sentence(x: jax.Array, batch: int) -> jax.Array:
  """`[B * beams, heads, size] -> [B, heads, beams, size]`."""
  _, heads, size = x.shape
  return x.reshape(batch, -1, heads, size).swapaxes(1, 2)


def _by_row(x: jax.Array) -> jax.Array:
  """`[B, heads, beams, size] -> [B * beams, heads, size]`."""
  batch, heads, beams, size = x.shape
  return x.swapaxes(1, 2).reshape(batch * beams, heads, size)
