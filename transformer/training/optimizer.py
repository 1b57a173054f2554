"""The paper's optimiser: Adam(0.9, 0.98, 1e-9) with the warm-up / inverse-sqrt rate (§5.3)."""

from __future__ import annotations

import jax.numpy as jnp
import optax


def paper_learning_rate(step, d_model: int, warmup_steps: int, factor: float = 1.0):
  """`lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)` (paper eq. 3).

  Args:
    step: the 1-based training step (the first update is step 1).
    d_model: model width.
    warmup_steps: linear warm-up length (4000 in the paper).
    factor: a multiplier (1.0 in the paper).
  """
  step = jnp.maximum(jnp.asarray(step, jnp.float32), 1.0)
  return factor * d_model ** -0.5 * jnp.minimum(step ** -0.5, step * warmup_steps ** -1.5)


def learning_rate_schedule(config) -> optax.Schedule:
  """An optax schedule of the update count (0-based), i.e. the paper's rate at count + 1."""
  d_model, warmup, factor = config.model.d_model, config.warmup_steps, config.learning_rate_factor
  return lambda count: paper_learning_rate(count + 1, d_model, warmup, factor)


def create_optimizer(config) -> optax.GradientTransformation:
  """Adam with β1, β2, ε from config (paper: 0.9, 0.98, 1e-9) and the paper's schedule."""
  return optax.adam(learning_rate_schedule(config), b1=config.adam_b1, b2=config.adam_b2,
                    eps=config.adam_eps)
