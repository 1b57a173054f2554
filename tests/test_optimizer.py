"""The paper's learning rate (eq. 3) and Adam settings (§5.3)."""

import numpy as np
import optax
import pytest

from configs import base
from transformer import optimizer


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


def test_adam_hyperparameters_come_from_config():
  config = base.get_config()
  tx = optimizer.create_optimizer(config)
  params = {"w": np.ones(3, np.float32)}
  state = tx.init(params)
  grads = {"w": np.array([1.0, -2.0, 0.5], np.float32)}
  updates, _ = tx.update(grads, state, params)
  ref = optax.adam(float(optimizer.learning_rate_schedule(config)(0)), b1=0.9, b2=0.98,
                   eps=1e-9)
  ref_updates, _ = ref.update(grads, ref.init(params), params)
  np.testing.assert_allclose(updates["w"], ref_updates["w"], rtol=1e-6)
