"""Every parallel strategy trains like one device; bf16, gradient accumulation, remat; bad input.

Runs on conftest's 8 CPU devices with a one-layer model. The pmap, accumulation and bf16
comparisons use dropout 0: pmap draws its own masks on each device and each micro-batch has
its own, so only the jit strategies (whose masks do not depend on the sharding) are compared
with dropout on. Data parallelism (jit), pmap and accumulation are compared at XLA's defaults
(`reference_numerics`) against one dropout-free one-device run, which they share.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests.support import ROWS, global_batch, tiny_config
from transformer.training import losses
from transformer.model import transformer as model_lib
from transformer.training import optimizer
from transformer.training import parallel
from transformer.training import steps as steps_lib
from transformer.errors import ConfigError

STEPS = 5


def _config(dropout=0.0, **overrides):
  config = tiny_config(overrides.pop("parallelism", "jit"), overrides.pop("mesh", (-1, 1, 1)))
  config.model.dropout_rate = dropout
  config.model.update(overrides.pop("model", {}))
  config.update(overrides)
  return config


@pytest.fixture(scope="module")
def initial_state():
  """One host copy of the initial train state, placed by each runner (sparing compiles;
  computed op by op, as `support.initial_params` says why)."""
  config = _config()
  model, tx = model_lib.build_model(config), optimizer.create_optimizer(config)
  return jax.device_get(steps_lib.create_train_state(model, tx, jax.random.key(0)))


def _train(config, initial_state, devices=None, steps=STEPS):
  """Trains `steps` steps on the global batches of `global_batch`.

  Returns:
    `(losses, grad_norms, state)`: per-token loss and gradient norm of each step, final state.
  """
  runner = parallel.create(config, devices)
  model = model_lib.build_model(config)
  tx = optimizer.create_optimizer(config)
  state = jax.device_put(initial_state, runner.state_shardings(initial_state))
  step_fn = runner.compile_train_step(
      steps_lib.make_train_step(model, tx, config, axis_name=runner.axis_name), state)
  loss, grad_norm = [], []
  rng = steps_lib.dropout_key(jax.random.key(1), config.dropout_rng_impl)
  for step in range(steps):
    state, m = step_fn(state, runner.place_batch(global_batch(step)), rng)
    loss.append(float(m["loss"]) / float(m["weight"]))
    grad_norm.append(float(m["grad_norm"]))
  return np.array(loss), np.array(grad_norm), state


@pytest.fixture(scope="module")
def single_device(initial_state):
  return _train(_config(), initial_state, jax.devices()[:1])


@pytest.fixture(scope="module")
def single_device_dropout(initial_state):
  return _train(_config(dropout=0.1), initial_state, jax.devices()[:1])


def _assert_same_training(run, ref):
  (loss, grad_norm, state), (ref_loss, ref_grad_norm, ref_state) = run, ref
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  np.testing.assert_allclose(grad_norm, ref_grad_norm, rtol=1e-3)
  got, want = jax.device_get(state.params), jax.device_get(ref_state.params)
  # Five Adam steps move parameters by ~0.1 (lr ≈ 0.03); rounding noise is far below that.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4), got, want)
  assert int(state.step) == STEPS


@pytest.mark.reference_numerics
def test_data_parallel_jit_matches_one_device(initial_state, single_device):
  """The main path, compiled as users' programs are; dropout off, so that the one-device run
  is `test_pmap_matches_one_device`'s (masks under sharding: the next test)."""
  _assert_same_training(_train(_config(mesh=(8, 1, 1)), initial_state), single_device)


def test_jit_strategies_match_one_device_with_dropout(initial_state, single_device_dropout):
  # The masks do not depend on the sharding; the memory options (layer remat,
  # jax.nn.dot_product_attention) change no number either.
  run = _train(_config(dropout=0.1, mesh=(2, 2, 2), model=dict(remat=True,
                                                                  attention_impl="xla")),
               initial_state)
  _assert_same_training(run, single_device_dropout)


def test_dropout_from_the_devices_generator_repeats_with_its_seed(initial_state,
                                                                  single_device_dropout):
  """config.dropout_rng_impl='rbg': other masks than threefry's (so another loss curve, of
  the same distribution), the same ones again for the same seed and mesh."""
  config = _config(dropout=0.1, mesh=(8, 1, 1), dropout_rng_impl="rbg")
  first, again = (_train(config, initial_state) for _ in range(2))
  np.testing.assert_array_equal(first[0], again[0])
  assert np.all(np.isfinite(first[0])) and not np.allclose(first[0], single_device_dropout[0])


@pytest.mark.reference_numerics
def test_pmap_matches_one_device(initial_state, single_device):
  _assert_same_training(_train(_config(parallelism="pmap"), initial_state), single_device)


@pytest.mark.reference_numerics
def test_gradient_accumulation_equals_one_large_batch(initial_state, single_device):
  # 4 micro-batches of 4 rows (with different token counts) make one 16-row update.
  run = _train(_config(grad_accum_steps=4), initial_state, jax.devices()[:1])
  _assert_same_training(run, single_device)


def test_fsdp_and_tensor_parallel_shard_parameters_and_optimizer_state():
  config = _config(mesh=(2, 2, 2))
  runner = parallel.create(config)
  model = model_lib.build_model(config)
  tx = optimizer.create_optimizer(config)
  state = runner.init_state(lambda: steps_lib.create_train_state(model, tx, jax.random.key(0)))
  wi = state.params["encoder"]["layer_0"]["ffn"]["wi"]["kernel"]  # [D=32, F=64]
  adam_mu = state.opt_state[0].mu["encoder"]["layer_0"]["ffn"]["wi"]["kernel"]
  query = state.params["decoder"]["layer_0"]["cross_attention"]["query"]["kernel"]  # [D, H, K]
  for x, spec, shard in ((wi, P("fsdp", "tensor"), (16, 32)),
                         (adam_mu, P("fsdp", "tensor"), (16, 32)),
                         (query, P("fsdp", "tensor", None), (16, 2, 8))):
    assert x.sharding.spec == spec
    assert x.addressable_shards[0].data.shape == shard
  assert state.params["shared_embedding"]["embedding"].sharding.spec == P("tensor", "fsdp")
  assert state.opt_state[0].count.sharding.is_fully_replicated


@pytest.mark.reference_numerics
def test_eval_sums_match_across_strategies(initial_state):
  config = _config()
  eval_fn = steps_lib.make_eval_step(model_lib.build_model(config), config)
  batch = global_batch(0)
  sums = []
  for runner in (parallel.create(config, jax.devices()[:1]),
                 parallel.create(_config(mesh=(2, 2, 2))),
                 parallel.create(_config(parallelism="pmap"))):
    params = jax.device_put(initial_state.params, runner.state_shardings(initial_state.params))
    sums.append(jax.device_get(runner.compile_eval_step(eval_fn)(params,
                                                                 runner.place_batch(batch))))
  assert sums[0]["weight"] == np.sum(batch["targets"] > 0)
  for other in sums[1:]:
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), other, sums[0])


def _equations(jaxpr):
  """All equations of a jaxpr, including those of nested jaxprs (jit, remat, custom_jvp)."""
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from _equations(inner)


def test_bfloat16_computes_in_bf16_and_keeps_statistics_and_state_in_f32(initial_state,
                                                                         single_device):
  config = _config(dtype="bfloat16")
  model = model_lib.build_model(config)
  params = initial_state.params  # float32, as the bf16 model keeps them
  batch = global_batch(0)

  def loss(p):
    logits = model.apply({"params": p}, batch["inputs"], batch["targets"])
    return losses.loss_sums(logits, batch["targets"], batch["targets"] > 0, 0.1)["loss"]

  eqns = list(_equations(jax.make_jaxpr(jax.grad(loss))(params).jaxpr))
  dots = [e for e in eqns if e.primitive.name == "dot_general"]
  assert dots and all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars)
  # Softmax (attention and loss), LayerNorm statistics and the loss's log run in float32.
  stats = [e for e in eqns if e.primitive.name in ("exp", "log", "rsqrt", "reduce_max")]
  assert {e.primitive.name for e in stats} >= {"exp", "log", "rsqrt"}
  assert all(v.aval.dtype == jnp.float32 for e in stats for v in e.invars)

  loss_bf16, _, state = _train(config, initial_state, jax.devices()[:1])
  dtypes = {x.dtype for x in jax.tree.leaves((state.params, state.opt_state))}
  assert dtypes == {jnp.dtype(jnp.float32), jnp.dtype(jnp.int32)}  # int32: Adam's count
  np.testing.assert_allclose(loss_bf16, single_device[0], rtol=2e-2)


@pytest.mark.parametrize("overrides, message", [
    (dict(mesh=(3, 1, 1)), r"uses 3 devices but 8 are present"),
    (dict(mesh=(-1, 3, 1)),
     r"fixed axes \(3 devices\) do not divide the 8 devices; .* one of 1, 2, 4, 8 would fit"),
    (dict(mesh=(1, 1, 8)), r"num_heads=4 is not divisible by config.mesh.tensor=8; .*: 1, 2, 4$"),
    (dict(mesh=(2, 1, 4), model=dict(d_ff=66)),
     r"d_ff=66 is not divisible by config.mesh.tensor=4; tensor sizes that fit .*: 1, 2$"),
    (dict(mesh=(1, 8, 1), model=dict(d_model=36)),
     r"d_model=36 is not divisible by config.mesh.fsdp=8; fsdp sizes that fit .*: 1, 2, 4$"),
])
def test_bad_layout_is_one_line_before_compiling(overrides, message):
  config = _config(**overrides)
  with pytest.raises(ConfigError, match=message) as error:
    parallel.create(config)
  assert "\n" not in str(error.value)


@pytest.mark.parametrize("parallelism, accum, rows, message", [
    ("jit", 1, 12, r"12 rows per process does not split over 8 .* multiple of 8 \(e.g. 8 or 16"),
    ("jit", 4, 16, r"grad_accum_steps=4; use a multiple of 32"),
    ("pmap", 1, 4, r"4 rows per process does not split over 8 .* multiple of 8"),
])
def test_batch_that_does_not_split_is_one_line(parallelism, accum, rows, message):
  runner = parallel.create(_config(parallelism=parallelism, grad_accum_steps=accum))
  batch = {k: v[:rows] for k, v in global_batch(0, rows=max(rows, ROWS)).items()}
  with pytest.raises(ConfigError, match=message) as error:
    runner.place_batch(batch)
  assert "\n" not in str(error.value)


# Rows of configs/modern.py together (relative positions, grouped heads, gated FFN, RMSNorm,
# QK-norm, untied embeddings, no biases; Adafactor's factored statistics, z-loss, the WSD
# schedule): the jit and pmap paths train them like one device, as the paper's model. The
# other optimizers and schedules keep elementwise state or none, as Adam does.
_MODERN = dict(
    model=dict(positional="t5", num_kv_heads=2, activation="swiglu", norm="pre",
               norm_type="rmsnorm", qk_norm="l2", tie_embeddings="none", biases=False),
    optimizer="adafactor", lr_schedule="wsd", num_train_steps=8, z_loss=1e-4)


def test_modern_rows_train_alike_under_jit_and_pmap():
  configs = {kind: _config(**_MODERN, **extra) for kind, extra in (
      ("one", {}), ("jit", dict(mesh=(8, 1, 1))), ("pmap", dict(parallelism="pmap")))}
  model = model_lib.build_model(configs["one"])
  tx = optimizer.create_optimizer(configs["one"])
  # Op by op, as `initial_state` (a jitted init would be one more program per row to compile).
  initial = jax.device_get(steps_lib.create_train_state(model, tx, jax.random.key(0)))
  one = _train(configs["one"], initial, jax.devices()[:1])
  _assert_same_training(_train(configs["jit"], initial), one)
  _assert_same_training(_train(configs["pmap"], initial), one)
