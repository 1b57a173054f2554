"""The Transformer of Vaswani et al. 2017 ("Attention Is All You Need"), in flax.linen.

Glossary: B batch, S source length, T target length, D d_model, H heads, K d_k, V_ d_v,
F d_ff, V vocabulary, L layers per stack.

Paper behaviour is the default (§3): post-LN sublayers `LayerNorm(x + Dropout(Sublayer(x)))`,
sinusoidal positions, one embedding matrix shared by source, target and the pre-softmax
projection, embeddings scaled by sqrt(d_model), ReLU feed-forward, no attention dropout.
Every departure is a field of `ModelConfig` whose comment cites the paper.

Token ids: 0 is padding (and the start symbol the decoder sees before the first target
token, as targets are shifted right), 1 is end-of-sentence; see `transformer.tokens`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformer import attention
from transformer import cpu_workarounds
from transformer.tokens import PAD_ID


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters, with the paper's names; defaults are the base model (§3, Table 3)."""

  vocab_size: int = 37000  # shared source/target vocabulary (§5.1)
  d_model: int = 512
  d_ff: int = 2048
  num_heads: int = 8
  d_k: int = 64  # set apart from d_model / num_heads for Table 3 row (B)
  d_v: int = 64
  num_layers: int = 6  # N, in each stack
  dropout_rate: float = 0.1  # P_drop on sublayer outputs and embedding sums (§5.4)
  # Departure: the paper applies no dropout to attention weights (§5.4).
  attention_dropout_rate: float = 0.0
  # 'learned' is Table 3 row (E); the paper's model uses sinusoids (§3.5).
  positional: str = "sinusoidal"
  # 'pre' departs from §3.1 (post-LN): x + Dropout(Sublayer(LayerNorm(x))), final LayerNorms.
  norm: str = "post"
  max_len: int = 512  # positions the model can encode (learned table size; decode cache bound)
  # Implementation switches; none changes the mathematics.
  attention_impl: str = "reference"  # 'reference' | 'xla' | 'cudnn' (jax.nn.dot_product_attention)
  remat: bool = False  # recompute each layer's activations in the backward pass to save memory
  # Computation dtype, from the top-level `config.dtype`; parameters stay float32.
  dtype: str = "float32"
  # Decoding code tuned for XLA:CPU (`transformer.cpu_workarounds`), resolved from the
  # top-level `config.cpu_workarounds`.
  cpu_workarounds: bool = False

  @property
  def jnp_dtype(self):
    return jnp.dtype(self.dtype)


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
  """Residual wrapper: post-LN `LN(x + Drop(f(x)))` (§3.1) or pre-LN `x + Drop(f(LN(x)))`."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, fn, *, train: bool):
    norm = nn.LayerNorm(epsilon=1e-6, dtype=self.cfg.jnp_dtype, name="norm")
    drop = nn.Dropout(self.cfg.dropout_rate)
    if self.cfg.norm == "post":
      return norm(x + drop(fn(x), deterministic=not train))
    return x + drop(fn(norm(x)), deterministic=not train)


class EncoderLayer(nn.Module):
  """Self-attention, then feed-forward, each wrapped in `Sublayer`."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, mask, train: bool = False):  # x: [B, S, D], mask: [B, 1, S, S]
    cfg = self.cfg
    attn = _attention(cfg, "self", "self_attention")
    x = Sublayer(cfg, name="attention_block")(
        x, lambda h: attn(h, h, mask, train=train), train=train)
    return Sublayer(cfg, name="ffn_block")(x, FeedForward(cfg, name="ffn"), train=train)


class DecoderLayer(nn.Module):
  """Masked self-attention, attention over the encoder output, then feed-forward."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, y, encoded, self_mask, cross_mask, train: bool = False,
               decode: bool = False):
    # y: [B, T, D], encoded: [B, S, D], self_mask: [B, 1, T, T], cross_mask: [B, 1, T, S]
    cfg = self.cfg
    self_attn = _attention(cfg, "self", "self_attention")
    cross_attn = _attention(cfg, "cross", "cross_attention")
    y = Sublayer(cfg, name="self_attention_block")(
        y, lambda h: self_attn(h, h, self_mask, train=train, decode=decode), train=train)
    y = Sublayer(cfg, name="cross_attention_block")(
        y, lambda h: cross_attn(h, encoded, cross_mask, train=train, decode=decode),
        train=train)
    return Sublayer(cfg, name="ffn_block")(y, FeedForward(cfg, name="ffn"), train=train)


def _attention(cfg: ModelConfig, kind: str, name: str) -> attention.MultiHeadAttention:
  return attention.MultiHeadAttention(
      num_heads=cfg.num_heads, d_k=cfg.d_k, d_v=cfg.d_v, d_model=cfg.d_model, kind=kind,
      attention_dropout_rate=cfg.attention_dropout_rate, attention_impl=cfg.attention_impl,
      dtype=cfg.jnp_dtype, name=name)


def _layer_class(cls, cfg: ModelConfig, static_argnums):
  # nn.remat recomputes the layer in the backward pass; `train`/`decode` stay Python bools.
  return nn.remat(cls, static_argnums=static_argnums) if cfg.remat else cls


class Embedder(nn.Module):
  """Shared token embedding × sqrt(d_model) plus positions, then dropout (§3.4, §3.5, §5.4)."""

  cfg: ModelConfig
  shared: nn.Module

  @nn.compact
  def __call__(self, tokens, positions, train: bool):  # [B, L], [B, L] -> [B, L, D]
    cfg = self.cfg
    x = self.shared(tokens) * jnp.sqrt(cfg.d_model).astype(cfg.jnp_dtype)
    if cfg.positional == "sinusoidal":
      pe = sinusoidal_encoding(positions, cfg.d_model)
    else:
      pe = nn.Embed(cfg.max_len, cfg.d_model, embedding_init=nn.initializers.normal(0.02),
                    name="position_embedding")(positions)
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
    if cfg.norm == "pre":
      x = nn.LayerNorm(epsilon=1e-6, dtype=cfg.jnp_dtype, name="final_norm")(x)
    return x


class Decoder(nn.Module):
  """Target embedding, the stack of decoder layers, and the tied output projection."""

  cfg: ModelConfig
  shared_embedding: nn.Module

  @nn.compact
  def __call__(self, encoded, inputs, targets, positions, inputs_segmentation,
               targets_segmentation, train: bool, decode: bool):
    cfg = self.cfg
    if decode:
      building = not self.has_variable("cache", "position")
      position = self.variable("cache", "position", lambda: jnp.array(0, jnp.int32))
      source_valid = self.variable("cache", "source_valid", lambda: inputs != PAD_ID).value
      decoder_inputs = targets
      target_valid = jnp.ones(targets.shape, bool)
      if building:
        positions = jnp.broadcast_to(jnp.arange(targets.shape[1]), targets.shape)
        self_mask = attention_mask(target_valid, target_valid, causal=True)
      else:
        positions = jnp.full(targets.shape, position.value)
        position.value += 1
        self_mask = None  # the self-attention cache applies its own causal mask
      cross_mask = attention_mask(target_valid, source_valid)
    else:
      decoder_inputs = shift_right(targets, targets_segmentation)
      if positions is None:
        positions = jnp.broadcast_to(jnp.arange(targets.shape[1]), targets.shape)
      target_valid = targets != PAD_ID
      self_mask = attention_mask(target_valid, target_valid, targets_segmentation,
                                 targets_segmentation, causal=True)
      cross_mask = attention_mask(target_valid, inputs != PAD_ID, targets_segmentation,
                                  inputs_segmentation)

    y = Embedder(cfg, self.shared_embedding, name="embedder")(decoder_inputs, positions, train)
    layer_cls = _layer_class(DecoderLayer, cfg, static_argnums=(5, 6))
    for i in range(cfg.num_layers):
      y = layer_cls(cfg, name=f"layer_{i}")(y, encoded, self_mask, cross_mask, train, decode)
    if cfg.norm == "pre":
      y = nn.LayerNorm(epsilon=1e-6, dtype=cfg.jnp_dtype, name="final_norm")(y)
    logits = self.shared_embedding.attend(y)  # [B, T, V]
    return logits.astype(jnp.float32)


class Transformer(nn.Module):
  """Encoder-decoder Transformer with `encode`, `decode` and `__call__` (teacher forcing).

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
      encoded: jax.Array | None,  # [B, S, D]; None in cached steps after the first call
      inputs: jax.Array | None,  # [B, S] source ids (for the padding mask)
      targets: jax.Array,  # [B, T] target ids (shifted right here unless decode=True)
      *,
      targets_positions: jax.Array | None = None,  # [B, T]
      inputs_segmentation: jax.Array | None = None,  # [B, S]
      targets_segmentation: jax.Array | None = None,  # [B, T]
      train: bool = False,
      decode: bool = False,
  ) -> jax.Array:  # float32 [B, T, V]
    """Runs the decoder stack and the tied output projection; returns logits.

    With `decode=True` (cached incremental decoding, `mutable=['cache']`), `targets` are the
    decoder's own inputs. The first call, with no cache yet, builds it: `targets` is then a
    `[B, max_decode_len]` placeholder that only sizes the self-attention cache, and the
    cross-attention keys/values and source mask are computed from `encoded`/`inputs` and
    stored. Each later call takes one token `[B, 1]` and needs neither `encoded` nor `inputs`.
    """
    return self.decoder(encoded, inputs, targets, targets_positions, inputs_segmentation,
                        targets_segmentation, train, decode)

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
  ) -> jax.Array:  # float32 [B, T, V]
    """Teacher-forced forward pass: logits for every target position."""
    encoded = self.encode(inputs, inputs_positions=inputs_positions,
                          inputs_segmentation=inputs_segmentation, train=train)
    return self.decode(encoded, inputs, targets, targets_positions=targets_positions,
                       inputs_segmentation=inputs_segmentation,
                       targets_segmentation=targets_segmentation, train=train)


def build_model(config) -> Transformer:
  """A `Transformer` from `config.model`, `config.dtype` and `config.cpu_workarounds`;
  unknown keys are errors."""
  fields = {f.name for f in dataclasses.fields(ModelConfig)} - {"dtype", "cpu_workarounds"}
  unknown = sorted(set(config.model) - fields)
  if unknown:
    raise ValueError(f"unknown key(s) config.model.{', config.model.'.join(unknown)}; "
                     f"allowed: {', '.join(sorted(fields))}")
  return Transformer(ModelConfig(
      **dict(config.model), dtype=config.get("dtype", "float32"),
      cpu_workarounds=cpu_workarounds.enabled(config.get("cpu_workarounds", "auto"))))


def init_params(model: Transformer, rng: jax.Array, batch: int = 1, length: int = 8) -> Any:
  """Initial parameters; shapes depend only on the config, not on `batch`/`length`."""
  tokens = jnp.ones((batch, length), jnp.int32)
  return model.init(rng, tokens, tokens)["params"]


def count_params(params: Any) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
