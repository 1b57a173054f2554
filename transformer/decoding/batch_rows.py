"""The rows of a search's batch: a sentence's beams side by side, and finished sentences leaving
the batch.

A search's state has one row per sentence (`[B, ...]`) or one per beam, sentence-major
(`[B * beam, ...]`: row `b * beam + j` is beam j of sentence b); scalar leaves (a step counter
such as the model's 'position') are shared by all rows and left alone. `shrinking_loop` runs a
search's while loop so that, once few sentences are still searched, it goes on with their rows
only (`transformer.decoding.decode`'s `batch_sizes`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp


def expand_to_beams(tree: Any, beam_size: int) -> Any:
  """Repeats every leaf's rows `beam_size` times: `[B, ...]` -> `[B * beam, ...]`.

  Row `b * beam_size + j` is beam j of sentence b. Scalar leaves (rank 0: shared step counters
  such as the model's 'position') are returned unchanged.
  """
  return jax.tree.map(lambda x: x if x.ndim == 0 else jnp.repeat(x, beam_size, axis=0), tree)


def gather_beams(tree: Any, indices: jax.Array, batch_size: int, old_beams: int) -> Any:
  """Selects beams of each sentence: leaves `[B * old_beams, ...]` -> `[B * new_beams, ...]`.

  Args:
    tree: pytree whose non-scalar leaves have `B * old_beams` rows, sentence-major.
    indices: int `[B, new_beams]`, for each new beam the old beam it copies.
    batch_size: B.
    old_beams: beams per sentence in `tree`.

  Returns:
    The tree with rows reordered; scalar leaves unchanged.
  """
  rows = (jnp.arange(batch_size)[:, None] * old_beams + indices).reshape(-1)  # [B * new_beams]
  return jax.tree.map(lambda x: x if x.ndim == 0 else jnp.take(x, rows, axis=0), tree)


def gather_per_sentence(x: jax.Array, indices: jax.Array) -> jax.Array:
  """`x [B, n, ...]`, `indices [B, m]` -> `[B, m, ...]`: per-sentence selection."""
  batch, n = x.shape[:2]
  flat = x.reshape(batch * n, *x.shape[2:])
  out = gather_beams(flat, indices, batch, n)
  return out.reshape(batch, indices.shape[1], *x.shape[2:])


def select_sentences(tree: Any, sentences: jax.Array, batch_size: int, beams: int) -> Any:
  """Keeps the rows of `sentences` (int `[B']`) in that order, in a tree whose non-scalar
  leaves have `batch_size` rows (one per sentence) or `batch_size * beams` (sentence-major).

  Raises:
    ValueError: a leaf has another number of rows.
  """
  def select(x):
    if x.ndim == 0:
      return x
    if x.shape[0] == batch_size:
      return jnp.take(x, sentences, axis=0)
    if x.shape[0] == batch_size * beams:
      by_sentence = x.reshape(batch_size, beams, *x.shape[1:])
      return jnp.take(by_sentence, sentences, axis=0).reshape(-1, *x.shape[1:])
    raise ValueError(f"a leaf of shape {x.shape} has neither {batch_size} rows (one per "
                     f"sentence) nor {batch_size * beams} (one per beam): give the search a "
                     "cache whose leaves lead with the batch")
  return jax.tree.map(select, tree)


def shrinking_loop(cond: Callable[[Any], jax.Array], body: Callable[[Any], Any], state: Any, *,
          active: Callable[[Any], jax.Array], result: Callable[[Any], Any], beams: int,
          batch_sizes: Sequence[int]) -> Any:
  """`result(state)` after `while cond(state): state = body(state)`, finished sentences
  leaving the batch.

  Args:
    cond, body: the search's loop; `body` must work on any number of sentences, and leave a
      sentence that is not `active` with its result final.
    state: the loop's state, leaves with one row per sentence (or per beam, `beams` rows per
      sentence, sentence-major) or scalars.
    active: `state -> bool [B]`, the sentences still searched.
    result: `state -> tree` of leaves `[B, ...]`, each sentence's result.
    beams: rows per sentence in the state's beam-major leaves.
    batch_sizes: whenever at most `n` (one of these, below B) sentences are active, the loop
      goes on with `n` sentences: the active ones first, then finished ones in batch order.

  Returns:
    `result` of the final state, in the batch's order.
  """
  batch = active(state).shape[0]
  sizes = sorted({int(n) for n in batch_sizes if 0 < n < batch}, reverse=True)
  if not sizes:
    return result(jax.lax.while_loop(cond, body, state))
  rows = jnp.arange(batch)  # [B'], the sentence each row holds
  out = result(state)

  def keep(out, rows, state):
    return jax.tree.map(lambda o, r: o.at[rows].set(r), out, result(state))

  for size in sizes:
    state = jax.lax.while_loop(lambda s: cond(s) & (jnp.sum(active(s)) > size), body, state)
    out = keep(out, rows, state)
    # A stable sort of "finished" puts the active sentences first, in batch order.
    stay = jnp.argsort(~active(state), stable=True)[:size]  # [size]
    state = select_sentences(state, stay, rows.shape[0], beams)
    rows = rows[stay]
  return keep(out, rows, jax.lax.while_loop(cond, body, state))
