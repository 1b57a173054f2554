"""The model's hyperparameters, each declared once: the fields of `ModelConfig`.

A field's name is its `config.model` key, its default the paper's base model (§3, Table 3;
configs/base.py takes them as they are), and its type what it may be: a `Literal` of the
allowed values, or a number with a `Rule` (`PositiveInt`, `Rate`). The config checks
(`transformer.run.config_checks`), the workdir's key lists (`transformer.run.workdir`) and
the model's branches read these declarations, so an architecture field is one line here
(and the code that uses it).

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

Positional = Literal["sinusoidal", "learned"]
Norm = Literal["post", "pre"]
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
  # Implementation switches; none changes the mathematics.
  # 'xla' | 'cudnn': jax.nn.dot_product_attention ('cudnn' insists on cuDNN's kernel).
  attention_impl: Annotated[AttentionImpl, PATH_OR_SPEED] = "reference"
  # Recompute each layer's activations in the backward pass to save memory.
  remat: Annotated[bool, PATH_OR_SPEED] = False
  # Computation dtype, from the top-level `config.dtype`; parameters stay float32.
  dtype: Annotated[Dtype, TOP_LEVEL] = "float32"

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


def allowed(field: str) -> tuple[Any, ...]:
  """The values a `Literal` field of `ModelConfig` may take, as declared."""
  return typing.get_args(typing.get_type_hints(ModelConfig)[field])


def not_one_of(key: str, value, choices) -> ConfigError:
  """The error for `value` at dotted `key` outside `choices`, as the config checks word it."""
  return ConfigError(f"config.{key}={value!r} is not one of {', '.join(map(repr, choices))}")


def unknown(field: str, value) -> ConfigError:
  """The error a model branch raises for a value of `ModelConfig.<field>` it has no case for
  (`config_checks.validate` stops such a config before a model is built)."""
  return not_one_of(f"model.{field}", value, allowed(field))
