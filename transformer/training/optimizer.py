"""The paper's optimiser, Adam(0.9, 0.98, 1e-9) with the warm-up / inverse-sqrt rate (§5.3),
and the departures configs/modern.py names: AdamW, Adafactor, cosine and warmup-stable-decay
schedules (`config.optimizer`, `config.lr_schedule`; declared in transformer/run/schema.py)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from transformer.model import config as model_config
from transformer.run import schema


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


def learning_rate(step, config):
  """The rate at 1-based `step` under `config.lr_schedule`.

  Every schedule warms up linearly to the paper's peak, `factor · d_model^-0.5 ·
  warmup_steps^-0.5` (eq. 3 at step = warmup_steps), so that the rows of configs/modern.py
  differ in how the rate decays, not in its scale: 'inverse_sqrt' as step^-0.5 (eq. 3),
  'cosine' along half a cosine to 0 at `num_train_steps` (Loshchilov & Hutter 2017), 'wsd'
  held at the peak, then linearly to 0 over the last `wsd_decay_fraction` of the steps (Hu et
  al. 2024; Hägele et al. 2024).
  """
  d_model, warmup = config.model.d_model, config.warmup_steps
  factor, total = config.learning_rate_factor, config.num_train_steps
  paper = paper_learning_rate(step, d_model, warmup, factor)
  step = jnp.asarray(step, jnp.float32)
  peak = paper_learning_rate(warmup, d_model, warmup, factor)
  match config.lr_schedule:
    case "inverse_sqrt":
      return paper
    case "cosine":
      progress = jnp.clip((step - warmup) / max(total - warmup, 1), 0.0, 1.0)
      decayed = peak * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    case "wsd":
      decay_steps = max(round(config.wsd_decay_fraction * total), 1)
      decayed = peak * jnp.clip((total - step) / decay_steps, 0.0, 1.0)
    case _:
      raise _unknown("lr_schedule", config.lr_schedule)
  # The warm-up is eq. 3's own (step · warmup^-1.5 · d^-0.5 · factor), then the decay.
  return jnp.where(step < warmup, paper, decayed)


def learning_rate_schedule(config) -> optax.Schedule:
  """An optax schedule of the update count (0-based), i.e. the rate at count + 1."""
  return lambda count: learning_rate(count + 1, config)


def _matrices(params):
  """True for the parameters weight decay applies to: weight matrices and embeddings (two or
  more axes), not biases or norm scales."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def create_optimizer(config) -> optax.GradientTransformation:
  """`config.optimizer` with `config`'s schedule.

  'adam' (§5.3): β1, β2, ε from config (paper: 0.9, 0.98, 1e-9). 'adamw': the same, and
  `lr · weight_decay · θ` subtracted apart from the moments (Loshchilov & Hutter 2019), on
  weight matrices and embeddings. 'adafactor' (Shazeer & Stern 2018): optax's, decay
  1 - t^-0.8, ε1 = 1e-30, no first moment, updates clipped to RMS 1, on each weight matrix
  as a matrix (`merge_head_axes`: the attention kernels as [D, H·K] and [H·V_, D]); a matrix
  whose two sides both reach 128 gets a factored second moment (a row and a column vector),
  anything smaller (biases, norm scales, narrow key/value kernels of multi-query attention)
  a full one. The schedule is the step size itself (no scaling by each parameter's RMS), so
  that it means for Adafactor what it means for Adam.
  """
  schedule = learning_rate_schedule(config)
  match config.optimizer:
    case "adam":
      return optax.adam(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps)
    case "adamw":
      return optax.adamw(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps,
                         weight_decay=config.weight_decay, mask=_matrices)
    case "adafactor":
      return merge_head_axes(optax.adafactor(schedule, multiply_by_parameter_scale=False))
  raise _unknown("optimizer", config.optimizer)


# The attention kernels (transformer/model/attention.py), by the end of their parameter path,
# and the axes that make one side of their matrix: queries, keys and values map D to the
# heads, [D, H, K] as [D, H·K]; the output merges the heads, [H, V_, D] as [H·V_, D].
_HEAD_KERNELS = {("query", "kernel"): 1, ("key", "kernel"): 1, ("value", "kernel"): 1,
                 ("out", "kernel"): 2}


def matrix_shape(path: tuple[str, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
  """The shape a parameter at tree `path` has as the matrix it applies: an attention kernel's
  head axis merged with its per-head axis, as Mesh TensorFlow's attention stores its kernels
  (`AttentionParams(combine_dims=True)`); anything else as it is."""
  split = _HEAD_KERNELS.get(tuple(path[-2:]))
  if split is None or len(shape) != 3:
    return tuple(shape)
  return (math.prod(shape[:split]), math.prod(shape[split:]))


def merge_head_axes(inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """`inner` applied to every attention kernel as its 2-D matrix (`matrix_shape`).

  The kernels are stored 3-D, [D, H, K] and [H, V_, D], so that heads feed the attention
  without transposes. optax's Adafactor factors over a parameter's two largest axes, and not
  at all when the second of them is under 128: the base model's [512, 8, 64] kernels would
  keep a full second moment. Shazeer & Stern factor each weight matrix, and Mesh TensorFlow
  stores the attention kernels as matrices: this hands `inner` the merged matrices and
  returns the updates in the stored shapes. Its state holds the merged shapes.
  """

  def merged(tree):
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.reshape(x, matrix_shape(_names(path), x.shape)), tree)

  def init(params):
    return inner.init(merged(params))

  def update(updates, state, params=None):
    new, state = inner.update(merged(updates), state,
                              None if params is None else merged(params))
    return jax.tree.map(lambda u, g: jnp.reshape(u, g.shape), new, updates), state

  return optax.GradientTransformation(init, update)


def _names(path) -> tuple[str, ...]:
  return tuple(str(getattr(k, "key", k)) for k in path)


def _unknown(key: str, value):
  """The error for a value of `config.<key>` this module has no case for (`config_checks`
  stops such a config first)."""
  return model_config.not_one_of(key, value, schema.keys()[key].choices)
