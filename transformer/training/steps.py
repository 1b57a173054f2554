"""What one step computes: the train state, the pure train and eval steps, the dev loss over
batches, and compiling every batch shape ahead. `train_lib` runs them in its loop.

Glossary: B batch, S source length, T target length, V vocabulary.

Steps are pure functions of `(state, batch, rng)`: dropout randomness is
`fold_in(rng, state.step)`, so a resumed run draws exactly what an uninterrupted one would.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import struct

from transformer.model import transformer as model_lib
from transformer.run import compilation
from transformer.training import losses

# Batch keys passed to the model as keyword arguments when present (packing).
PACKING_KEYS = ("inputs_positions", "targets_positions", "inputs_segmentation",
                "targets_segmentation")


class TrainState(struct.PyTreeNode):
  step: jax.Array  # int32 scalar: updates applied so far
  params: Any
  opt_state: Any


def create_train_state(model: model_lib.Transformer, tx: optax.GradientTransformation,
                       rng: jax.Array) -> TrainState:
  params = model_lib.init_params(model, rng)
  return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params))


def _apply(model, params, batch, *, train: bool, rng=None, return_hidden: bool = False):
  extra = {k: batch[k] for k in PACKING_KEYS if k in batch}
  rngs = {"dropout": rng} if train else None
  return model.apply({"params": params}, batch["inputs"], batch["targets"], train=train,
                     rngs=rngs, return_hidden=return_hidden, **extra)


def _loss_sums(model, params, batch, config, *, train: bool, rng=None) -> dict:
  """Token sums of the loss; over chunks of `config.loss_chunk_tokens` tokens when > 0."""
  labels, weights = batch["targets"], batch["targets"] > 0
  if not config.loss_chunk_tokens:
    logits = _apply(model, params, batch, train=train, rng=rng)  # [B, T, V]
    return losses.loss_sums(logits, labels, weights, config.label_smoothing, config.z_loss)
  hidden = _apply(model, params, batch, train=train, rng=rng, return_hidden=True)  # [B, T, D]
  project = lambda h: model.apply({"params": params}, h, method=model_lib.Transformer.logits)
  return losses.chunked_loss_sums(hidden, labels, weights, config.label_smoothing, project,
                                  config.loss_chunk_tokens, config.z_loss)


def dropout_key(key: jax.Array, impl: str) -> jax.Array:
  """The key dropout's masks are drawn from (`config.dropout_rng_impl`): `key` itself for
  JAX's threefry, else a key of `impl` seeded from it, so a run's masks still follow its seed.
  """
  if impl == "threefry2x32":
    return key
  seed = int(jax.random.randint(key, (), 0, jnp.iinfo(jnp.int32).max))
  return jax.random.key(seed, impl=impl)


def make_train_step(model, tx, config, axis_name: str | None = None) -> Callable:
  """`train_step(state, batch, rng) -> (state, metrics)`; metrics are token sums and scalars.

  Each update averages the smoothed loss over all real target tokens of the global batch.
  `metrics['nonfinite']` is 1.0 when the loss or the gradients were NaN or infinite; with
  `config.on_nonfinite='skip'` such an update is then not applied.
  With `config.grad_accum_steps = k` the batch's rows are split into k micro-batches whose
  summed gradients make one update, equal to the update on the whole batch.

  `axis_name` is the device axis when the step runs under `jax.pmap` (`runner.axis_name`):
  each device then holds its own rows, and token sums and summed gradients are added over
  devices (`lax.psum`) before the division by the global token count, as the jit path does.
  """
  def loss_fn(params, batch, rng):
    sums = _loss_sums(model, params, batch, config, train=True, rng=rng)
    return sums["loss"], sums

  grad_fn = jax.grad(loss_fn, has_aux=True)

  def train_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array):
    rng = jax.random.fold_in(rng, state.step)
    if axis_name is not None:
      rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))  # own masks per device
    k = config.grad_accum_steps
    if k == 1:
      grads, sums = grad_fn(state.params, batch, rng)
    else:
      # Micro-batch i takes rows i, i + k, i + 2k, ...: each device's block of rows splits
      # evenly, so every micro-batch stays spread over the devices like the batch.
      micro = jax.tree.map(
          lambda x: x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1), batch)

      def accumulate(carry, xs):
        i, micro_batch = xs
        g, s = grad_fn(state.params, micro_batch, jax.random.fold_in(rng, i))
        return jax.tree.map(jnp.add, carry, (g, s)), None

      zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(
          grad_fn, state.params, jax.tree.map(lambda x: x[0], micro), rng))
      (grads, sums), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(k), micro))
    if axis_name is not None:
      grads, sums = jax.lax.psum((grads, sums), axis_name)
    # Gradients of the token-summed loss -> of the mean over the batch's real tokens.
    grads = jax.tree.map(lambda g: g / jnp.maximum(sums["weight"], 1.0), grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(sums["loss"]) & jnp.isfinite(grad_norm)
    if config.on_nonfinite == "skip":
      # Drop this update (the step still counts) and keep its numbers out of the averages.
      params, opt_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old),
                                       (params, opt_state), (state.params, state.opt_state))
      sums, grad_norm = jax.tree.map(lambda x: jnp.where(finite, x, 0.0), (sums, grad_norm))
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    out = dict(sums, grad_norm=grad_norm, nonfinite=1.0 - finite.astype(jnp.float32))
    return new_state, out

  return train_step


def make_eval_step(model, config) -> Callable:
  """`eval_step(params, batch) -> sums` of loss, NLL, correct tokens and weight."""

  def eval_step(params, batch):
    return _loss_sums(model, params, batch, config, train=False)

  return eval_step


def evaluate_loss(eval_step, params, batches, runner, max_batches: int = -1) -> dict:
  """Loss, NLL, perplexity and accuracy over `batches` (at most `max_batches` if >= 0)."""
  totals = None
  for i, batch in enumerate(batches):
    if 0 <= max_batches <= i:
      break
    sums = eval_step(params, runner.place_batch(batch))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  if totals is None:
    raise ValueError("the evaluation split yielded no batch")
  return losses.summarize(jax.device_get(totals))


def compile_batch_shapes(runner, train_step, eval_step, state, rng, data, config) -> None:
  """Compiles the train step for every training batch shape, and the eval step for the
  shapes of the dev batches it will see, before step 1 and several at once
  (`compilation.compile_ahead`): the loop's calls then run these programs instead of
  stopping to compile each bucket shape when it first appears."""
  def zeros(rows: int, source_len: int, target_len: int, packed: bool = False):
    keys = ("inputs", "targets") + (PACKING_KEYS if packed else ())
    return runner.place_batch({k: np.zeros((rows, source_len if k.startswith("inputs")
                                            else target_len), np.int32) for k in keys})

  stats = getattr(data, "stats", None) or {}
  calls = [(train_step, (state, zeros(*shape, packed=config.data.packing), rng))
           for shape in stats.get("shapes", [])]
  if data.eval_batches:
    limit = config.num_eval_batches if config.num_eval_batches >= 0 else None
    dev_shapes = set(stats.get("eval_batch_shapes", [])[:limit])
    calls += [(eval_step, (state.params, zeros(*shape))) for shape in sorted(dev_shapes)]
  start = time.time()
  compilation.compile_ahead(calls)
  if calls:
    logging.info("compiled %d %s in %.1f s", len(calls), compilation.COMPILED_AHEAD,
                 time.time() - start)
