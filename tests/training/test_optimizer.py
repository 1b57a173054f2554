"""The paper's learning rate (eq. 3) and Adam settings (§5.3)."""

import numpy as np
import optax
import pytest

from configs import base
from transformer.training import optimizer


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
  params = {"w": np.zeros(3, np.float32)}
  state = tx.init(params)
  for g, want in zip(grads, expected):
    updates, state = tx.update({"w": g.astype(np.float32)}, state, params)
    params = optax.apply_updates(params, updates)
    np.testing.assert_allclose(params["w"], want, rtol=1e-5)
  # The comparison tells the paper's β1, β2 from others.
  other = _numpy_adam(grads, 0.8, 0.999, 1e-9, lrs)
  assert not np.allclose(other[-1], expected[-1], rtol=1e-2)
