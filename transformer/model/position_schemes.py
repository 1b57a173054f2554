"""Each position scheme is one object, registered once: `config.model.positional` names one.

Glossary: B batch, T query length, S key length, H heads, K d_k, V_ d_v, D d_model.

A `PositionScheme` answers everything the project asks about where positions enter:

- the model: the term added to the scaled embeddings (`embedding`), the parameters a stack's
  self-attention layers share (`stack_tables`), and each self-attention layer's
  `LayerPositions`, which rotates its queries and keys and gives the terms added to its
  logits, keys and values (`self_attention`); cross-attention sees no positions;
- the config checks between keys (`check`);
- the exports: the table CTranslate2 adds to the embeddings (`position_table`), its spec's
  options and weights (`ctranslate2_options`, `ctranslate2_self_attention`), or a refusal
  (`check_export`, which names Hugging Face's Marian too);
- what `transformer.research.inspection` draws (`encodings`).

The base class adds nothing anywhere; a scheme overrides what it has. `register` adds a
scheme; `names()` are the values `config.model.positional` takes (`ModelConfig` reads them
here), in registration order. The mathematics of each paper is in `positions.py`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from transformer.errors import ConfigError
from transformer.model import positions as positions_lib


class LayerPositions(nn.Module):
  """What positions do in one self-attention layer (`attention.MultiHeadAttention`): by
  default nothing; a scheme's subclass overrides `rotate` or `terms`."""

  def rotate(self, x: jax.Array, positions: jax.Array) -> jax.Array:
    """Queries or keys `[..., K]` at `positions` (broadcastable to `x.shape[:-1]`)."""
    del positions
    return x

  def terms(self, q_positions: jax.Array, k_positions: jax.Array
            ) -> positions_lib.AttentionTerms:
    """What is added to the attention of queries at `[..., T]` over keys at `[..., S]`."""
    del q_positions, k_positions
    return positions_lib.AttentionTerms()


class PositionScheme:
  """One value of `config.model.positional`; every method's default adds nothing.

  `cfg` is the model's `ModelConfig`, `m` a `config.model` (either serves the checks); they
  go untyped here because config.py reads this registry for the names it allows.
  """

  name: str = ""
  marian: bool = False  # Hugging Face's MarianMTModel computes it (its sinusoids)
  # Positions from `max_len` on have no encoding (a learned table's rows end there), so
  # translation truncates longer sources.
  bounded: bool = False

  def embedding(self, cfg, positions: jax.Array) -> jax.Array | None:
    """The term added to the scaled token embeddings at integer `positions [...]`:
    `[..., D]`, or None. Called inside the stack's embedder, which owns what it creates."""
    del cfg, positions
    return None

  def stack_tables(self, cfg, bidirectional: bool) -> nn.Module | None:
    """Parameters shared by a stack's self-attention layers, created in the stack
    (`bidirectional` in the encoder), or None."""
    del cfg, bidirectional
    return None

  def self_attention(self, cfg, stack_tables: nn.Module | None) -> LayerPositions | None:
    """A self-attention layer's `LayerPositions` (unbound: the layer adopts it as its child
    'positions'), or None where positions do not enter attention."""
    del cfg, stack_tables
    return None

  def check(self, m) -> None:
    """Raises a one-line `ConfigError` for `config.model` values m that cannot work with
    the scheme."""

  def check_export(self, fmt: str) -> None:
    """Raises a one-line `ConfigError` when export format `fmt` ('ctranslate2' or
    'huggingface') cannot express the scheme."""
    if fmt == "huggingface" and not self.marian:
      raise ConfigError(f"config.model.positional={self.name!r}: Hugging Face's MarianMTModel "
                        "takes sinusoidal positions only; export this model with "
                        "--format=ctranslate2")

  def ctranslate2_options(self) -> dict[str, Any]:
    """Options of CTranslate2's encoder and decoder specs; {}: its defaults, no positions
    inside attention."""
    return {}

  def ctranslate2_self_attention(self, spec, attention: dict, stack: dict) -> None:
    """Sets a self-attention layer's position weights in CTranslate2's `spec` from the
    layer's parameters `attention` and its stack's `stack`."""
    del spec, attention, stack

  def position_table(self, cfg, params: dict, side: str, rows: int) -> np.ndarray:
    """The float32 `[rows, D]` encodings added to the scaled embeddings on `side`
    ('encoder' or 'decoder'), as CTranslate2 takes them: zeros where nothing is added."""
    del params, side
    return np.zeros((rows, cfg.d_model), np.float32)

  def encodings(self, cfg, params: dict, length: int) -> dict[str, np.ndarray]:
    """name -> `[length, D]`: the tables added to the embeddings, to be drawn; a stack's own
    is named '<scheme>, <stack>'."""
    del cfg, params, length
    return {}


SCHEMES: dict[str, PositionScheme] = {}


def register(scheme: PositionScheme) -> PositionScheme:
  """Adds `scheme` under its name, which `config.model.positional` then takes."""
  if not scheme.name or scheme.name in SCHEMES:
    raise ValueError(f"position scheme name {scheme.name!r} is empty or already registered")
  SCHEMES[scheme.name] = scheme
  return scheme


def names() -> tuple[str, ...]:
  """The registered schemes' names, in registration order."""
  return tuple(SCHEMES)


def get(name: str) -> PositionScheme:
  """The scheme `config.model.positional=name`, or the one-line `ConfigError` naming the
  registered ones."""
  if name not in SCHEMES:
    raise ConfigError(f"config.model.positional={name!r} is not one of "
                      f"{', '.join(map(repr, SCHEMES))}")
  return SCHEMES[name]


class Sinusoidal(PositionScheme):
  """The paper's (§3.5): `sinusoidal_encoding` added to the embeddings; no parameters."""

  name = "sinusoidal"
  marian = True

  def embedding(self, cfg, positions):
    return positions_lib.sinusoidal_encoding(positions, cfg.d_model)

  def check(self, m):
    if m.d_model % 2:
      raise ConfigError(f"config.model.d_model={m.d_model} must be even for sinusoidal "
                        "positions (sin and cos channels alternate, §3.5)")

  def position_table(self, cfg, params, side, rows):
    return np.asarray(positions_lib.sinusoidal_encoding(np.arange(rows), cfg.d_model),
                      np.float32)

  def encodings(self, cfg, params, length):
    return {"sinusoidal": np.asarray(positions_lib.sinusoidal_encoding(jnp.arange(length),
                                                                       cfg.d_model))}


class Learned(PositionScheme):
  """Table 3 row (E): a learned vector per position (`max_len` of them) added to the
  embeddings, one table per stack (`<stack>/embedder/position_embedding`)."""

  name = "learned"
  bounded = True

  def embedding(self, cfg, positions):
    return nn.Embed(cfg.max_len, cfg.d_model, embedding_init=nn.initializers.normal(0.02),
                    name="position_embedding")(positions)

  def position_table(self, cfg, params, side, rows):
    del rows  # the table has its own, max_len
    return params[side]["embedder"]["position_embedding"]["embedding"]

  def encodings(self, cfg, params, length):
    return {f"learned, {stack}": np.asarray(
        params[stack]["embedder"]["position_embedding"]["embedding"][:length])
            for stack in ("encoder", "decoder")}


class Rotary(LayerPositions):
  """RoPE in a layer: queries and keys rotated by their positions (`positions.rotate`)."""

  def rotate(self, x, positions):
    return positions_lib.rotate(x, positions)


class Rope(PositionScheme):
  """Su et al. 2021 (RoFormer): self-attention queries and keys rotated by their positions."""

  name = "rope"

  def self_attention(self, cfg, stack_tables):
    return Rotary(parent=None)

  def check(self, m):
    if m.d_k % 2:
      raise ConfigError(f"config.model.d_k={m.d_k} must be even for positional='rope' "
                        "(channels rotate in pairs)")

  def ctranslate2_options(self):
    # 0: every channel of a head rotates, in interleaved pairs (Su et al.), base 10000.
    return dict(rotary_dim=0, rotary_interleave=True, rotary_base=positions_lib.ROPE_BASE)


class T5Terms(LayerPositions):
  """T5 in a layer: the stack's bias on the logits."""

  bias: nn.Module  # the stack's `positions.T5Bias`

  def terms(self, q_positions, k_positions):
    return positions_lib.AttentionTerms(bias=self.bias(q_positions, k_positions))


class T5(PositionScheme):
  """Raffel et al. 2020: a learned scalar per head and distance bucket on the
  self-attention logits, one table per stack (`<stack>/relative_attention_bias`)."""

  name = "t5"

  def stack_tables(self, cfg, bidirectional):
    return positions_lib.T5Bias(cfg.num_heads, bidirectional, name="relative_attention_bias")

  def self_attention(self, cfg, stack_tables):
    return T5Terms(stack_tables, parent=None)

  def ctranslate2_options(self):
    return dict(relative_attention_bias=True)

  def ctranslate2_self_attention(self, spec, attention, stack):
    # One table [buckets, H] per stack, given to each of its layers.
    spec.relative_attention_bias = stack["relative_attention_bias"]["embedding"]
    spec.relative_attention_max_distance = np.dtype("int32").type(
        positions_lib.T5_MAX_DISTANCE)


class ShawTerms(LayerPositions):
  """Shaw et al. in a layer: its own relative keys and values (`shaw`)."""

  cfg: Any  # ModelConfig: shaw_clip, d_k, d_v, dtype

  def setup(self):
    cfg = self.cfg
    self.shaw = positions_lib.ShawTables(cfg.shaw_clip, cfg.d_k, cfg.d_v, cfg.jnp_dtype)

  def terms(self, q_positions, k_positions):
    keys, values = self.shaw(q_positions, k_positions)
    return positions_lib.AttentionTerms(keys=keys, values=values)


class Shaw(PositionScheme):
  """Shaw et al. 2018: learned vectors per clipped distance added to the self-attention keys
  and values, a pair of tables per layer (`.../self_attention/positions/shaw`)."""

  name = "shaw"

  def self_attention(self, cfg, stack_tables):
    self.check(cfg)  # the model refuses what the config checks refuse
    return ShawTerms(cfg, parent=None)

  def check(self, m):
    if m.attention_impl != "reference":
      raise ConfigError(f"config.model.positional='shaw' needs attention_impl='reference' "
                        f"(got {m.attention_impl!r}): jax.nn.dot_product_attention takes no "
                        "relative keys or values")

  def ctranslate2_options(self):
    return dict(relative_position=True)

  def ctranslate2_self_attention(self, spec, attention, stack):
    spec.relative_position_keys = attention["positions"]["shaw"]["keys"]  # [2k + 1, K]
    spec.relative_position_values = attention["positions"]["shaw"]["values"]  # [2k + 1, V_]


class AlibiTerms(LayerPositions):
  """ALiBi in a layer: the fixed distance penalty on the logits."""

  num_heads: int

  def terms(self, q_positions, k_positions):
    return positions_lib.AttentionTerms(
        bias=positions_lib.alibi_bias(q_positions, k_positions, self.num_heads))


class Alibi(PositionScheme):
  """Press et al. 2022: a fixed penalty, a head's slope times the distance, on the
  self-attention logits; no parameters."""

  name = "alibi"

  def self_attention(self, cfg, stack_tables):
    return AlibiTerms(cfg.num_heads, parent=None)

  def check_export(self, fmt):
    raise ConfigError(f"config.model.positional='alibi': {fmt} has no ALiBi in its encoder; "
                      "this model cannot be exported")


for _scheme in (Sinusoidal(), Learned(), Rope(), T5(), Shaw(), Alibi()):
  register(_scheme)
