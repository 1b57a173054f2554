"""The paper's learning rate (eq. 3) and Adam settings (§5.3), and the departures of
configs/modern.py: AdamW, Adafactor, the cosine and warmup-stable-decay schedules."""

import jax
import numpy as np
import optax
import pytest

from configs import base
from tests.export import packages
from transformer.model import transformer as model_lib
from transformer.training import optimizer

# Against NumPy or PyTorch written from the papers: compiled as users' programs are (conftest).
pytestmark = pytest.mark.reference_numerics


@pytest.mark.parametrize("step", [1, 4000, 100000])
def test_schedule_matches_formula(step):
  config = base.get_config()
  expected = 512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5)
  # optax counts updates from 0: the first update (step 1) uses count 0.
  got = optimizer.learning_rate_schedule(config)(step - 1)
  np.testing.assert_allclose(float(got), expected, rtol=1e-6)


def test_schedule_peaks_at_warmup():
  config = base.get_config()
  lr = optimizer.learning_rate_schedule(config)
  values = [float(lr(s - 1)) for s in (3999, 4000, 4001)]
  assert values[1] > values[0] and values[1] > values[2]


def _optax_steps(tx, params, grads):
  """The parameters after each update of `grads`, each update one jitted program as in a
  training step."""
  step = jax.jit(lambda params, state, grad: _apply(tx, params, state, grad))
  state, out = tx.init(params), []
  for grad in grads:
    params, state = step(params, state, grad)
    out.append(params)
  return out


def _apply(tx, params, state, grad):
  updates, state = tx.update(grad, state, params)
  return optax.apply_updates(params, updates), state


def _numpy_adam(grads, b1, b2, eps, lrs):
  """Adam written out in float64 (Kingma & Ba, Algorithm 1): the parameter after each step,
  from 0 (so that the comparisons are relative to the size of the updates)."""
  param, m, v, out = np.zeros(3), np.zeros(3), np.zeros(3), []
  for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    param = param - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    out.append(param)
  return out


def test_adam_follows_the_paper_over_several_steps():
  """Five updates against NumPy Adam with β1 = 0.9, β2 = 0.98, ε = 1e-9 and eq. 3's rate.

  Gradients change sign and scale between steps, so the moments' decay rates matter: the
  first update alone would be the same for any β1, β2.
  """
  config = base.get_config()
  tx = optimizer.create_optimizer(config)
  grads = np.array([[1.0, -2.0, 0.5], [-3.0, 0.1, 0.5], [0.2, 2.0, -1.0], [1.5, -0.3, 4.0],
                    [-0.7, 0.9, 0.05]])
  lrs = [512 ** -0.5 * min(t ** -0.5, t * 4000 ** -1.5) for t in range(1, 6)]
  expected = _numpy_adam(grads, 0.9, 0.98, 1e-9, lrs)
  got = _optax_steps(tx, {"w": np.zeros(3, np.float32)}, [{"w": g.astype(np.float32)}
                                                          for g in grads])
  for params, want in zip(got, expected):
    # atol: a parameter back near 0 (-2.7e-9 after step 3) is held to 1e-5 of an update
    # (~1e-7), not to 1e-5 of itself, which float32 rounding in one fused program exceeds.
    np.testing.assert_allclose(params["w"], want, rtol=1e-5, atol=1e-12)
  # The comparison tells the paper's β1, β2 from others.
  other = _numpy_adam(grads, 0.8, 0.999, 1e-9, lrs)
  assert not np.allclose(other[-1], expected[-1], rtol=1e-2)


def _config(**changes):
  config = base.get_config()
  config.update(changes)
  return config


def _peak(warmup=4000):
  return 512 ** -0.5 * warmup ** -0.5  # eq. 3 at step = warmup


@pytest.mark.parametrize("step", [1, 2000, 4000, 4001, 50000, 99999, 100000])
def test_cosine_warms_up_as_the_paper_then_decays_to_zero(step):
  config = _config(lr_schedule="cosine")
  if step < 4000:
    expected = 512 ** -0.5 * step * 4000 ** -1.5
  else:
    expected = _peak() * 0.5 * (1 + np.cos(np.pi * (step - 4000) / (100000 - 4000)))
  got = float(optimizer.learning_rate_schedule(config)(step - 1))
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("step", [1, 3999, 4000, 50000, 80000, 90000, 100000])
def test_warmup_stable_decay_holds_the_peak_then_decays_linearly(step):
  config = _config(lr_schedule="wsd", wsd_decay_fraction=0.2)
  if step < 4000:
    expected = 512 ** -0.5 * step * 4000 ** -1.5
  elif step <= 80000:
    expected = _peak()
  else:  # the last 20,000 steps, linearly to 0 at step 100,000
    expected = _peak() * (100000 - step) / 20000
  got = float(optimizer.learning_rate_schedule(config)(step - 1))
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-12)


def test_adamw_decays_weights_apart_from_the_moments():
  """Three AdamW updates against Loshchilov & Hutter's Algorithm 2 in NumPy (the decay term
  λ·θ scaled by the rate, outside Adam's normalisation), on a matrix; a vector (a bias) is
  not decayed."""
  config = _config(optimizer="adamw", weight_decay=0.1, warmup_steps=2)
  tx = optimizer.create_optimizer(config)
  rng = np.random.default_rng(0)
  w0, b0 = rng.normal(size=(2, 3)), rng.normal(size=3)
  grads = [(rng.normal(size=(2, 3)), rng.normal(size=3)) for _ in range(3)]
  w, b, mw, vw, mb, vb = w0, b0, 0.0, 0.0, 0.0, 0.0
  for t, (gw, gb) in enumerate(grads, start=1):
    lr = 512 ** -0.5 * min(t ** -0.5, t * 2 ** -1.5)
    mw, vw = 0.9 * mw + 0.1 * gw, 0.98 * vw + 0.02 * gw ** 2
    mb, vb = 0.9 * mb + 0.1 * gb, 0.98 * vb + 0.02 * gb ** 2

    def adam(m, v):
      return (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.98 ** t)) + 1e-9)

    w = w - lr * (adam(mw, vw) + 0.1 * w)
    b = b - lr * adam(mb, vb)
  params = _optax_steps(tx, {"w": w0.astype(np.float32), "b": b0.astype(np.float32)},
                        [{"w": gw.astype(np.float32), "b": gb.astype(np.float32)}
                         for gw, gb in grads])[-1]
  np.testing.assert_allclose(params["w"], w, rtol=1e-5)
  np.testing.assert_allclose(params["b"], b, rtol=1e-5)
  assert not np.allclose(w, _adam_only(w0, grads), rtol=1e-4)


def _adam_only(w0, grads):
  config = _config(warmup_steps=2)
  tx = optimizer.create_optimizer(config)
  return _optax_steps(tx, {"w": w0.astype(np.float32)},
                      [{"w": gw.astype(np.float32)} for gw, _ in grads])[-1]["w"]


def test_adafactor_takes_the_papers_first_step():
  """One Adafactor step against Shazeer & Stern's Algorithm 4 (factored, for a matrix) and
  Algorithm 2 (a vector) in NumPy, at step 1: β̂2 = 1 - 1^-0.8 = 0, so the second moments
  are those of this gradient; ε1 = 1e-30; updates clipped to RMS d = 1; the step size is the
  schedule's rate (no relative step)."""
  config = _config(optimizer="adafactor")
  tx = optimizer.create_optimizer(config)
  rng = np.random.default_rng(1)
  g_matrix = rng.normal(size=(130, 140)) * rng.uniform(0.1, 3, size=(130, 1))
  g_vector = rng.normal(size=150) * 1e-3
  params = {"m": np.zeros((130, 140), np.float32), "v": np.zeros(150, np.float32)}
  updates = jax.jit(lambda grads: tx.update(grads, tx.init(params), params)[0])(
      {"m": g_matrix.astype(np.float32), "v": g_vector.astype(np.float32)})
  lr = 512 ** -0.5 * 4000 ** -1.5  # eq. 3 at step 1

  squared = g_matrix ** 2 + 1e-30
  r, c = squared.sum(axis=1), squared.sum(axis=0)  # R_t = (G² + ε1) 1_m, C_t = 1_n^T (G² + ε1)
  v_hat = np.outer(r, c) / r.sum()  # R_t C_t / (1_n^T R_t)

  def clipped(u):
    return u / max(1.0, np.sqrt(np.mean(u ** 2)) / 1.0)

  np.testing.assert_allclose(updates["m"], -lr * clipped(g_matrix / np.sqrt(v_hat)),
                             rtol=1e-4, atol=1e-10)
  np.testing.assert_allclose(updates["v"], -lr * clipped(g_vector / np.sqrt(g_vector ** 2
                                                                          + 1e-30)),
                             rtol=1e-4, atol=1e-10)
  # The factored estimate is not the elementwise one: it tells Algorithm 4 from Algorithm 2.
  assert not np.allclose(updates["m"], -lr * clipped(np.sign(g_matrix)), rtol=1e-2)


# A self-attention layer's kernels as the model stores them: [D, H, K] and [H, V_, D]. Merged,
# each is a 128 × 128 matrix, the smallest whose two sides reach optax's factoring threshold.
_HEADS = {"decoder": {"layer_0": {"self_attention": {"query": {"kernel": (128, 4, 32)},
                                                     "out": {"kernel": (4, 32, 128)}}}}}


def _kernels(rng, scale_rows=False):
  def draw(shape):
    x = rng.normal(size=shape)
    if scale_rows:  # rows of very different sizes, so that a factored estimate is not flat
      x = x * rng.uniform(0.1, 3.0, size=shape[:1] + (1,) * (len(shape) - 1))
    return x.astype(np.float32)

  return jax.tree.map(draw, _HEADS, is_leaf=lambda s: isinstance(s, tuple))


def _torch_adafactor(torch, params, grads, lrs):
  """transformers' Adafactor (Shazeer & Stern's, from fairseq) on each kernel as the matrix
  `matrix_shape` says, with the schedule as its step size: no relative step, no scaling by
  the parameter's RMS, ε = (1e-30, -), clipping at RMS 1, decay 1 - t^-0.8, no first moment.
  Returns the parameters after each step, in the stored shapes."""
  from transformers.optimization import Adafactor

  leaves, tree = jax.tree_util.tree_flatten_with_path(params)
  tensors = [torch.nn.Parameter(torch.tensor(np.reshape(
      x, optimizer.matrix_shape(tuple(k.key for k in path), x.shape)), dtype=torch.float64))
      for path, x in leaves]
  torch_opt = Adafactor(tensors, lr=lrs[0], eps=(1e-30, 1e-3), clip_threshold=1.0,
                        decay_rate=-0.8, beta1=None, weight_decay=0.0, scale_parameter=False,
                        relative_step=False, warmup_init=False)
  out = []
  for grad, lr in zip(grads, lrs):
    torch_opt.param_groups[0]["lr"] = lr
    for tensor, g in zip(tensors, jax.tree.leaves(grad)):
      tensor.grad = torch.tensor(np.reshape(g, tensor.shape), dtype=torch.float64)
    torch_opt.step()
    out.append(jax.tree_util.tree_unflatten(
        tree, [t.detach().numpy().reshape(x.shape).copy() for t, (_, x) in zip(tensors, leaves)]))
  return out


@pytest.fixture
def torch():
  packages.require("transformers", "export-test")
  return packages.require("torch", "export-test")


def test_adafactor_factors_attention_kernels_as_transformers_does_their_matrices(torch):
  """Three steps of the project's Adafactor on a layer's [128, 4, 32] and [4, 32, 128] kernels
  against transformers' on the same kernels as 128 × 128 matrices ([D, H·K], [H·V_, D]), with
  the schedule's rates; optax's own Adafactor on the stored shapes, which it leaves
  unfactored, is not the same."""
  config = _config(optimizer="adafactor", warmup_steps=2)
  rng = np.random.default_rng(2)
  params = _kernels(rng)
  grads = [_kernels(rng, scale_rows=True) for _ in range(3)]
  lrs = [float(optimizer.learning_rate_schedule(config)(t)) for t in range(3)]
  expected = _torch_adafactor(torch, params, grads, lrs)
  got = _optax_steps(optimizer.create_optimizer(config), params, grads)

  def moved(tree):  # the change from the initial parameters, which float32 rounds at ~1e-7
    return jax.tree.map(lambda x, x0: np.asarray(x, np.float64) - x0, tree, params)

  for want, have in zip(expected, got):
    jax.tree.map(lambda w, h: np.testing.assert_allclose(h, w, rtol=1e-4, atol=1e-6),
                 moved(want), moved(have))
  unmerged = _optax_steps(optax.adafactor(optimizer.learning_rate_schedule(config),
                                          multiply_by_parameter_scale=False), params, grads)
  kernel = lambda tree: tree["decoder"]["layer_0"]["self_attention"]["query"]["kernel"]
  assert not np.allclose(kernel(moved(unmerged[-1])), kernel(moved(expected[-1])), rtol=0.1)


def _state_floats(config) -> int:
  """The optimizer state's numbers for `config`'s model, from shapes alone (jax.eval_shape)."""
  model = model_lib.build_model(config)
  params = jax.eval_shape(lambda: model_lib.init_params(model, jax.random.key(0)))
  state = jax.eval_shape(optimizer.create_optimizer(config).init, params)
  return sum(x.size for x in jax.tree.leaves(state))


def test_adafactor_state_of_the_base_model_is_factored_as_docs_training_md_counts():
  """docs/training.md's count: Adam keeps two numbers per parameter of base's 63,045,632
  (and two step counts); Adafactor a row and a column per matrix, attention kernels
  included, and a full second moment for biases and norm scales alone."""
  assert _state_floats(base.get_config()) == 126_091_266
  assert _state_floats(_config(optimizer="adafactor")) == 234_387
