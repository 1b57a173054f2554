"""The model's hyperparameters, each declared once: the fields of `ModelConfig`.

A field's name is its `config.model` key, its default the paper's base model (§3, Table 3;
configs/base.py takes them as they are), and its type what it may be: a `Literal` of the
allowed values (or `Registered`, for a registry's names), or a number with a `Rule`
(`PositiveInt`, `Rate`). The config checks (`transformer.run.config_checks`), the workdir's
key lists (`transformer.run.workdir`) and the model's branches read these declarations, so an
architecture field is one line here (and the code that uses it).

Markers on a field's type say what it is to a trained model: a field is part of the model's
identity (a --config for a trained workdir may not change it) unless marked `TRAINING_ONLY`
(read by training alone: the trained model is the same with any value) or `PATH_OR_SPEED`
(changes how, not what, is computed: it may change when a run resumes). `TOP_LEVEL` marks a
field set from the top-level config key of the same name rather than from `config.model`.
`transformer.run.schema` declares the other config keys in the same terms.

Imports no JAX, so a config file can build `config.model` from it.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, Callable, Literal

from transformer.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Rule:
  """What a value must satisfy beyond its type, and the error's words for it."""

  holds: Callable[[Any], bool]
  says: str  # completes "config.KEY=VALUE ..."


@dataclasses.dataclass(frozen=True)
class Registered:
  """A key whose allowed values are a registry's names, read when they are asked for (so a
  value registered after this module is imported is allowed)."""

  names: Callable[[], tuple[str, ...]]


@dataclasses.dataclass(frozen=True)
class Marker:
  """A key's role for a trained workdir (see the module docstring)."""

  name: str


IDENTITY = Marker("identity")  # part of what a trained model is (keys outside config.model)
TRAINING_ONLY = Marker("training only")
PATH_OR_SPEED = Marker("path or speed")
TOP_LEVEL = Marker("top level")


def is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


PositiveInt = Annotated[int, Rule(lambda v: is_int(v) and v > 0, "must be a positive integer")]
NonNegativeInt = Annotated[int, Rule(lambda v: is_int(v) and v >= 0, "must be an integer >= 0")]
Rate = Annotated[float, Rule(lambda v: is_number(v) and 0 <= v < 1, "must be in [0, 1)")]
AtLeastTwo = Annotated[int, Rule(lambda v: is_int(v) and v >= 2, "must be an integer >= 2")]
PositiveFloat = Annotated[float, Rule(lambda v: is_number(v) and v > 0,
                                      "must be a positive number")]


def _position_schemes() -> tuple[str, ...]:
  from transformer.model import position_schemes  # here, so that configs import no JAX

  return position_schemes.names()


# The registered position schemes (transformer/model/position_schemes.py): 'sinusoidal' and
# 'learned' are added to the embeddings (§3.5); 'rope', 't5', 'shaw' and 'alibi' enter
# self-attention only, and nothing is added.
Positional = Annotated[str, Registered(_position_schemes)]
Norm = Literal["post", "pre"]
NormType = Literal["layernorm", "rmsnorm"]
# The gated ones are `act(x W) * (x V)` (Shazeer 2020): ReLU, GELU, Swish as the gate.
Activation = Literal["relu", "gelu", "swish", "reglu", "geglu", "swiglu"]
GATED = ("reglu", "geglu", "swiglu")
# Which of the source embedding, the target embedding and the pre-softmax projection share a
# matrix: all three (§3.4), the target's two (Press & Wolf 2017), or none.
Tying = Literal["three_way", "two_way", "none"]
QKNorm = Literal["none", "l2", "rms"]
AttentionImpl = Literal["reference", "xla", "cudnn"]
Dtype = Literal["float32", "bfloat16", "float16"]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters, with the paper's names; defaults are the base model (§3, Table 3)."""

  vocab_size: PositiveInt = 37000  # shared source/target vocabulary (§5.1)
  d_model: PositiveInt = 512
  d_ff: PositiveInt = 2048
  num_heads: PositiveInt = 8
  d_k: PositiveInt = 64  # set apart from d_model / num_heads for Table 3 row (B)
  d_v: PositiveInt = 64
  num_layers: PositiveInt = 6  # N, in each stack
  # P_drop on sublayer outputs and embedding sums (§5.4).
  dropout_rate: Annotated[Rate, TRAINING_ONLY] = 0.1
  # Departure if > 0: the paper applies no dropout to attention weights (§5.4).
  attention_dropout_rate: Annotated[Rate, TRAINING_ONLY] = 0.0
  # 'learned' is Table 3 row (E); the paper's model uses sinusoids (§3.5).
  positional: Positional = "sinusoidal"
  # 'pre' departs from §3.1 (post-LN): x + Dropout(Sublayer(LayerNorm(x))), final LayerNorms
  # (Xiong et al. 2020).
  norm: Norm = "post"
  # Positions the model can encode (the learned table's size; the decoding cache's bound).
  max_len: PositiveInt = 512

  # Departures that came after the paper (configs/modern.py names one row for each).
  # 'rmsnorm' departs from §3.1's LayerNorm: RMSNorm, no mean and no bias (Zhang & Sennrich
  # 2019).
  norm_type: NormType = "layernorm"
  # Not 'relu' departs from §3.3: GELU (Hendrycks & Gimpel 2016), Swish/SiLU (Ramachandran et
  # al. 2017), or gated ReGLU/GeGLU/SwiGLU (Shazeer 2020).
  activation: Activation = "relu"
  # True: a gated feed-forward's width is round(2/3 · d_ff), so that its three matrices hold
  # the parameters of the ReLU network's two (Shazeer 2020, §2). Gated activations only.
  ffn_match_params: bool = False
  # A gated feed-forward is Shazeer 2020's `(act(x W) ⊙ x V) W2`, without biases; True gives
  # W, V and W2 biases (with `biases`), as workdirs trained before this key have them.
  glu_biases: bool = False
  # Shaw et al. 2018's clipping distance k for positional='shaw': 2k + 1 learned relative
  # keys and values per self-attention layer.
  shaw_clip: PositiveInt = 16
  # Key/value heads: 0 = num_heads, the paper's multi-head attention (§3.2.2); 1 = multi-query
  # (Shazeer 2019); G dividing num_heads = grouped-query (Ainslie et al. 2023).
  num_kv_heads: NonNegativeInt = 0
  # Not 'none' departs from §3.2.1: each head's queries and keys normalised before their
  # product. 'l2' is Henry et al. 2020's QKNorm: unit length, and one learned scale g per layer
  # in place of 1/sqrt(d_k), initialised to log2(L^2 - L) for L = `qk_norm_length`. 'rms' is
  # the RMSNorm form of Dehghani et al. 2023's (theirs is LayerNorm): a learned scale per
  # channel, 1/sqrt(d_k) kept.
  qk_norm: QKNorm = "none"
  # Henry et al.'s L (qk_norm='l2'): the 97.5th percentile of the training sentences' lengths
  # in tokens. 64 is not measured on WMT 2014 here; configs/modern_tatoeba.py sets Tatoeba's.
  qk_norm_length: AtLeastTwo = 64
  # Not 'three_way' departs from §3.4's one shared matrix (Press & Wolf 2017).
  tie_embeddings: Tying = "three_way"
  # False departs from §3.3 and LayerNorm: no bias in the feed-forward layers or the norms
  # (Chowdhery et al. 2022, PaLM). Attention projections have none either way (§3.2.2).
  biases: bool = True
  # What Marian's Transformer (and so every OPUS-MT model, `transformer.export.from_marian`)
  # has beside the paper's: True departs from §3.2.2's `Q W_i^Q` with a bias on each query,
  # key, value and output projection of attention, and from §3.4's pre-softmax projection
  # with a bias on each logit (Marian's `final_logits_bias`).
  attention_biases: bool = False
  output_bias: bool = False
  # ε of every LayerNorm / RMSNorm (§3.1 does not state it): 1e-6 as Tensor2Tensor's; Marian's
  # (PyTorch's LayerNorm) is 1e-5.
  norm_epsilon: PositiveFloat = 1e-6
  # Implementation switches; none changes the mathematics.
  # 'xla' | 'cudnn': jax.nn.dot_product_attention ('cudnn' insists on cuDNN's kernel).
  attention_impl: Annotated[AttentionImpl, PATH_OR_SPEED] = "reference"
  # Recompute each layer's activations in the backward pass to save memory.
  remat: Annotated[bool, PATH_OR_SPEED] = False
  # Computation dtype, from the top-level `config.dtype`; parameters stay float32.
  dtype: Annotated[Dtype, TOP_LEVEL] = "float32"

  @property
  def kv_heads(self) -> int:
    """Key/value heads: `num_kv_heads`, or one per query head when it is 0."""
    return self.num_kv_heads or self.num_heads

  @property
  def ffn_width(self) -> int:
    """The feed-forward's hidden width: d_ff, or round(2/3 · d_ff) for a gated network with
    `ffn_match_params`."""
    if self.ffn_match_params and self.activation in GATED:
      return round(2 * self.d_ff / 3)
    return self.d_ff

  @property
  def jnp_dtype(self):
    import jax.numpy as jnp  # here, so that configs can import this module without JAX

    return jnp.dtype(self.dtype)


def config_fields() -> tuple[str, ...]:
  """The fields of `ModelConfig` that are `config.model` keys: all but the `TOP_LEVEL` ones."""
  hints = typing.get_type_hints(ModelConfig, include_extras=True)
  return tuple(f.name for f in dataclasses.fields(ModelConfig)
               if TOP_LEVEL not in getattr(hints[f.name], "__metadata__", ()))


def defaults() -> dict[str, Any]:
  """`config.model` as the paper's base model has it: each config field's default."""
  base = ModelConfig()
  return {name: getattr(base, name) for name in config_fields()}


def choices(hint) -> tuple[Any, ...] | None:
  """The values a key of type `hint` may take: a `Literal`'s, or the names of a
  `Registered` registry; None for a key of another type."""
  if typing.get_origin(hint) is Annotated:
    registered = [m for m in hint.__metadata__ if isinstance(m, Registered)]
    if registered:
      return registered[0].names()
    hint = hint.__origin__
  return typing.get_args(hint) if typing.get_origin(hint) is Literal else None


def allowed(field: str) -> tuple[Any, ...]:
  """The values a `Literal` (or `Registered`) field of `ModelConfig` may take."""
  return choices(typing.get_type_hints(ModelConfig, include_extras=True)[field])


def not_one_of(key: str, value, choices) -> ConfigError:
  """The error for `value` at dotted `key` outside `choices`, as the config checks word it."""
  return ConfigError(f"config.{key}={value!r} is not one of {', '.join(map(repr, choices))}")


def unknown(field: str, value) -> ConfigError:
  """The error a model branch raises for a value of `ModelConfig.<field>` it has no case for
  (`config_checks.validate` stops such a config before a model is built)."""
  return not_one_of(f"model.{field}", value, allowed(field))
