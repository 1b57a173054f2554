"""The decoding steps whose fastest formulation depends on the backend, chosen by the decoding
side from `config.cpu_workarounds` ('auto' | 'on' | 'off').

A search takes a `DecodingOps`: how it selects a step's top k, how it computes the step's
log-normaliser, and how a step reads the self-attention cache (the cache's `read`, set where
the decoding side builds the cache, `translate.init_cache`). The model knows none of this:
its attention layers only call the cache's `attend`. Both choices give the same results:
- `LIBRARY`: `jax.lax.top_k`, `jax.nn.logsumexp`, whole-cache reads (`attention.read_whole`);
- `CPU`, tuned for XLA:CPU:
  - `top_k_by_blocks`: `jax.lax.top_k` inside a while loop runs much slower on XLA:CPU than
    k passes of max over the few blocks of the row that can hold the top k;
  - `logsumexp_by_product`: `jax.nn.logsumexp`'s reduction runs slower on XLA:CPU than exp
    followed by a product with a vector of ones;
  - `read_prefix`: a cached decoding step reads only the cache positions written so far,
    rounded up to a few static lengths (one `lax.switch` branch each), instead of the whole
    cache (input length + 50) under a mask;
  - the beam layout stores its keys transposed (`beam_cache.TransposedBeamKVCache`).

'auto' (the default) picks `CPU` where JAX's default backend is the CPU, `LIBRARY` elsewhere
(whether the CPU formulations would help on a GPU or TPU is unmeasured). Their measured
effect on the CPU is in docs/performance.md.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp

from transformer.model import attention

@dataclasses.dataclass(frozen=True)
class DecodingOps:
  """How a search runs the steps whose fastest formulation depends on the backend.

  Hashable: a search compiled with it takes it as a static argument.
  """

  # `(x [B, N], k) -> (values [B, k], indices [B, k] int32)`: the k largest entries of each
  # row, largest first, the lower index first on ties (as `jax.lax.top_k`).
  top_k: Callable[[jax.Array, int], tuple[jax.Array, jax.Array]]
  # `log(sum(exp(x)))` over the last axis, `[..., V] -> [...]`.
  logsumexp: Callable[[jax.Array], jax.Array]
  # How a step reads its self-attention cache (`attention.KVCache.read`).
  cache_read: attention.CacheRead
  # The beam layout stores its keys transposed (`beam_cache.TransposedBeamKVCache`).
  transposed_keys: bool


def for_setting(setting: str) -> DecodingOps:
  """The ops `config.cpu_workarounds` selects (its values are declared in
  `transformer.run.schema`): 'on' -> `CPU`, 'off' -> `LIBRARY`, 'auto' -> `CPU` where JAX's
  default backend is the CPU, else `LIBRARY`."""
  match setting:
    case "on":
      return CPU
    case "off":
      return LIBRARY
    case "auto":
      return CPU if jax.default_backend() == "cpu" else LIBRARY
  raise ValueError(f"cpu_workarounds={setting!r} is not 'auto', 'on' or 'off'")


def _library_logsumexp(x: jax.Array) -> jax.Array:
  return jax.nn.logsumexp(x, axis=-1)


def top_k_by_blocks(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """The `k` largest entries of each row, as `jax.lax.top_k` orders them, without a sort.

  Args:
    x: `[B, N]` scores, N >= k.
    k: entries per row; past `_MAX_UNROLLED_K` this calls `jax.lax.top_k`.

  Returns:
    `(values [B, k], indices [B, k] int32)`: largest first, the lower index first on ties.
  """
  if k > _MAX_UNROLLED_K:
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


def logsumexp_by_product(x: jax.Array) -> jax.Array:
  """`log(sum(exp(x)))` over the last axis, `[..., V] -> [...]`, the sum of exponentials a
  product with a vector of ones. HIGHEST precision keeps that product in float32 on any
  backend (a TF32 or bfloat16 pass would cost 1e-3 of the sum)."""
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


def read_prefix(attend_first: Callable[[int], jax.Array], position: jax.Array,
                length: int) -> jax.Array:
  """An `attention.CacheRead`: attends over the first of `prefix_lengths(length)` cache
  positions above `position`, chosen by `lax.switch`.

  Args:
    attend_first: attends over the cache's first `n` (a static int) positions.
    position: the step's position (traced); positions 0..position hold keys.
    length: the cache's length.
  """
  lengths = prefix_lengths(length)
  branch = jnp.sum(jnp.asarray(lengths) <= position)  # the first length above the position
  return jax.lax.switch(branch, [functools.partial(attend_first, n) for n in lengths])


LIBRARY = DecodingOps(top_k=jax.lax.top_k, logsumexp=_library_logsumexp,
                      cache_read=attention.read_whole, transposed_keys=False)
CPU = DecodingOps(top_k=top_k_by_blocks, logsumexp=logsumexp_by_product,
                  cache_read=read_prefix, transposed_keys=True)
