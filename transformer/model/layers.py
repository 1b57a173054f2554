"""The layers of each stack (paper §3.1): sublayers with their residual connection and norm,
the position-wise feed-forward network (§3.3), and the encoder and decoder layers.

Glossary: B batch, S source length, T target length, D d_model, F the feed-forward's width.

Paper behaviour is the default: post-LN `LayerNorm(x + Dropout(Sublayer(x)))`, a ReLU
feed-forward with biases. `norm`, `norm_type`, `activation`, `ffn_match_params`,
`glu_biases` and `biases` of `ModelConfig` select the departures, each citing its paper in
transformer/model/config.py.
"""

from __future__ import annotations

import functools

import jax
from flax import linen as nn

from transformer.model import attention
from transformer.model import config as model_config
from transformer.model import position_schemes
from transformer.model.config import ModelConfig


def norm_layer(cfg: ModelConfig, name: str | None = None) -> nn.Module:
  """The model's normalisation: LayerNorm (§3.1; without its bias when `biases=False`) or
  RMSNorm (Zhang & Sennrich 2019: `x / sqrt(mean(x^2) + ε) · g`), ε = `norm_epsilon`."""
  match cfg.norm_type:
    case "layernorm":
      return nn.LayerNorm(epsilon=cfg.norm_epsilon, use_bias=cfg.biases, dtype=cfg.jnp_dtype,
                          name=name)
    case "rmsnorm":
      return nn.RMSNorm(epsilon=cfg.norm_epsilon, dtype=cfg.jnp_dtype, name=name)
  raise model_config.unknown("norm_type", cfg.norm_type)


def activation(name: model_config.Activation):
  """The feed-forward's nonlinearity (for a gated network, its gate's): ReLU (§3.3), GELU
  `x Φ(x)` (exact, not the tanh approximation), or Swish `x σ(x)` (SiLU)."""
  match name:
    case "relu" | "reglu":
      return nn.relu
    case "gelu" | "geglu":
      return functools.partial(nn.gelu, approximate=False)
    case "swish" | "swiglu":
      return nn.swish
  raise model_config.unknown("activation", name)


class FeedForward(nn.Module):
  """`act(x W1 + b1) W2 + b2` (§3.3, act = ReLU), or gated `(act(x W) ⊙ x V) W2` (Shazeer
  2020, eqs. 5-6: no biases, unless `glu_biases`), of width `cfg.ffn_width`."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:  # [B, L, D] -> [B, L, D]
    cfg = self.cfg
    gated = cfg.activation in model_config.GATED
    dense = functools.partial(nn.Dense, dtype=cfg.jnp_dtype,
                              use_bias=cfg.biases and (cfg.glu_biases or not gated),
                              kernel_init=nn.initializers.xavier_uniform())
    h = activation(cfg.activation)(dense(cfg.ffn_width, name="wi")(x))  # [B, L, F]
    if gated:
      h = h * dense(cfg.ffn_width, name="wi_linear")(x)
    return dense(cfg.d_model, name="wo")(h)


class Sublayer(nn.Module):
  """Residual wrapper: post-LN `LN(x + Drop(f(x)))` (§3.1) or pre-LN `x + Drop(f(LN(x)))`.

  With `has_aux`, `f` returns `(output, aux)` and so does the wrapper (a decoding step's
  attention returns its cache beside its output).
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, fn, *, train: bool, has_aux: bool = False):
    norm = norm_layer(self.cfg, name="norm")
    drop = nn.Dropout(self.cfg.dropout_rate)
    post = post_norm(self.cfg)
    out = fn(x if post else norm(x))
    out, aux = out if has_aux else (out, None)
    y = x + drop(out, deterministic=not train)
    y = norm(y) if post else y
    return (y, aux) if has_aux else y


def post_norm(cfg: ModelConfig) -> bool:
  """True for post-LN sublayers (§3.1), False for pre-LN (with final norms)."""
  match cfg.norm:
    case "post":
      return True
    case "pre":
      return False
  raise model_config.unknown("norm", cfg.norm)


def _attention(cfg: ModelConfig, stack_tables: nn.Module | None = None,
               self_attention: bool = True) -> attention.MultiHeadAttention:
  scheme = position_schemes.get(cfg.positional)
  return attention.MultiHeadAttention(
      num_heads=cfg.num_heads, d_k=cfg.d_k, d_v=cfg.d_v, d_model=cfg.d_model,
      num_kv_heads=cfg.num_kv_heads, biases=cfg.attention_biases, qk_norm=cfg.qk_norm,
      qk_norm_length=cfg.qk_norm_length,
      positions=scheme.self_attention(cfg, stack_tables) if self_attention else None,
      attention_dropout_rate=cfg.attention_dropout_rate,
      attention_impl=cfg.attention_impl, dtype=cfg.jnp_dtype)


class EncoderLayer(nn.Module):
  """Self-attention, then feed-forward, each wrapped in `Sublayer`."""

  cfg: ModelConfig
  stack_tables: nn.Module | None = None  # the position scheme's, shared by the stack

  def setup(self):
    self.self_attention = _attention(self.cfg, self.stack_tables)
    self.attention_block = Sublayer(self.cfg)
    self.ffn = FeedForward(self.cfg)
    self.ffn_block = Sublayer(self.cfg)

  def __call__(self, x, mask, positions, train: bool = False):
    # x: [B, S, D], mask: [B, 1, S, S], positions: [B or 1, S]
    x = self.attention_block(
        x, lambda h: self.self_attention(h, h, mask, positions=positions, train=train),
        train=train)
    return self.ffn_block(x, self.ffn, train=train)


class DecoderLayer(nn.Module):
  """Masked self-attention, attention over the encoder output, then feed-forward.

  `__call__` runs whole target sequences; `step` one token per row of cached decoding.
  """

  cfg: ModelConfig
  stack_tables: nn.Module | None = None  # the position scheme's, shared by the stack

  def setup(self):
    self.self_attention = _attention(self.cfg, self.stack_tables)
    self.self_attention_block = Sublayer(self.cfg)
    self.cross_attention = _attention(self.cfg, self_attention=False)
    self.cross_attention_block = Sublayer(self.cfg)
    self.ffn = FeedForward(self.cfg)
    self.ffn_block = Sublayer(self.cfg)

  def __call__(self, y, encoded, self_mask, cross_mask, positions, train: bool = False):
    # y: [B, T, D], encoded: [B, S, D], self_mask: [B, 1, T, T], cross_mask: [B, 1, T, S],
    # positions: [B or 1, T]
    y = self.self_attention_block(
        y, lambda h: self.self_attention(h, h, self_mask, positions=positions, train=train),
        train=train)
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


def layer_class(cls, cfg: ModelConfig, static_argnums):
  # nn.remat recomputes the layer in the backward pass; `train` stays a Python bool.
  return nn.remat(cls, static_argnums=static_argnums) if cfg.remat else cls
