"""Decoding code tuned for XLA:CPU, behind one switch: `config.cpu_workarounds`.

Each function here gives the result of a plain library formulation, which it replaces when
`enabled` is True:
- `top_k`: `jax.lax.top_k` inside a while loop runs much slower on XLA:CPU than k passes of
  max over the few blocks of the row that can hold the top k;
- `logsumexp`: `jax.nn.logsumexp`'s reduction runs slower on XLA:CPU than exp followed by a
  product with a vector of ones;
- `read_prefix`: a cached decoding step reads only the cache positions written so far,
  rounded up to a few static lengths (one `lax.switch` branch each), instead of the whole
  cache (input length + 50) under a mask.
The switch also stores the beam layout's keys transposed (`beam_cache.TransposedBeamKVCache`).

'auto' (the default) turns them on where JAX's default backend is the CPU; elsewhere the
library formulations run (whether these would help on a GPU or TPU is unmeasured). Their
measured effect on the CPU is in the README's performance table.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

SETTINGS = ("auto", "on", "off")


def enabled(setting: str) -> bool:
  """Resolves `config.cpu_workarounds` ('auto' | 'on' | 'off') to on or off."""
  if setting not in SETTINGS:
    raise ValueError(f"cpu_workarounds={setting!r} is not one of {', '.join(map(repr, SETTINGS))}")
  if setting == "auto":
    return jax.default_backend() == "cpu"
  return setting == "on"


def top_k(x: jax.Array, k: int, *, enabled: bool) -> tuple[jax.Array, jax.Array]:
  """The `k` largest entries of each row, as `jax.lax.top_k` orders them.

  Args:
    x: `[B, N]` scores, N >= k.
    k: entries per row.
    enabled: select by blocks (`_top_k_by_blocks`) instead of calling `jax.lax.top_k`.

  Returns:
    `(values [B, k], indices [B, k] int32)`: largest first, the lower index first on ties.
  """
  if not enabled or k > _MAX_UNROLLED_K:
    return jax.lax.top_k(x, k)
  return _top_k_by_blocks(x, k)


_BLOCK = 128  # columns per block in `_top_k_by_blocks`' first pass (or a nearby divisor)
# `_top_k_by_blocks` unrolls k passes; past this (beams of 9 and more) compiling them costs
# more than the sort it avoids.
_MAX_UNROLLED_K = 16


def _block_size(n: int) -> int:
  """The divisor of `n` nearest `_BLOCK` within a factor 2 of it, else `_BLOCK`: blocks that
  tile the row exactly need no slice of it (a copy of the whole array) and no short block."""
  divisors = [b for b in range(_BLOCK // 2, 2 * _BLOCK + 1) if n % b == 0]
  return min(divisors, key=lambda b: abs(b - _BLOCK)) if divisors else _BLOCK


def _top_k_by_blocks(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """Exact top k without a sort: the row's top k lie in the k blocks of about `_BLOCK`
  columns with the largest maxima (a block holding a top-k entry has at most k - 1 blocks
  ranked above it); k passes of max pick them from those blocks' columns."""
  batch, n = x.shape
  block = _block_size(n)
  full = n // block  # whole blocks; the last n % block columns form one more, shorter block
  if full <= 2 * k:
    return _top_k_by_max(x, jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), x.shape), k)
  if n % block:
    # Slices rather than padding: padding would copy the whole [B, N] array.
    block_max = x[:, :full * block].reshape(batch, full, block).max(axis=2)  # [B, full]
    block_max = jnp.concatenate([block_max, x[:, full * block:].max(axis=1, keepdims=True)],
                                axis=1)
  else:
    block_max = x.reshape(batch, full, block).max(axis=2)  # [B, full]
  block_ids = jnp.broadcast_to(jnp.arange(block_max.shape[1], dtype=jnp.int32), block_max.shape)
  _, best_blocks = _top_k_by_max(block_max, block_ids, k)  # [B, k]
  indices = (best_blocks[:, :, None] * block + jnp.arange(block, dtype=jnp.int32))
  indices = indices.reshape(batch, k * block)  # columns of the chosen blocks
  values = jnp.take_along_axis(x, jnp.minimum(indices, n - 1), axis=1)
  values = jnp.where(indices < n, values, -jnp.inf)  # past the end of a short last block
  return _top_k_by_max(values, indices, k)


def _top_k_by_max(x: jax.Array, indices: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """k passes of max over `x [B, M]`; `indices [B, M]` are the columns' (distinct) ids."""
  taken = jnp.zeros(x.shape, bool)
  big = jnp.iinfo(jnp.int32).max
  values, chosen = [], []
  for _ in range(k):
    best = jnp.max(jnp.where(taken, -jnp.inf, x), axis=1, keepdims=True)  # [B, 1]
    index = jnp.min(jnp.where((x == best) & ~taken, indices, big), axis=1)  # [B]
    taken |= indices == index[:, None]
    values.append(best[:, 0])
    chosen.append(index)
  return jnp.stack(values, axis=1), jnp.stack(chosen, axis=1)


def logsumexp(x: jax.Array, *, enabled: bool) -> jax.Array:
  """`log(sum(exp(x)))` over the last axis, `[..., V] -> [...]`.

  Enabled, the sum of exponentials is a product with a vector of ones; HIGHEST precision
  keeps that product in float32 on any backend (a TF32 or bfloat16 pass would cost 1e-3 of
  the sum).
  """
  if not enabled:
    return jax.nn.logsumexp(x, axis=-1)
  top = jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
  ones = jnp.ones((x.shape[-1],), x.dtype)
  total = jnp.matmul(jnp.exp(x - top), ones, precision=jax.lax.Precision.HIGHEST)
  return top[..., 0] + jnp.log(total)


def prefix_lengths(max_len: int, shortest: int = 16) -> tuple[int, ...]:
  """Static prefix lengths a decoding step may read: powers of two from `shortest`, then
  `max_len`. A step at position i reads the first of them above i: never more than twice the
  positions written (past `shortest`), with one compiled branch per length."""
  lengths = []
  n = shortest
  while n < max_len:
    lengths.append(n)
    n *= 2
  return (*lengths, max_len)


def read_prefix(read: Callable[[int], jax.Array], position: jax.Array, max_len: int, *,
                enabled: bool) -> jax.Array:
  """`read(length)`: a decoding step's attention over the cache's first `length` positions.

  Args:
    read: attends over the first `length` (a static int) cache positions.
    position: the step's position (traced); positions 0..position hold keys.
    max_len: the cache's length.
    enabled: read the first of `prefix_lengths(max_len)` above `position`, chosen by
      `lax.switch`; otherwise the whole cache, `read(max_len)`.
  """
  if not enabled:
    return read(max_len)
  lengths = prefix_lengths(max_len)
  branch = jnp.sum(jnp.asarray(lengths) <= position)  # the first length above the position
  return jax.lax.switch(branch, [functools.partial(read, n) for n in lengths])
