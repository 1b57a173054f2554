"""Label-smoothed cross-entropy and the metrics reported beside it (paper §5.4), and the
z-loss departure (`config.z_loss`).

Glossary: B batch, T target length, D d_model, V vocabulary, C target positions per chunk.

The loss is computed from integer labels without materialising a one-hot `[B, T, V]` array
or a full log-softmax: with `lse = logsumexp(logits)`,
`log p_y = logits_y - lse` and `sum_v log p_v = sum_v logits_v - V * lse`. Besides sparing
memory, this avoids the large temporaries whose allocation dominates CPU step time.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp


def token_losses(logits: jax.Array, labels: jax.Array, label_smoothing: float,
                 z_loss: float = 0.0) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per-token smoothed cross-entropy, un-smoothed NLL and correctness.

  The smoothed loss is the cross-entropy `-sum_v q_v log p_v` against the smoothed targets
  `q` (1 - ε on the label, ε / (V - 1) on every other token), so it is smallest when the
  model predicts exactly that distribution (and equals the NLL when ε = 0). With `z_loss`
  > 0 it adds `z_loss · log(Z)^2`, Z = sum_v exp(logit_v), which keeps the softmax's
  normaliser near 1 (Chowdhery et al. 2022, PaLM, §5: 1e-4); the NLL stays the model's.

  Args:
    logits: float `[B, T, V]`.
    labels: int `[B, T]`.
    label_smoothing: ε_ls in [0, 1).
    z_loss: the weight of log(Z)^2 (0 in the paper).

  Returns:
    `(loss [B, T], nll [B, T], correct [B, T])`, float32.
  """
  logits = logits.astype(jnp.float32)
  vocab_size = logits.shape[-1]
  lse = jax.nn.logsumexp(logits, axis=-1)  # [B, T]
  label_logit = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
  log_p_label = label_logit - lse
  nll = -log_p_label
  if label_smoothing > 0.0:
    sum_log_p = jnp.sum(logits, axis=-1) - vocab_size * lse
    low = label_smoothing / (vocab_size - 1)
    loss = -(1.0 - label_smoothing - low) * log_p_label - low * sum_log_p
  else:
    loss = nll
  if z_loss > 0.0:
    loss = loss + z_loss * jnp.square(lse)
  # The label is predicted when its logit is the largest. (Comparing with the maximum, which
  # logsumexp computes anyway, spares an argmax pass over [B, T, V]; only exact ties differ.)
  correct = (label_logit >= jnp.max(logits, axis=-1)).astype(jnp.float32)
  return loss, nll, correct


def loss_sums(logits: jax.Array, labels: jax.Array, weights: jax.Array,
              label_smoothing: float, z_loss: float = 0.0) -> dict[str, jax.Array]:
  """Sums over weighted tokens; dividing by `weight` gives means that add up across batches.

  Args:
    logits: float `[B, T, V]`.
    labels: int `[B, T]`.
    weights: `[B, T]`, 1 for real target tokens and 0 for padding.
    label_smoothing: ε_ls.
    z_loss: the weight of log(Z)^2 in `loss` (`token_losses`).

  Returns:
    dict of scalar sums: `loss`, `nll`, `correct`, `weight`.
  """
  loss, nll, correct = token_losses(logits, labels, label_smoothing, z_loss)
  weights = weights.astype(jnp.float32)
  return {
      "loss": jnp.sum(loss * weights),
      "nll": jnp.sum(nll * weights),
      "correct": jnp.sum(correct * weights),
      "weight": jnp.sum(weights),
  }


def chunked_loss_sums(hidden: jax.Array, labels: jax.Array, weights: jax.Array,
                      label_smoothing: float, project: Callable[[jax.Array], jax.Array],
                      chunk_tokens: int, z_loss: float = 0.0) -> dict[str, jax.Array]:
  """`loss_sums(project(hidden), ...)`, computed over chunks of target positions.

  An implementation switch (`config.loss_chunk_tokens`), not a change of the loss: the output
  projection and the loss run in a `lax.scan` over chunks of C positions of every row, each
  chunk under `jax.checkpoint`, so neither pass holds more than one chunk's `[B, C, V]`
  float32 logits (the backward pass recomputes them, one more output-layer product) instead
  of the whole `[B, T, V]` and its gradient. Rows stay whole in every chunk, so a batch split
  over devices by rows stays split the same way. The sums equal the dense ones up to the
  order of float additions.

  Args:
    hidden: `[B, T, D]`, the decoder's final states.
    labels: int `[B, T]`.
    weights: `[B, T]`, 1 for real target tokens and 0 for padding.
    label_smoothing: ε_ls.
    project: the output layer, `[B, C, D] -> float32 [B, C, V]`.
    chunk_tokens: target tokens per chunk (> 0); C = chunk_tokens // B positions (at least
      one). The last chunk is padded with zero-weight positions when C does not divide T.
    z_loss: the weight of log(Z)^2 in `loss` (`token_losses`).

  Returns:
    dict of scalar sums: `loss`, `nll`, `correct`, `weight`.
  """
  b, t, d = hidden.shape
  c = min(max(chunk_tokens // b, 1), t)
  num = -(-t // c)
  pad = num * c - t
  weights = weights.astype(jnp.float32)
  if pad:
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    labels = jnp.pad(labels, ((0, 0), (0, pad)))
    weights = jnp.pad(weights, ((0, 0), (0, pad)))

  def chunks(x):  # [B, num * C, ...] -> [num, B, C, ...]
    return jnp.moveaxis(x.reshape(b, num, c, *x.shape[2:]), 1, 0)

  @functools.partial(jax.checkpoint, prevent_cse=False)
  def chunk_sums(h, y, w):  # [B, C, D], [B, C], [B, C]
    return loss_sums(project(h), y, w, label_smoothing, z_loss)

  def body(total, xs):
    return jax.tree.map(jnp.add, total, chunk_sums(*xs)), None

  zeros = {k: jnp.zeros((), jnp.float32) for k in ("loss", "nll", "correct", "weight")}
  total, _ = jax.lax.scan(body, zeros, (chunks(hidden), chunks(labels), chunks(weights)))
  return total


def summarize(sums: dict[str, float]) -> dict[str, float]:
  """Per-token means from accumulated sums: loss, nll, perplexity (per word-piece), accuracy.

  NaN when the sums cover no token (every step of a log interval skipped as non-finite).
  """
  weight = float(sums["weight"])
  if weight <= 0:
    return dict.fromkeys(("loss", "nll", "perplexity", "accuracy"), math.nan)
  nll = float(sums["nll"]) / weight
  return {
      "loss": float(sums["loss"]) / weight,
      "nll": nll,
      "perplexity": math.exp(min(nll, 50.0)),
      "accuracy": float(sums["correct"]) / weight,
  }
