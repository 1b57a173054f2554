"""The Transformer of Vaswani et al. 2017 ("Attention Is All You Need"), in flax.linen.

Glossary: B batch, S source length, T target length, D d_model, H heads, K d_k, V_ d_v,
F d_ff, V vocabulary, L layers per stack.

Paper behaviour is the default (§3): post-LN sublayers `LayerNorm(x + Dropout(Sublayer(x)))`,
sinusoidal positions, one embedding matrix shared by source, target and the pre-softmax
projection, embeddings scaled by sqrt(d_model), ReLU feed-forward, no attention dropout.
Every departure is a field of `ModelConfig` (transformer/model/config.py) whose comment cites
the paper; a branch on a field's value has a case for each value its type allows and raises
on any other. The layers are in `layers.py`, attention in `attention.py`, the position
schemes in `position_schemes.py` (each asked what it adds to the embeddings, which tables a
stack shares, what it does in self-attention); this module holds the embeddings, the two
stacks and the model.

Token ids: 0 is padding (and the start symbol the decoder sees before the first target
token, as targets are shifted right), 1 is end-of-sentence; see `transformer.tokens`.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformer.model import attention
from transformer.model import config as model_config
from transformer.model import layers
from transformer.model import position_schemes
from transformer.model.config import ModelConfig
from transformer.tokens import PAD_ID


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


class Embedder(nn.Module):
  """Token embedding × sqrt(d_model) plus positions, then dropout (§3.4, §3.5, §5.4)."""

  cfg: ModelConfig
  embedding: nn.Module

  @nn.compact
  def __call__(self, tokens, positions, train: bool):  # [B, ...], [B or 1, ...] -> [B, ..., D]
    cfg = self.cfg
    x = self.embedding(tokens) * jnp.sqrt(cfg.d_model).astype(cfg.jnp_dtype)
    term = position_schemes.get(cfg.positional).embedding(cfg, positions)  # [..., D] or None
    if term is not None:
      x = x + term
    return nn.Dropout(cfg.dropout_rate)(x.astype(cfg.jnp_dtype), deterministic=not train)


class Encoder(nn.Module):
  """Source embedding and the stack of encoder layers."""

  cfg: ModelConfig
  embedding: nn.Module

  @nn.compact
  def __call__(self, inputs, positions, segmentation, train: bool):
    # inputs: [B, S], positions: [B or 1, S], segmentation: [B, S] or None -> [B, S, D]
    cfg = self.cfg
    valid = inputs != PAD_ID
    x = Embedder(cfg, self.embedding, name="embedder")(inputs, positions, train)
    mask = attention_mask(valid, valid, segmentation, segmentation)
    layer_cls = layers.layer_class(layers.EncoderLayer, cfg, static_argnums=(4,))
    tables = position_schemes.get(cfg.positional).stack_tables(cfg, bidirectional=True)
    for i in range(cfg.num_layers):
      x = layer_cls(cfg, tables, name=f"layer_{i}")(x, mask, positions, train)
    if not layers.post_norm(cfg):
      x = layers.norm_layer(cfg, name="final_norm")(x)
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
  """Target embedding, the stack of decoder layers, and the output projection."""

  cfg: ModelConfig
  embedding: nn.Module
  output: nn.Module  # the embedding itself (tied, §3.4) or a projection of its own

  def setup(self):
    cfg = self.cfg
    self.embedder = Embedder(cfg, self.embedding)
    layer_cls = layers.layer_class(layers.DecoderLayer, cfg, static_argnums=(6,))
    tables = position_schemes.get(cfg.positional).stack_tables(cfg, bidirectional=False)
    self.layers = [layer_cls(cfg, tables, name=f"layer_{i}") for i in range(cfg.num_layers)]
    if not layers.post_norm(cfg):
      self.final_norm = layers.norm_layer(cfg)
    if cfg.output_bias:  # Marian's final_logits_bias
      self.output_bias = self.param("output_bias", nn.initializers.zeros, (cfg.vocab_size,))

  def __call__(self, encoded, inputs, targets, positions, inputs_segmentation,
               targets_segmentation, train: bool, return_hidden: bool = False):
    decoder_inputs = shift_right(targets, targets_segmentation)
    if positions is None:
      positions = jnp.arange(targets.shape[1])[None]  # [1, T], the same for every row
    target_valid = targets != PAD_ID
    self_mask = attention_mask(target_valid, target_valid, targets_segmentation,
                               targets_segmentation, causal=True)
    cross_mask = attention_mask(target_valid, inputs != PAD_ID, targets_segmentation,
                                inputs_segmentation)
    y = self.embedder(decoder_inputs, positions, train)
    for layer in self.layers:
      y = layer(y, encoded, self_mask, cross_mask, positions, train)
    y = self._final_norm(y)
    return y if return_hidden else self.logits(y)  # [B, T, V]

  def logits(self, hidden: jax.Array) -> jax.Array:  # [..., D] -> float32 [..., V]
    """The pre-softmax projection: the tied embedding's transpose (§3.4), or its own (plus
    `output_bias`)."""
    if isinstance(self.output, nn.Embed):
      logits = self.output.attend(hidden).astype(jnp.float32)
    else:
      logits = self.output(hidden).astype(jnp.float32)
    return logits + self.output_bias if self.cfg.output_bias else logits

  def init_cache(self, encoded, inputs, max_decode_len: int) -> DecoderCache:
    cfg = self.cfg
    empty = attention.KVCache.empty(encoded.shape[0], cfg.kv_heads, max_decode_len, cfg.d_k,
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
    logits = self.logits(self._final_norm(y))  # [B, V]
    return logits, cache._replace(position=cache.position + 1,
                                  self_attention=tuple(self_caches))

  def _final_norm(self, y):
    return y if layers.post_norm(self.cfg) else self.final_norm(y)


class Transformer(nn.Module):
  """Encoder-decoder Transformer: `encode`, `decode` and `__call__` (teacher forcing), and
  cached incremental decoding (`init_cache`, then `decode_step` per token).

  Build it with `build_model(config)`.
  """

  cfg: ModelConfig

  def setup(self):
    cfg = self.cfg
    # Its N(0, 1/D) init gives unit-variance rows once multiplied by sqrt(D), and logits of
    # the same scale whether the output projection is tied or not.
    init = nn.initializers.normal(stddev=cfg.d_model ** -0.5)
    embed = functools.partial(nn.Embed, cfg.vocab_size, cfg.d_model, dtype=cfg.jnp_dtype,
                              embedding_init=init)
    match cfg.tie_embeddings:
      case "three_way":
        # One matrix for source embedding, target embedding and pre-softmax projection (§3.4).
        self.shared_embedding = embed()
        source = target = output = self.shared_embedding
      case "two_way":
        # The target embedding is the output projection (Press & Wolf 2017); the source has
        # its own.
        self.source_embedding, self.target_embedding = embed(), embed()
        source, target = self.source_embedding, self.target_embedding
        output = target
      case "none":
        self.source_embedding, self.target_embedding = embed(), embed()
        self.output_projection = nn.Dense(cfg.vocab_size, use_bias=False, dtype=cfg.jnp_dtype,
                                          kernel_init=init)  # [D, V]
        source, target = self.source_embedding, self.target_embedding
        output = self.output_projection
      case _:
        raise model_config.unknown("tie_embeddings", cfg.tie_embeddings)
    self.encoder = Encoder(cfg, source)
    self.decoder = Decoder(cfg, target, output)

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
      inputs_positions = jnp.arange(inputs.shape[1])[None]  # [1, S], the same for every row
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
    """Runs the decoder stack and the output projection over whole targets; returns
    logits. With `return_hidden`, returns the decoder's final states instead, before the
    output projection (`logits` applies it; `losses.chunked_loss_sums` applies it chunk by
    chunk)."""
    return self.decoder(encoded, inputs, targets, targets_positions, inputs_segmentation,
                        targets_segmentation, train, return_hidden)

  def logits(self, hidden: jax.Array) -> jax.Array:  # [..., D] -> float32 [..., V]
    """The output projection of the decoder's final states."""
    return self.decoder.logits(hidden)

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
  """Initial parameters; shapes depend only on the config, not on `batch`/`length`. Only the
  draws run (flax's `lazy_init`): the forward pass over dummy tokens is never computed, which
  op by op would cost its operations and under `jit` only its tracing (XLA drops it)."""
  tokens = jax.ShapeDtypeStruct((batch, length), jnp.int32)
  return model.lazy_init(rng, tokens, tokens)["params"]


def count_params(params: Any) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
