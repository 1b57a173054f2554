"""The position schemes against NumPy written from their papers: RoPE's rotation matrix (Su et
al. 2021, eq. 15), T5's buckets (Raffel et al. 2020), ALiBi's slopes and biases (Press et al.
2022), Shaw et al.'s clipped relative keys and values (2018, eqs. 3-4) and T5's bias inside a
whole attention layer; and what makes a scheme relative: shifting every position changes
nothing."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.model.test_attention import numpy_attention
from transformer.model import attention
from transformer.model import config as model_config
from transformer.model import position_schemes
from transformer.model import positions

# Against NumPy or PyTorch written from the papers: compiled as users' programs are (conftest),
# each call jitted as a whole, as in a training step, not run operation by operation.
pytestmark = pytest.mark.reference_numerics


def _rotation_matrix(position: int, d: int) -> np.ndarray:
  """R_{Θ,m} of Su et al. (eq. 15): 2 × 2 rotations by m·θ_i, θ_i = 10000^(-2(i-1)/d), on
  the diagonal."""
  r = np.zeros((d, d))
  for i in range(d // 2):
    angle = position * 10000.0 ** (-2.0 * i / d)
    r[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[np.cos(angle), -np.sin(angle)],
                                           [np.sin(angle), np.cos(angle)]]
  return r


def test_rope_is_the_papers_rotation_matrix():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 3, 7, 8)).astype(np.float32)  # [B, H, T, K]
  pos = np.array([0, 1, 2, 5, 17, 100, 511])
  got = np.asarray(jax.jit(positions.rotate)(x, pos))
  for t, m in enumerate(pos):
    np.testing.assert_allclose(got[:, :, t], x[:, :, t] @ _rotation_matrix(m, 8).T, atol=1e-4)


def test_rope_products_depend_on_the_distance_alone():
  rng = np.random.default_rng(1)
  q, k = rng.normal(size=(2, 16)).astype(np.float32)

  rotate = jax.jit(positions.rotate)

  def product(m, n):
    return float(np.asarray(rotate(q, m)) @ np.asarray(rotate(k, n)))

  np.testing.assert_allclose(product(3, 1), product(42, 40), rtol=1e-4)
  assert abs(product(3, 1) - product(3, 2)) > 1e-3


def _t5_bucket_reference(relative: int, bidirectional: bool, num_buckets=32,
                         max_distance=128) -> int:
  """T5's bucket, written from its description: half the buckets per direction when
  bidirectional; within a direction, distances below half the buckets exactly, larger ones
  on a log scale up to max_distance, the last bucket beyond."""
  if bidirectional:
    half = num_buckets // 2
    offset = half if relative > 0 else 0
    distance = abs(relative)
  else:
    half, offset = num_buckets, 0
    distance = max(-relative, 0)  # keys after the query share bucket 0
  exact = half // 2
  if distance < exact:
    return offset + distance
  log_bucket = exact + int(math.log(distance / exact) / math.log(max_distance / exact)
                           * (half - exact))
  return offset + min(log_bucket, half - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_match_the_description(bidirectional):
  relative = np.arange(-300, 301)
  got = np.asarray(jax.jit(positions.t5_bucket, static_argnums=1)(relative, bidirectional))
  expected = [_t5_bucket_reference(int(r), bidirectional) for r in relative]
  np.testing.assert_array_equal(got, expected)
  assert got.min() == 0 and got.max() == 31


def test_alibi_slopes_follow_the_paper():
  # Press et al. §3: 8 heads take 1/2, 1/4, ..., 1/256; n heads start at 2^(-8/n) and
  # multiply by it; other counts interleave the next power of two's.
  np.testing.assert_allclose(positions.alibi_slopes(8), [2.0 ** -i for i in range(1, 9)])
  np.testing.assert_allclose(positions.alibi_slopes(16),
                             [2.0 ** (-0.5 * i) for i in range(1, 17)])
  np.testing.assert_allclose(positions.alibi_slopes(6),
                             [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3])


def test_alibi_bias_penalises_distance_linearly():
  q_pos, k_pos = np.array([0, 3, 4]), np.array([0, 1, 2, 3, 4, 9])
  got = np.asarray(jax.jit(positions.alibi_bias, static_argnums=2)(q_pos, k_pos, 4))
  slopes = [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]
  expected = [[[-m * abs(j - i) for j in k_pos] for i in q_pos] for m in slopes]
  np.testing.assert_allclose(got, expected, rtol=1e-6)


_LAYER = dict(num_heads=4, d_k=6, d_v=5, d_model=12)


def _positions(scheme: str, stack_tables=None, **fields):
  """What `scheme` does in a self-attention layer of `_LAYER`'s sizes."""
  cfg = model_config.ModelConfig(**_LAYER, **fields)
  return position_schemes.get(scheme).self_attention(cfg, stack_tables)


@functools.cache  # one compiled program per layer
def _layer(positional=None, shaw_clip=16, **fields):
  positions = None if positional is None else _positions(positional, shaw_clip=shaw_clip)
  layer = attention.MultiHeadAttention(**_LAYER, **fields, positions=positions)
  x = jax.ShapeDtypeStruct((2, 7, 12), jnp.float32)
  # Op by op, not jitted, the draws alone: `support.initial_params` says why.
  params = layer.lazy_init(jax.random.key(3), x, x, positions=jnp.arange(7)[None])
  apply = jax.jit(lambda p, x, mask, pos: layer.apply(p, x, x, mask, positions=pos))
  return params["params"], apply


def _shapes(*arrays):
  """What `lazy_init` needs of a layer's inputs: their shapes (no forward pass is run)."""
  return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]


def _inputs(seed):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(2, 7, 12)).astype(np.float32)
  mask = np.tril(np.ones((7, 7), bool))[None, None] & (np.arange(7) < np.array([[7], [5]]))[
      :, None, None, :]  # [B, 1, T, S]: causal, the second row's last two keys padding
  pos = np.array([[0, 1, 2, 3, 4, 5, 6], [3, 4, 5, 6, 7, 8, 9]])  # the second row offset
  return x, mask, pos


def _project(x, kernel):  # [B, T, D] @ [D, H, K] -> [B, H, T, K], in float64
  return np.einsum("btd,dhk->bhtk", np.asarray(x, np.float64), np.asarray(kernel, np.float64))


def _merge(z, kernel):  # [B, H, T, V_] @ [H, V_, D] -> [B, T, D]
  return np.einsum("bhtv,hvd->btd", z, np.asarray(kernel, np.float64))


def test_shaw_relative_keys_and_values_follow_eqs_3_and_4():
  """e_ij = x_i W^Q (x_j W^K + a^K_ij)^T / sqrt(d_k), z_i = sum_j α_ij (x_j W^V + a^V_ij),
  a_ij the learned vector of clip(j - i, -k, k), from each row's own positions."""
  params, apply = _layer(positional="shaw", shaw_clip=2)
  x, mask, pos = _inputs(4)
  a_k = np.asarray(params["positions"]["shaw"]["keys"], np.float64)  # [2k + 1, K]
  a_v = np.asarray(params["positions"]["shaw"]["values"], np.float64)  # [2k + 1, V_]
  q, k, v = (_project(x, params[n]["kernel"]) for n in ("query", "key", "value"))
  index = np.clip(pos[:, None, :] - pos[:, :, None], -2, 2) + 2  # [B, T, S]: j - i
  logits = (np.einsum("bhtk,bhsk->bhts", q, k)
            + np.einsum("bhtk,btsk->bhts", q, a_k[index])) / np.sqrt(6)
  logits = np.where(mask, logits, -np.inf)
  alpha = np.exp(logits - logits.max(-1, keepdims=True))
  alpha /= alpha.sum(-1, keepdims=True)
  z = np.einsum("bhts,bhsv->bhtv", alpha, v) + np.einsum("bhts,btsv->bhtv", alpha, a_v[index])
  np.testing.assert_allclose(apply({"params": params}, x, mask, pos),
                             _merge(z, params["out"]["kernel"]), atol=1e-5)


def test_t5_bias_is_added_to_the_scaled_logits():
  """The decoder's case (keys after the query share one bucket; here masked), each row's
  relative positions bucketed as T5 describes, one learned scalar per bucket and head."""
  # An unbound T5Bias given to the layer's positions becomes their child ('bias'), as a
  # stack's would be shared by its layers.
  layer = attention.MultiHeadAttention(
      **_LAYER, positions=_positions("t5", positions.T5Bias(4, bidirectional=False)))
  x, mask, pos = _inputs(5)
  params = layer.lazy_init(jax.random.key(3), *_shapes(x, x, mask), positions=pos)["params"]
  table = params["positions"]["bias"]["embedding"]  # [32, H]
  q, k, v = (_project(x, params[n]["kernel"]) for n in ("query", "key", "value"))
  relative = pos[:, None, :] - pos[:, :, None]  # [B, T, S]
  buckets = np.vectorize(lambda r: _t5_bucket_reference(int(r), False))(relative)
  bias = np.moveaxis(np.asarray(table, np.float64)[buckets], -1, 1)  # [B, H, T, S]
  logits = np.einsum("bhtk,bhsk->bhts", q, k) / np.sqrt(6) + bias
  logits = np.where(mask, logits, -np.inf)
  alpha = np.exp(logits - logits.max(-1, keepdims=True))
  alpha /= alpha.sum(-1, keepdims=True)
  z = np.einsum("bhts,bhsv->bhtv", alpha, v)
  got = jax.jit(layer.apply)({"params": params}, x, x, mask, positions=pos)
  np.testing.assert_allclose(got, _merge(z, params["out"]["kernel"]), atol=1e-5)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_grouped_keys_and_values_equal_repeated_heads(kv_heads):
  """Multi-query (G = 1) and grouped-query attention equal multi-head attention whose key and
  value heads are the G heads repeated, query head h reading head h // (H / G)."""
  rng = np.random.default_rng(6)
  q = rng.normal(size=(2, 4, 5, 6)).astype(np.float32)
  k = rng.normal(size=(2, kv_heads, 7, 6)).astype(np.float32)
  v = rng.normal(size=(2, kv_heads, 7, 3)).astype(np.float32)
  mask = (np.arange(7) < np.array([[7], [4]]))[:, None, None, :]
  out, _ = jax.jit(attention.scaled_dot_product_attention)(q, k, v, mask)
  repeat = 4 // kv_heads
  ref, _ = numpy_attention(q, np.repeat(k, repeat, axis=1), np.repeat(v, repeat, axis=1), mask)
  np.testing.assert_allclose(out, ref, atol=1e-5)


def test_a_grouped_layer_is_multi_head_attention_with_shared_kernels():
  params, apply = _layer(num_kv_heads=2)
  full_params, full_apply = _layer()
  shared = dict(full_params, key={"kernel": np.repeat(params["key"]["kernel"], 2, axis=1)},
                value={"kernel": np.repeat(params["value"]["kernel"], 2, axis=1)},
                query=params["query"], out=params["out"])
  assert params["key"]["kernel"].shape == (12, 2, 6)
  x, mask, pos = _inputs(7)
  np.testing.assert_allclose(apply({"params": params}, x, mask, pos),
                             full_apply({"params": shared}, x, mask, pos), atol=1e-5)


def test_qk_norm_rms_normalises_each_heads_queries_and_keys():
  """Dehghani et al. 2023: RMSNorm over each head's channels, a learned scale per channel,
  then the paper's 1/sqrt(d_k)."""
  params, apply = _layer(qk_norm="rms")
  params = jax.tree.map(lambda p: p, params)  # a copy: _layer's is cached
  params["query_norm"] = {"scale": jnp.linspace(0.5, 1.5, 6)}
  params["key_norm"] = {"scale": jnp.linspace(2.0, 1.0, 6)}
  x, mask, pos = _inputs(8)

  def rms_norm(y, scale):
    return y / np.sqrt(np.mean(y ** 2, -1, keepdims=True) + 1e-6) * np.asarray(scale)

  q = rms_norm(_project(x, params["query"]["kernel"]), params["query_norm"]["scale"])
  k = rms_norm(_project(x, params["key"]["kernel"]), params["key_norm"]["scale"])
  z, _ = numpy_attention(q, k, _project(x, params["value"]["kernel"]), mask)
  np.testing.assert_allclose(apply({"params": params}, x, mask, pos),
                             _merge(z, params["out"]["kernel"]), atol=1e-5)


def test_qk_norm_l2_takes_unit_vectors_and_one_learned_scale():
  """Henry et al. 2020's QKNorm: each head's queries and keys at unit length, their products
  times one learned g per layer in place of 1/sqrt(d_k), g starting at log2(L^2 - L)."""
  params, apply = _layer(qk_norm="l2", qk_norm_length=27)
  assert set(params) == {"query", "key", "value", "out", "qk_scale"}
  np.testing.assert_allclose(params["qk_scale"], np.log2(27 ** 2 - 27), rtol=1e-6)
  params = dict(params, qk_scale=jnp.float32(3.5))  # a trained g, not the initial one
  x, mask, pos = _inputs(9)

  def unit(y):
    return y / np.linalg.norm(y, axis=-1, keepdims=True)

  q = unit(_project(x, params["query"]["kernel"]))
  k = unit(_project(x, params["key"]["kernel"]))
  z, _ = numpy_attention(q, k, _project(x, params["value"]["kernel"]), mask, scale=3.5)
  np.testing.assert_allclose(apply({"params": params}, x, mask, pos),
                             _merge(z, params["out"]["kernel"]), atol=1e-5)
  # The scale replaces 1/sqrt(d_k) rather than multiplying it.
  kept, _ = numpy_attention(q, k, _project(x, params["value"]["kernel"]), mask,
                            scale=3.5 / np.sqrt(6))
  assert not np.allclose(_merge(kept, params["out"]["kernel"]),
                         apply({"params": params}, x, mask, pos), atol=1e-3)


def test_qk_norm_l2_is_the_same_under_jax_attention():
  """`attention_impl='xla'` takes g as its whole scale too (jax.nn.dot_product_attention's
  `scale`), as the reference does."""
  fields = dict(_LAYER, d_v=6, qk_norm="l2", qk_norm_length=27)
  x, mask, pos = _inputs(10)
  reference = attention.MultiHeadAttention(**fields)
  params = reference.lazy_init(jax.random.key(3), *_shapes(x, x, mask), positions=pos)
  xla = attention.MultiHeadAttention(**fields, attention_impl="xla")
  np.testing.assert_allclose(jax.jit(xla.apply)(params, x, x, mask, positions=pos),
                             jax.jit(reference.apply)(params, x, x, mask, positions=pos),
                             atol=1e-5)
