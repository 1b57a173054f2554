"""The Transformer of Vaswani et al. 2017 ("Attention Is All You Need"), in flax.linen.

Glossary: B batch, S source length, T target length, D d_model, H heads, K d_k, V_ d_v,
F d_ff, V vocabulary, L layers per stack.

Paper behaviour is the default (§3): post-LN sublayers `LayerNorm(x + Dropout(Sublayer(x)))`,
sinusoidal positions, one embedding matrix shared by source, target and the pre-softmax
projection, embeddings scaled by sqrt(d_model), ReLU feed-forward, no attention dropout.
Every departure is a field of `ModelConfig` (transformer/model/config.py) whose comment cites
the paper; a branch on a field's value has a case for each value its type allows and raises
on any other.

Token ids: 0 is padding (and the start symbol the decoder sees before the first target
token, as targets are shifted right), 1 is end-of-sentence; see `transformer.tokens`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformer.model import attention
from transformer.model import config as model_config
from transformer.model.config import ModelConfig
from transformer.tokens import PAD_ID


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


def shift_right(targets: jax.Array, segmentation: jax.Array | None = None) -> jax.Array:
  """Decoder inputs: targets shifted one step right, with PAD_ID as the start symbol.

  With packing, each segment starts with its own start symbol.
  """
  shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=PAD_ID)[:, :-1]
  if segmentation is not None:
    prev = jnp.pad(segmentation, ((0, 0), (1, 0)), constant_values=-1)[:, :-1]
    shifted = jnp.where(segmentation == prev, shifted, PAD_ID)
  return shifted


def attention_mask(
    q_valid: jax.Array,  # bool [B, T]
    kv_valid: jax.Array,  # bool [B, S]
    q_segments: jax.Array | None = None,  # [B, T]
    kv_segments: jax.Array | None = None,  # [B, S]
    causal: bool = False,
) -> jax.Array:  # bool [B, 1, T, S]
  """Padding (and optionally segment and causal) mask, True where attention is allowed."""
  mask = q_valid[:, :, None] & kv_valid[:, None, :]
  if q_segments is not None:
    mask &= q_segments[:, :, None] == kv_segments[:, None, :]
  if causal:
    t, s = q_valid.shape[1], kv_valid.shape[1]
    mask &= jnp.tril(jnp.ones((t, s), dtype=bool))
  return mask[:, None]


class FeedForward(nn.Module):
  """`max(0, x W1 + b1) W2 + b2` (paper §3.3)."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:  # [B, L, D] -> [B, L, D]
    init = nn.initializers.xavier_uniform()
    h = nn.Dense(self.cfg.d_ff, dtype=self.cfg.jnp_dtype, kernel_init=init, name="wi")(x)
    h = nn.relu(h)
    return nn.Dense(self.cfg.d_model, dtype=self.cfg.jnp_dtype, kernel_init=init, name="wo")(h)


class Sublayer(nn.Module):
  """Residual wrapper: post-LN `LN(x + Drop(f(x)))` (§3.1) or pre-LN `x + Drop(f(LN(x)))`.

  With `has_aux`, `f` returns `(output, aux)` and so does the wrapper (a decoding step's
  attention returns its cache beside its output).
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, fn, *, train: bool, has_aux: bool = False):
    norm = nn.LayerNorm(epsilon=1e-6, dtype=self.cfg.jnp_dtype, name="norm")
    drop = nn.Dropout(self.cfg.dropout_rate)
    post = _post_norm(self.cfg)
    out = fn(x if post else norm(x))
    out, aux = out if has_aux else (out, None)
    y = x + drop(out, deterministic=not train)
    y = norm(y) if post else y
    return (y, aux) if has_aux else y


class EncoderLayer(nn.Module):
  """Self-attention, then feed-forward, each wrapped in `Sublayer`."""

  cfg: ModelConfig

  def setup(self):
    self.self_attention = _attention(self.cfg)
    self.attention_block = Sublayer(self.cfg)
    self.ffn = FeedForward(self.cfg)
    self.ffn_block = Sublayer(self.cfg)

  def __call__(self, x, mask, train: bool = False):  # x: [B, S, D], mask: [B, 1, S, S]
    x = self.attention_block(x, lambda h: self.self_attention(h, h, mask, train=train),
                             train=train)
    return self.ffn_block(x, self.ffn, train=train)


class DecoderLayer(nn.Module):
  """Masked self-attention, attention over the encoder output, then feed-forward.

  `__call__` runs whole target sequences; `step` one token per row of cached decoding.
  """

  cfg: ModelConfig

  def setup(self):
    self.self_attention = _attention(self.cfg)
    self.self_attention_block = Sublayer(self.cfg)
    self.cross_attention = _attention(self.cfg)
    self.cross_attention_block = Sublayer(self.cfg)
    self.ffn = FeedForward(self.cfg)
    self.ffn_block = Sublayer(self.cfg)

  def __call__(self, y, encoded, self_mask, cross_mask, train: bool = False):
    # y: [B, T, D], encoded: [B, S, D], self_mask: [B, 1, T, T], cross_mask: [B, 1, T, S]
    y = self.self_attention_block(
        y, lambda h: self.self_attention(h, h, self_mask, train=train), train=train)
    y = self.cross_attention_block(
        y, lambda h: self.cross_attention(h, encoded, cross_mask, train=train), train=train)
    return self.ffn_block(y, self.ffn, train=train)

  def step(self, y, self_cache, cross_cache, position):
    """`y [B, D]` at `position` -> `(y [B, D], self_cache)` with the step's keys/values."""
    y, self_cache = self.self_attention_block(
        y, lambda h: self.self_attention.decode_self(h, self_cache, position), train=False,
        has_aux=True)
    y = self.cross_attention_block(
        y, lambda h: self.cross_attention.decode_cross(h, cross_cache), train=False)
    return self.ffn_block(y, self.ffn, train=False), self_cache


def _post_norm(cfg: ModelConfig) -> bool:
  """True for post-LN sublayers (§3.1), False for pre-LN (with final LayerNorms)."""
  match cfg.norm:
    case "post":
      return True
    case "pre":
      return False
  raise model_config.unknown("norm", cfg.norm)


def _attention(cfg: ModelConfig) -> attention.MultiHeadAttention:
  return attention.MultiHeadAttention(
      num_heads=cfg.num_heads, d_k=cfg.d_k, d_v=cfg.d_v, d_model=cfg.d_model,
      attention_dropout_rate=cfg.attention_dropout_rate, attention_impl=cfg.attention_impl,
      dtype=cfg.jnp_dtype)


def _layer_class(cls, cfg: ModelConfig, static_argnums):
  # nn.remat recomputes the layer in the backward pass; `train` stays a Python bool.
  return nn.remat(cls, static_argnums=static_argnums) if cfg.remat else cls


class Embedder(nn.Module):
  """Shared token embedding × sqrt(d_model) plus positions, then dropout (§3.4, §3.5, §5.4)."""

  cfg: ModelConfig
  shared: nn.Module

  @nn.compact
  def __call__(self, tokens, positions, train: bool):  # [B, ...], [B, ...] -> [B, ..., D]
    cfg = self.cfg
    x = self.shared(tokens) * jnp.sqrt(cfg.d_model).astype(cfg.jnp_dtype)
    match cfg.positional:
      case "sinusoidal":
        pe = sinusoidal_encoding(positions, cfg.d_model)
      case "learned":
        pe = nn.Embed(cfg.max_len, cfg.d_model, embedding_init=nn.initializers.normal(0.02),
                      name="position_embedding")(positions)
      case _:
        raise model_config.unknown("positional", cfg.positional)
    x = (x + pe).astype(cfg.jnp_dtype)
    return nn.Dropout(cfg.dropout_rate)(x, deterministic=not train)


class Encoder(nn.Module):
  """Source embedding and the stack of encoder layers."""

  cfg: ModelConfig
  shared_embedding: nn.Module

  @nn.compact
  def __call__(self, inputs, positions, segmentation, train: bool):
    # inputs: [B, S], positions: [B, S], segmentation: [B, S] or None -> [B, S, D]
    cfg = self.cfg
    valid = inputs != PAD_ID
    x = Embedder(cfg, self.shared_embedding, name="embedder")(inputs, positions, train)
    mask = attention_mask(valid, valid, segmentation, segmentation)
    layer_cls = _layer_class(EncoderLayer, cfg, static_argnums=(3,))
    for i in range(cfg.num_layers):
      x = layer_cls(cfg, name=f"layer_{i}")(x, mask, train)
    if not _post_norm(cfg):
      x = nn.LayerNorm(epsilon=1e-6, dtype=cfg.jnp_dtype, name="final_norm")(x)
    return x


class DecoderCache(NamedTuple):
  """What a cached decoding step reads and returns (`Transformer.init_cache`, `decode_step`).

  Each layer's caches are used only through their methods (`attention.KVCache`,
  `attention.EncoderKV`), so a search may substitute its own layout (`transformer.decoding.beam_cache`).
  """

  position: jax.Array  # [] int32: the position the next step writes
  self_attention: tuple[Any, ...]  # per layer: attention.KVCache [B, H, L, K|V_]
  cross_attention: tuple[Any, ...]  # per layer: attention.EncoderKV [B, H, S, K|V_]


class Decoder(nn.Module):
  """Target embedding, the stack of decoder layers, and the tied output projection."""

  cfg: ModelConfig
  shared_embedding: nn.Module

  def setup(self):
    cfg = self.cfg
    self.embedder = Embedder(cfg, self.shared_embedding)
    layer_cls = _layer_class(DecoderLayer, cfg, static_argnums=(5,))
    self.layers = [layer_cls(cfg, name=f"layer_{i}") for i in range(cfg.num_layers)]
    if not _post_norm(cfg):
      self.final_norm = nn.LayerNorm(epsilon=1e-6, dtype=cfg.jnp_dtype)

  def __call__(self, encoded, inputs, targets, positions, inputs_segmentation,
               targets_segmentation, train: bool, return_hidden: bool = False):
    decoder_inputs = shift_right(targets, targets_segmentation)
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(targets.shape[1]), targets.shape)
    target_valid = targets != PAD_ID
    self_mask = attention_mask(target_valid, target_valid, targets_segmentation,
                               targets_segmentation, causal=True)
    cross_mask = attention_mask(target_valid, inputs != PAD_ID, targets_segmentation,
                                inputs_segmentation)
    y = self.embedder(decoder_inputs, positions, train)
    for layer in self.layers:
      y = layer(y, encoded, self_mask, cross_mask, train)
    y = self._final_norm(y)
    return y if return_hidden else output_logits(self.shared_embedding, y)  # [B, T, V]

  def init_cache(self, encoded, inputs, max_decode_len: int) -> DecoderCache:
    cfg = self.cfg
    empty = attention.KVCache.empty(encoded.shape[0], cfg.num_heads, max_decode_len, cfg.d_k,
                                    cfg.d_v, cfg.jnp_dtype)
    return DecoderCache(
        position=jnp.array(0, jnp.int32),
        self_attention=(empty,) * cfg.num_layers,
        cross_attention=tuple(layer.cross_attention.encoder_kv(encoded, inputs != PAD_ID)
                              for layer in self.layers))

  def step(self, ids, cache: DecoderCache) -> tuple[jax.Array, DecoderCache]:
    y = self.embedder(ids[:, 0], jnp.full(ids.shape[:1], cache.position), False)  # [B, D]
    self_caches = []
    for layer, self_cache, cross_cache in zip(self.layers, cache.self_attention,
                                              cache.cross_attention):
      y, self_cache = layer.step(y, self_cache, cross_cache, cache.position)
      self_caches.append(self_cache)
    logits = output_logits(self.shared_embedding, self._final_norm(y))  # [B, V]
    return logits, cache._replace(position=cache.position + 1,
                                  self_attention=tuple(self_caches))

  def _final_norm(self, y):
    return y if _post_norm(self.cfg) else self.final_norm(y)


def output_logits(shared_embedding: nn.Embed, hidden: jax.Array) -> jax.Array:
  """The tied pre-softmax projection (§3.4): `[..., D]` -> float32 `[..., V]`."""
  return shared_embedding.attend(hidden).astype(jnp.float32)


class Transformer(nn.Module):
  """Encoder-decoder Transformer: `encode`, `decode` and `__call__` (teacher forcing), and
  cached incremental decoding (`init_cache`, then `decode_step` per token).

  Build it with `build_model(config)`.
  """

  cfg: ModelConfig

  def setup(self):
    cfg = self.cfg
    # One matrix for source embedding, target embedding and pre-softmax projection (§3.4).
    # Its N(0, 1/D) init gives unit-variance rows once multiplied by sqrt(D).
    self.shared_embedding = nn.Embed(
        cfg.vocab_size, cfg.d_model, dtype=cfg.jnp_dtype,
        embedding_init=nn.initializers.normal(stddev=cfg.d_model ** -0.5))
    self.encoder = Encoder(cfg, self.shared_embedding)
    self.decoder = Decoder(cfg, self.shared_embedding)

  def encode(
      self,
      inputs: jax.Array,  # [B, S] token ids, PAD_ID = padding
      *,
      inputs_positions: jax.Array | None = None,  # [B, S]; given with packing
      inputs_segmentation: jax.Array | None = None,  # [B, S]; given with packing
      train: bool = False,
  ) -> jax.Array:  # [B, S, D]
    """Runs the encoder stack."""
    if inputs_positions is None:
      inputs_positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
    return self.encoder(inputs, inputs_positions, inputs_segmentation, train)

  def decode(
      self,
      encoded: jax.Array,  # [B, S, D]
      inputs: jax.Array,  # [B, S] source ids (for the padding mask)
      targets: jax.Array,  # [B, T] target ids, shifted right here
      *,
      targets_positions: jax.Array | None = None,  # [B, T]
      inputs_segmentation: jax.Array | None = None,  # [B, S]
      targets_segmentation: jax.Array | None = None,  # [B, T]
      train: bool = False,
      return_hidden: bool = False,
  ) -> jax.Array:  # float32 [B, T, V], or [B, T, D] with return_hidden
    """Runs the decoder stack and the tied output projection over whole targets; returns
    logits. With `return_hidden`, returns the decoder's final states instead, before the
    output projection (`logits` applies it; `losses.chunked_loss_sums` applies it chunk by
    chunk)."""
    return self.decoder(encoded, inputs, targets, targets_positions, inputs_segmentation,
                        targets_segmentation, train, return_hidden)

  def logits(self, hidden: jax.Array) -> jax.Array:  # [..., D] -> float32 [..., V]
    """The tied output projection of the decoder's final states."""
    return output_logits(self.shared_embedding, hidden)

  def init_cache(
      self,
      encoded: jax.Array,  # [B, S, D]
      inputs: jax.Array,  # [B, S] source ids (for the padding mask)
      max_decode_len: int,
  ) -> DecoderCache:
    """The decoding cache before the first step: each decoder layer's cross-attention
    keys/values of `encoded`, projected once per sentence, with the source mask, and empty
    self-attention caches of `max_decode_len` positions."""
    return self.decoder.init_cache(encoded, inputs, max_decode_len)

  def decode_step(
      self,
      ids: jax.Array,  # [B, 1] each row's previous token (PAD_ID, the start, at first)
      cache: DecoderCache,
  ) -> tuple[jax.Array, DecoderCache]:  # float32 [B, V], the cache one position on
    """One step of cached decoding: the next-token logits, and the cache holding the step's
    self-attention keys/values."""
    return self.decoder.step(ids, cache)

  def __call__(
      self,
      inputs: jax.Array,  # [B, S]
      targets: jax.Array,  # [B, T]
      *,
      inputs_positions: jax.Array | None = None,
      targets_positions: jax.Array | None = None,
      inputs_segmentation: jax.Array | None = None,
      targets_segmentation: jax.Array | None = None,
      train: bool = False,
      return_hidden: bool = False,
  ) -> jax.Array:  # float32 [B, T, V], or [B, T, D] with return_hidden
    """Teacher-forced forward pass: logits for every target position (or, with
    `return_hidden`, the decoder's final states before the output projection)."""
    encoded = self.encode(inputs, inputs_positions=inputs_positions,
                          inputs_segmentation=inputs_segmentation, train=train)
    return self.decode(encoded, inputs, targets, targets_positions=targets_positions,
                       inputs_segmentation=inputs_segmentation,
                       targets_segmentation=targets_segmentation, train=train,
                       return_hidden=return_hidden)


def build_model(config) -> Transformer:
  """A `Transformer` from `config.model` (checked by `config_checks.validate`) and
  `config.dtype`."""
  return Transformer(ModelConfig(**dict(config.model), dtype=config.dtype))


def init_params(model: Transformer, rng: jax.Array, batch: int = 1, length: int = 8) -> Any:
  """Initial parameters; shapes depend only on the config, not on `batch`/`length`."""
  tokens = jnp.ones((batch, length), jnp.int32)
  return model.init(rng, tokens, tokens)["params"]


def count_params(params: Any) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
