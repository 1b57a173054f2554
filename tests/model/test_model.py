"""The model's paper behaviour: masks, positions, tied embeddings, cached decoding."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from tests import support
from transformer.decoding import backend_ops
from transformer.decoding import translate
from transformer.errors import ConfigError
from transformer.model import attention
from transformer.model import positions
from transformer.model import transformer as model_lib

# One layer: each switch acts inside a layer alike, and a layer's programs take most of the
# compile time. The paper's model decodes with two (`test_cached_decoding_matches_full_forward`),
# where one layer's cache read as another's would show.
TINY = dict(vocab_size=50, d_model=32, d_ff=64, num_heads=4, d_k=8, d_v=8, num_layers=1,
            dropout_rate=0.1, max_len=64)


def _config(cpu_workarounds="auto", **overrides):
  return ml_collections.ConfigDict({"model": dict(TINY, **overrides), "dtype": "float32",
                                    "cpu_workarounds": cpu_workarounds})


def _build(**overrides):
  model = model_lib.build_model(_config(**overrides))
  return model, _init(model.cfg)


@functools.cache  # parameters depend only on the architecture, not on how it runs
def _init(cfg):
  model = model_lib.Transformer(cfg)
  return support.initial_params(model)


@functools.cache  # one compiled program per model and method
def _jit(model, method="__call__"):
  return jax.jit(functools.partial(model.apply, method=method), static_argnames="train")


def _tokens(seed, shape, pad_from=None):
  x = np.random.default_rng(seed).integers(3, 50, shape).astype(np.int32)
  if pad_from is not None:
    for row, start in enumerate(pad_from):
      x[row, start:] = 0
  return jnp.asarray(x)


VARIANTS = [{}, {"norm": "pre"}, {"positional": "learned"}]


def test_the_tests_initial_parameters_are_the_librarys_jitted_init():
  """`support.initial_params` (`init_params` op by op, as this module's `_init`) gives what
  flax's whole `init` gives jitted, up to XLA fusing the normal draws' arithmetic
  differently."""
  model = model_lib.build_model(_config())
  tokens = jnp.ones((1, 8), jnp.int32)
  jitted = jax.jit(lambda: model.init(jax.random.key(0), tokens, tokens)["params"])()
  op_by_op = support.initial_params(model)
  assert jax.tree.structure(op_by_op) == jax.tree.structure(jitted)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               op_by_op, jitted)
  other_seed = support.initial_params(model, seed=1)
  assert not np.allclose(other_seed["shared_embedding"]["embedding"],
                         jitted["shared_embedding"]["embedding"])


def test_init_params_draws_without_the_forward_pass():
  """`init_params` runs the draws alone: no matrix product is even traced into its program."""
  model = model_lib.build_model(_config())
  traced = str(jax.make_jaxpr(lambda key: model_lib.init_params(model, key))(jax.random.key(0)))
  assert "dot_general" not in traced and "random_bits" in traced
  tokens = jnp.ones((1, 8), jnp.int32)
  whole = str(jax.make_jaxpr(lambda key: model.init(key, tokens, tokens))(jax.random.key(0)))
  assert "dot_general" in whole  # flax's init runs the forward pass


@pytest.mark.parametrize("overrides", VARIANTS, ids=str)
def test_future_targets_never_change_earlier_logits(overrides):
  model, params = _build(**overrides)
  # The shapes of `test_extra_padding_never_changes_outputs`' unpadded pass: one program.
  x, y = _tokens(0, (2, 6)), _tokens(1, (2, 5))
  y2 = y.at[:, 3:].set(_tokens(2, (2, 2)))
  a = _jit(model)({"params": params}, x, y)
  b = _jit(model)({"params": params}, x, y2)
  # Targets are shifted right: logits at position t see targets < t, so 0..3 are unchanged.
  np.testing.assert_allclose(a[:, :4], b[:, :4], atol=1e-5)
  assert not np.allclose(a[:, 4:], b[:, 4:], atol=1e-3)


@pytest.mark.parametrize("overrides", VARIANTS, ids=str)
def test_extra_padding_never_changes_outputs(overrides):
  model, params = _build(**overrides)
  x, y = _tokens(3, (2, 6), pad_from=[6, 4]), _tokens(4, (2, 5), pad_from=[5, 3])
  xp = jnp.pad(x, ((0, 0), (0, 4)))
  yp = jnp.pad(y, ((0, 0), (0, 3)))
  a = _jit(model)({"params": params}, x, y)
  b = _jit(model)({"params": params}, xp, yp)
  valid = np.asarray(y != 0)
  np.testing.assert_allclose(np.asarray(a)[valid], np.asarray(b)[:, :5][valid], atol=1e-5)


def _sinusoids(pos, d):
  """§3.5 in NumPy: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(the same)."""
  angles = np.asarray(pos, np.float64)[:, None] / 10000 ** (np.arange(0, d, 2) / d)
  pe = np.empty((len(pos), d))
  pe[:, 0::2], pe[:, 1::2] = np.sin(angles), np.cos(angles)
  return pe


@pytest.mark.reference_numerics
def test_sinusoidal_encoding_matches_formula():
  pos = np.arange(50)
  pe = jax.jit(positions.sinusoidal_encoding, static_argnums=1)(pos, 16)
  np.testing.assert_allclose(pe, _sinusoids(pos, 16), atol=1e-5)


@pytest.mark.reference_numerics
def test_embeddings_are_tied_and_scaled():
  # The parameters of the other tests' model (`_init` keeps them): drawn again here, op by op
  # at XLA's defaults, every draw would compile anew.
  model, params = _build()
  assert set(params) == {"shared_embedding", "encoder", "decoder"}
  # One [V, D] matrix and no other parameter with a vocabulary-sized axis: the source and
  # target embeddings and the pre-softmax projection share it (§3.4).
  big = [p for p, x in jax.tree_util.tree_leaves_with_path(params) if 50 in np.shape(x)]
  assert len(big) == 1
  # With no layers, the encoder output is the embedding × sqrt(d_model) plus positions.
  bare = model_lib.Transformer(model_lib.ModelConfig(**dict(TINY, num_layers=0)))
  x = np.array([[5, 7, 1]])
  out = _jit(bare, "encode")({"params": {k: params[k] for k in ("shared_embedding",)}}, x)
  emb = np.asarray(params["shared_embedding"]["embedding"])
  expected = emb[x[0]] * np.sqrt(32) + _sinusoids(np.arange(3), 32)
  np.testing.assert_allclose(out[0], expected, atol=1e-5)


def test_dk_and_dv_are_independent():
  model = model_lib.build_model(_config(d_k=3, d_v=5))
  # The shapes `init_params` gives, without drawing (or compiling) anything.
  params = jax.eval_shape(lambda: model_lib.init_params(model, jax.random.key(0)))
  attn = params["encoder"]["layer_0"]["self_attention"]
  assert attn["query"]["kernel"].shape == (32, 4, 3)
  assert attn["value"]["kernel"].shape == (32, 4, 5)
  assert attn["out"]["kernel"].shape == (4, 5, 32)


def test_dropout_is_active_only_in_training():
  model, params = _build()
  x, y = _tokens(5, (2, 6)), _tokens(6, (2, 5))
  det = [_jit(model)({"params": params}, x, y) for _ in range(2)]
  np.testing.assert_array_equal(det[0], det[1])
  a = _jit(model)({"params": params}, x, y, train=True, rngs={"dropout": jax.random.key(1)})
  b = _jit(model)({"params": params}, x, y, train=True, rngs={"dropout": jax.random.key(2)})
  assert not np.allclose(a, b)


@functools.cache  # one compiled program per model, length and ops
def _teacher_forced_decoding(model, steps, ops):
  """Jitted `(params, inputs [B, S], targets [B, steps]) -> logits [B, steps, V]`: the cache
  built from the encoder output by the decoding side (`translate.init_cache`, its reads as
  `ops` says), then one `decode_step` per target token, fed the targets shifted right."""

  @jax.jit
  def run(params, inputs, targets):
    cache = translate.init_cache(model, params, inputs, steps, ops=ops)

    def step(cache, ids):  # ids: [B]
      logits, cache = model.apply({"params": params}, ids[:, None], cache,
                                  method="decode_step")
      return cache, logits

    _, logits = jax.lax.scan(step, cache, model_lib.shift_right(targets).T)
    return logits.swapaxes(0, 1)

  return run


# Position schemes that enter self-attention (transformer/model/position_schemes.py).
RELATIVE = ("rope", "t5", "shaw", "alibi")
# Every other switch of configs/modern.py at once.
MODERN = {"norm": "pre", "norm_type": "rmsnorm", "activation": "swiglu", "ffn_match_params": True,
          "qk_norm": "l2", "tie_embeddings": "none", "biases": False}


# `config.cpu_workarounds` changes how steps read the self-attention cache: both settings
# with each attention implementation; the other variants with one each. The relative position
# schemes must score each step at its absolute position against the positions in the cache
# (RoPE and T5 alone are in the rows combining them with other switches).
@pytest.mark.parametrize("overrides, cpu_workarounds", [
    pytest.param({"num_layers": 2}, "on", marks=pytest.mark.reference_numerics),
    pytest.param({"num_layers": 2}, "off", marks=pytest.mark.reference_numerics),
    ({"attention_impl": "xla"}, "on"), ({"attention_impl": "xla"}, "off"),
    ({"norm": "pre"}, "on"), ({"positional": "learned"}, "on"), ({"remat": True}, "off"),
    ({"positional": "shaw"}, "on"), ({"positional": "shaw"}, "off"),
    ({"positional": "alibi"}, "on"),
    ({"positional": "alibi", "num_kv_heads": 2, "attention_impl": "xla"}, "off"),
    ({"positional": "t5", "num_kv_heads": 1, "remat": True}, "on"),
    ({**MODERN, "positional": "rope"}, "on"),
    ({**MODERN, "positional": "rope", "qk_norm": "rms"}, "off")],
    ids=str)
def test_cached_decoding_matches_full_forward(overrides, cpu_workarounds):
  """Each step's logits from the cache equal the full forward pass's at its position, for 20
  steps: past the first prefix length that steps read with the CPU workarounds (16)."""
  model, params = _build(**overrides)
  x = _tokens(7, (2, 6), pad_from=[6, 3])
  y = _tokens(8, (2, 20))
  full = _jit(model)({"params": params}, x, y)
  ops = backend_ops.for_setting(cpu_workarounds)
  cached = _teacher_forced_decoding(model, 20, ops)(params, x, y)
  np.testing.assert_allclose(cached, full, atol=1e-5)


@pytest.mark.parametrize("positional", ["sinusoidal", *RELATIVE])
def test_relative_schemes_see_distances_only(positional):
  """Shifting every source position by 5 leaves the encoder's output unchanged when positions
  enter self-attention as distances, and changes it with the paper's sinusoids."""
  model, params = _build(positional=positional)
  x = _tokens(10, (2, 6), pad_from=[6, 4])
  at = jnp.arange(6)[None]
  a = _jit(model, "encode")({"params": params}, x, inputs_positions=at)
  b = _jit(model, "encode")({"params": params}, x, inputs_positions=at + 5)
  if positional == "sinusoidal":
    assert not np.allclose(a, b, atol=1e-3)
  else:
    np.testing.assert_allclose(a, b, atol=2e-5)


@pytest.mark.parametrize("positional", RELATIVE)
def test_a_packed_row_equals_its_pairs_alone(positional):
  """Two pairs packed in one row, positions restarting at each, give each pair's logits alone
  (each pair in a row of its own, padded): the relative terms of one pair's tokens never
  reach the other's."""
  model, params = _build(positional=positional)
  x1, y1, x2, y2 = _tokens(11, (1, 4)), _tokens(12, (1, 3)), _tokens(13, (1, 5)), _tokens(14, (1, 6))
  packed = dict(inputs=jnp.concatenate([x1, x2], 1), targets=jnp.concatenate([y1, y2], 1),
                inputs_positions=jnp.array([[0, 1, 2, 3, 0, 1, 2, 3, 4]]),
                targets_positions=jnp.array([[0, 1, 2, 0, 1, 2, 3, 4, 5]]),
                inputs_segmentation=jnp.array([[1] * 4 + [2] * 5]),
                targets_segmentation=jnp.array([[1] * 3 + [2] * 6]))
  together = _jit(model)({"params": params}, packed.pop("inputs"), packed.pop("targets"),
                         **packed)
  # Both pairs alone in one batch, padded to the shapes of the full pass of
  # `test_cached_decoding_matches_full_forward`: one program, shared with it.
  alone = np.asarray(_jit(model)({"params": params},
                                 jnp.concatenate([jnp.pad(x1, ((0, 0), (0, 2))),
                                                  jnp.pad(x2, ((0, 0), (0, 1)))]),
                                 jnp.concatenate([jnp.pad(y1, ((0, 0), (0, 17))),
                                                  jnp.pad(y2, ((0, 0), (0, 14)))])))
  np.testing.assert_allclose(together[:, :3], alone[:1, :3], atol=2e-5)
  np.testing.assert_allclose(together[:, 3:], alone[1:, :6], atol=2e-5)


@pytest.mark.parametrize("tying, matrices", [
    ("two_way", {"source_embedding", "target_embedding"}),
    ("none", {"source_embedding", "target_embedding", "output_projection"})])
def test_untied_embeddings_have_their_own_matrices(tying, matrices):
  """Two-way tying (Press & Wolf 2017): the source embedding apart, the target embedding also
  the output projection; no tying: three matrices."""
  model, params = _build(tie_embeddings=tying)
  assert set(params) == matrices | {"encoder", "decoder"}
  hidden = jax.random.normal(jax.random.key(0), (3, 32))
  logits = _jit(model, "logits")({"params": params}, hidden)
  output = (params["target_embedding"]["embedding"].T if tying == "two_way"
            else params["output_projection"]["kernel"])  # [D, V]
  np.testing.assert_allclose(logits, hidden @ output, atol=1e-5)
  bare = model_lib.Transformer(model_lib.ModelConfig(**dict(TINY, num_layers=0,
                                                            tie_embeddings=tying)))
  x = jnp.array([[5, 7, 1]])
  out = _jit(bare, "encode")({"params": {"source_embedding": params["source_embedding"]}}, x)
  expected = (params["source_embedding"]["embedding"][x[0]] * np.sqrt(32)
              + positions.sinusoidal_encoding(jnp.arange(3), 32))
  np.testing.assert_allclose(out[0], expected, atol=1e-5)


def test_the_model_is_the_same_for_every_decoding_setting():
  """`config.cpu_workarounds` is the decoding side's to resolve (`backend_ops.for_setting`):
  the model built from the config does not depend on it."""
  models = {model_lib.build_model(_config(setting)) for setting in ("auto", "on", "off")}
  assert len(models) == 1


def test_cross_attention_keys_are_computed_once():
  """The cache holds the encoder output's keys/values; steps need neither it nor the source."""
  model, params = _build()
  x = _tokens(9, (1, 4))
  encoded = _jit(model, "encode")({"params": params}, x)
  cache = jax.jit(lambda p: model.apply(p, encoded, x, 3, method="init_cache"))(
      {"params": params})
  wk = params["decoder"]["layer_0"]["cross_attention"]["key"]["kernel"]
  np.testing.assert_allclose(cache.cross_attention[0].keys,
                             jnp.einsum("bsd,dhk->bhsk", encoded, wk), atol=1e-5)
  assert int(cache.position) == 0
  _, cache = _jit(model, "decode_step")({"params": params}, jnp.zeros((1, 1), jnp.int32), cache)
  assert int(cache.position) == 1


@pytest.mark.parametrize("field, value, allowed", [
    ("positional", "rotary", "'sinusoidal', 'learned'"), ("norm", "mid", "'post', 'pre'")])
def test_an_unknown_choice_is_an_error_not_a_default(field, value, allowed):
  """A value the model has no case for raises, naming the key and the declared values,
  instead of building learned positions or pre-LN sublayers."""
  model = model_lib.Transformer(model_lib.ModelConfig(**dict(TINY, **{field: value})))
  with pytest.raises(ConfigError, match=f"config.model.{field}='{value}' is not one of "
                     f"{allowed}"):
    model_lib.init_params(model, jax.random.key(0))


def test_an_unknown_attention_impl_is_an_error_not_cudnn():
  layer = attention.MultiHeadAttention(num_heads=2, d_k=4, d_v=4, d_model=8,
                                       attention_impl="flash")
  x = jnp.ones((1, 3, 8))
  with pytest.raises(ConfigError, match="config.model.attention_impl='flash' is not one of "
                     "'reference', 'xla', 'cudnn'"):
    layer.init(jax.random.key(0), x, x)
