"""The registry of position schemes: a new scheme is one registered object that the model, the
config checks and the exports take as they are; and the parameter paths each built-in scheme
gives a model, which checkpoints name, stay where they are."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from configs import base
from tests import support
from tests.model.test_model import _teacher_forced_decoding, _tokens
from transformer.decoding import backend_ops
from transformer.errors import ConfigError
from transformer.export import model_source
from transformer.model import config as model_config
from transformer.model import position_schemes
from transformer.model import positions
from transformer.model import transformer as model_lib
from transformer.run import config_checks

TINY = dict(vocab_size=50, d_model=32, d_ff=64, num_heads=4, d_k=8, d_v=8, num_layers=1,
            max_len=64, dropout_rate=0.0)


class _Slopes(nn.Module):
  """A stack's learned slope per head, shared by its layers."""

  num_heads: int

  @nn.compact
  def __call__(self) -> jax.Array:  # [H]
    return self.param("slope", nn.initializers.constant(0.25), (self.num_heads,))


class _ToyTerms(position_schemes.LayerPositions):
  slopes: nn.Module

  def rotate(self, x, at):
    return positions.rotate(x, at)

  def terms(self, q_positions, k_positions):
    distance = jnp.abs(k_positions[..., None, :] - q_positions[..., :, None])  # [..., T, S]
    bias = -self.slopes()[:, None, None] * distance[..., None, :, :].astype(jnp.float32)
    return positions.AttentionTerms(bias=bias)  # [..., H, T, S]


class _Toy(position_schemes.PositionScheme):
  """RoPE, plus ALiBi with learned slopes per stack, plus a cosine of the position added to
  every embedding channel: each of a scheme's parts at once."""

  name = "toy"

  def embedding(self, cfg, at):
    return jnp.cos(at.astype(jnp.float32))[..., None] * jnp.ones(cfg.d_model)

  def stack_tables(self, cfg, bidirectional):
    return _Slopes(cfg.num_heads, name="toy_slopes")

  def self_attention(self, cfg, stack_tables):
    return _ToyTerms(stack_tables, parent=None)

  def check(self, m):
    if m.d_k % 2:
      raise ConfigError(f"config.model.d_k={m.d_k} must be even for positional='toy'")


def _paths(cfg: model_config.ModelConfig) -> dict[str, tuple[int, ...]]:
  """Each parameter's path and shape, without computing any."""
  model = model_lib.Transformer(cfg)
  shapes = jax.eval_shape(lambda: model_lib.init_params(model, jax.random.key(0)))
  return {"/".join(k.key for k in path): leaf.shape
          for path, leaf in jax.tree_util.tree_leaves_with_path(shapes)}


def test_a_registered_scheme_is_one_object_the_project_takes(monkeypatch):
  monkeypatch.setattr(position_schemes, "SCHEMES", dict(position_schemes.SCHEMES))
  position_schemes.register(_Toy())
  assert model_config.allowed("positional")[-1] == "toy"

  config = base.get_config()
  config.model.positional = "toy"
  config_checks.validate(config)
  config.model.update(d_k=7, d_v=7)
  with pytest.raises(ConfigError, match=r"^config.model.d_k=7 must be even for positional="
                     r"'toy'$"):
    config_checks.validate(config)
  config = base.get_config()
  config.model.positional = "toy"
  with pytest.raises(ConfigError, match=r"positional='toy': Hugging Face's MarianMTModel "
                     r"takes sinusoidal positions only"):
    model_source.check_exportable(config.model, "huggingface")

  cfg = model_config.ModelConfig(**TINY, positional="toy")
  added = set(_paths(cfg)) - set(_paths(model_config.ModelConfig(**TINY)))
  assert added == {"encoder/toy_slopes/slope", "decoder/toy_slopes/slope"}
  model = model_lib.Transformer(cfg)
  params = support.initial_params(model)
  x = _tokens(7, (2, 6), pad_from=[6, 3])
  y = _tokens(8, (2, 5))
  forward = jax.jit(model.apply)  # one traced program for both parameter sets below
  full = forward({"params": params}, x, y)
  cached = _teacher_forced_decoding(model, 5, backend_ops.for_setting("off"))(params, x, y)
  np.testing.assert_allclose(cached, full, atol=1e-5)
  # Its embedding term and its slopes reach the outputs: the scheme is what the model
  # computes (its other parts see distances only, the cosine absolute positions).
  encode = jax.jit(lambda at: model.apply({"params": params}, x, inputs_positions=at,
                                          method="encode"))
  assert not np.allclose(encode(jnp.arange(6)[None]), encode(jnp.arange(6)[None] + 5),
                         atol=1e-3)
  flat = jax.tree.map(lambda p: p, params)
  flat["decoder"]["toy_slopes"]["slope"] = jnp.zeros(4)
  assert not np.allclose(forward({"params": flat}, x, y), full, atol=1e-3)


def test_an_unknown_or_repeated_name_is_refused():
  with pytest.raises(ConfigError, match=r"^config.model.positional='toy' is not one of "
                     r"'sinusoidal', 'learned', 'rope', 't5', 'shaw', 'alibi'$"):
    position_schemes.get("toy")
  with pytest.raises(ValueError, match="'rope' is empty or already registered"):
    position_schemes.register(position_schemes.Rope())


# What each built-in scheme adds to the paper's parameters, by path and shape: checkpoints
# name these, so a trained model restores only while they stay.
PINNED = {
    "sinusoidal": {},
    "learned": {f"{stack}/embedder/position_embedding/embedding": (64, 32)
                for stack in ("encoder", "decoder")},
    "rope": {},
    "t5": {f"{stack}/relative_attention_bias/embedding": (32, 4)
           for stack in ("encoder", "decoder")},
    "shaw": {f"{stack}/layer_0/self_attention/positions/shaw/{table}": (2 * 3 + 1, 8)
             for stack in ("encoder", "decoder") for table in ("keys", "values")},
    "alibi": {},
}


def test_every_schemes_parameter_paths_are_pinned():
  assert tuple(PINNED) == position_schemes.names()
  paper = _paths(model_config.ModelConfig(**TINY))
  for name, added in PINNED.items():
    paths = _paths(model_config.ModelConfig(**TINY, positional=name, shaw_clip=3))
    assert {k: v for k, v in paths.items() if k not in paper} == added, name
    assert set(paper) <= set(paths), name
