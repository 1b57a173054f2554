"""The norms and feed-forward networks of transformer/model/layers.py against PyTorch's own
(`torch.nn.RMSNorm`, `torch.nn.LayerNorm`, `torch.nn.functional.gelu` / `silu` / `relu`), and
the 2/3 rule that gives a gated network the ReLU network's parameters (Shazeer 2020)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.export import packages
from transformer.model import layers
from transformer.model.config import ModelConfig

# Against NumPy or PyTorch written from the papers: compiled as users' programs are (conftest).
pytestmark = pytest.mark.reference_numerics

D, F = 16, 24
CFG = ModelConfig(d_model=D, d_ff=F)


@pytest.fixture(scope="module")
def torch():
  return packages.require("torch", "export-test")


def _x(seed=0):
  return np.random.default_rng(seed).normal(size=(2, 5, D)).astype(np.float32) * 3 + 1


def _init(module, x, seed=0):
  """`module`'s initial parameters for inputs shaped as `x`: the draws alone, op by op
  (`tests/support.py`'s `initial_params` says why)."""
  return module.lazy_init(jax.random.key(seed), jax.ShapeDtypeStruct(x.shape, x.dtype))["params"]


def _apply(module, x, **params):
  """`module` on `x`, jitted as in a training step, its parameters initialised and then
  overridden by `params`."""
  return np.asarray(jax.jit(module.apply)({"params": {**_init(module, x), **params}}, x))


@pytest.mark.parametrize("norm_type, biases", [("rmsnorm", True), ("layernorm", True),
                                               ("layernorm", False)])
def test_norms_match_torch(torch, norm_type, biases):
  cfg = dataclasses.replace(CFG, norm_type=norm_type, biases=biases)
  rng = np.random.default_rng(1)
  scale = rng.uniform(0.5, 1.5, D).astype(np.float32)
  bias = rng.normal(size=D).astype(np.float32)
  x = _x()
  if norm_type == "rmsnorm":
    reference = torch.nn.RMSNorm(D, eps=1e-6)
    params = {"scale": scale}
  else:
    reference = torch.nn.LayerNorm(D, eps=1e-6, bias=biases)
    params = {"scale": scale, **({"bias": bias} if biases else {})}
    if biases:
      reference.bias.data = torch.from_numpy(bias)
  reference.weight.data = torch.from_numpy(scale)
  module = layers.norm_layer(cfg)
  got = _apply(module, x, **params)
  assert set(_init(module, x)) == set(params)
  np.testing.assert_allclose(got, reference(torch.from_numpy(x)).detach().numpy(), atol=1e-5)


def _torch_activation(torch, name):
  functional = torch.nn.functional
  return {"relu": functional.relu, "gelu": functional.gelu, "swish": functional.silu,
          "reglu": functional.relu, "geglu": functional.gelu, "swiglu": functional.silu}[name]


@pytest.mark.parametrize("activation, glu_biases", [
    ("relu", False), ("gelu", False), ("swish", False), ("reglu", False), ("geglu", False),
    ("swiglu", False), ("swiglu", True)])
def test_feed_forward_matches_torch(torch, activation, glu_biases):
  """`act(x W1 + b1) W2 + b2` (§3.3), and gated `(act(x W) ⊙ x V) W2` without biases (Shazeer
  2020, eqs. 5-6), or `(act(x W + b) ⊙ (x V + c)) W2 + b2` with `glu_biases`; GELU exact
  (erf)."""
  cfg = dataclasses.replace(CFG, activation=activation, glu_biases=glu_biases)
  module = layers.FeedForward(cfg)
  x = _x(2)
  params = jax.tree.map(lambda p: p + 0.1, _init(module, x, seed=4))  # non-zero biases
  got = np.asarray(jax.jit(module.apply)({"params": params}, x))
  gated = activation in ("reglu", "geglu", "swiglu")
  names = ("wi", "wi_linear", "wo") if gated else ("wi", "wo")
  with_bias = not gated or glu_biases
  assert {k: set(v) for k, v in params.items()} == {
      name: {"kernel", "bias"} if with_bias else {"kernel"} for name in names}

  def dense(name, h):
    out = h @ torch.from_numpy(np.array(params[name]["kernel"]))
    return out + torch.from_numpy(np.array(params[name]["bias"])) if with_bias else out

  h = _torch_activation(torch, activation)(dense("wi", torch.from_numpy(x)))
  if gated:
    h = h * dense("wi_linear", torch.from_numpy(x))
  np.testing.assert_allclose(got, dense("wo", h).numpy(), atol=1e-4, rtol=1e-5)


def _ffn_params(cfg: ModelConfig) -> int:
  """The feed-forward's weight matrices' parameters: what Shazeer's 2/3 rule equalises (his
  networks have no biases)."""
  shapes = jax.eval_shape(lambda: layers.FeedForward(cfg).init(
      jax.random.key(0), jnp.zeros((1, 1, cfg.d_model))))
  return sum(int(np.prod(p.shape)) for p in jax.tree.leaves(shapes) if p.ndim == 2)


@pytest.mark.parametrize("activation", ["reglu", "geglu", "swiglu"])
def test_two_thirds_width_gives_the_relu_networks_parameters(activation):
  base = ModelConfig()  # d_model 512, d_ff 2048
  gated = dataclasses.replace(base, activation=activation, ffn_match_params=True)
  assert gated.ffn_width == 1365  # round(2/3 · 2048)
  assert abs(_ffn_params(gated) / _ffn_params(base) - 1) < 1e-3
  # Without the rule a gated network is half as large again.
  wide = dataclasses.replace(gated, ffn_match_params=False)
  assert wide.ffn_width == 2048 and _ffn_params(wide) > 1.49 * _ffn_params(base)


def test_no_biases_leaves_no_bias_in_the_feed_forward_or_the_norms():
  cfg = dataclasses.replace(CFG, biases=False, activation="swiglu")
  x = np.zeros((1, 2, D), np.float32)
  ffn, norm = _init(layers.FeedForward(cfg), x), _init(layers.norm_layer(cfg), x)
  assert {k: set(v) for k, v in ffn.items()} == {
      "wi": {"kernel"}, "wi_linear": {"kernel"}, "wo": {"kernel"}}
  assert set(norm) == {"scale"}
