"""Sampling: each output token drawn from the model's distribution, reshaped by a temperature
and cut to its top k tokens and its top-p nucleus (Holtzman et al. 2020), as back-translation
with sampling does (Edunov et al. 2018).

At each step a sentence's next-token distribution is `softmax(logits / temperature)`; `top_k`
keeps its k most probable tokens (0 keeps all; tokens tied with the k-th are kept too), and
`top_p` then keeps the fewest most probable tokens whose probabilities sum to at least p (the
token that crosses p is kept; 1 keeps all). The token is drawn from what is kept, renormalised.
The order is always temperature, then top k, then top p.

Each sentence draws with its own key, `fold_in(key(seed), sentence_id)` and then the step, so
its sample does not depend on the batch it is decoded in, nor on where in the batch it sits:
same seed, same samples.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from transformer.decoding import decode
from transformer.tokens import EOS_ID


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How tokens are drawn (see the module docstring)."""

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0

  def __post_init__(self):
    if not self.temperature > 0:
      raise ValueError(f"sampling temperature={self.temperature} must be > 0")
    if not (isinstance(self.top_k, int) and self.top_k >= 0):
      raise ValueError(f"sampling top_k={self.top_k} must be an integer >= 0 (0 = all)")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"sampling top_p={self.top_p} must be in (0, 1] (1 = all)")


def filtered_logits(logits: jax.Array, sampling: Sampling) -> jax.Array:
  """`logits [N, V]` divided by the temperature, `-inf` outside the top k and the top-p
  nucleus: `softmax` of the result is the distribution a token is drawn from."""
  logits = logits.astype(jnp.float32) / sampling.temperature
  if sampling.top_k and sampling.top_k < logits.shape[-1]:
    kth = jax.lax.top_k(logits, sampling.top_k)[0][:, -1:]  # [N, 1]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if sampling.top_p < 1:
    ordered = -jnp.sort(-logits, axis=-1)  # [N, V], most probable first
    probs = jax.nn.softmax(ordered, axis=-1)
    # A token is kept while the tokens before it hold less than top_p.
    kept = jnp.sum(jnp.cumsum(probs, axis=-1) - probs < sampling.top_p, axis=-1)  # [N]
    threshold = jnp.take_along_axis(ordered, kept[:, None] - 1, axis=-1)  # [N, 1]
    logits = jnp.where(logits < threshold, -jnp.inf, logits)
  return logits


def sentence_keys(seed: int, sentence_ids: jax.Array) -> jax.Array:
  """The raw key data `[B, ...]` of each sentence's draws (see the module docstring)."""
  base = jax.random.key(seed)
  return jax.vmap(lambda i: jax.random.key_data(jax.random.fold_in(base, i)))(sentence_ids)


def sample_search(
    tokens_to_logits: decode.TokensToLogits,
    cache: Any,
    max_lengths: jax.Array,  # int [B]
    max_decode_len: int,
    sentence_ids: jax.Array,  # int [B]
    sampling: Sampling,
    *,
    eos_id: int = EOS_ID,
    batch_sizes: Sequence[int] = (),
) -> jax.Array:  # int32 [B, max_decode_len]
  """One sampled hypothesis per sentence (`decode.token_by_token`), drawn as `sampling` says.

  Args:
    tokens_to_logits, cache, max_lengths, max_decode_len, eos_id, batch_sizes: as
      `decode.greedy_search`'s.
    sentence_ids: each row's sentence number, which with `sampling.seed` makes its key.
    sampling: the temperature, top k, top p and seed.

  Returns:
    Output ids `[B, max_decode_len]`: each row's tokens, its EOS, then PAD_ID.
  """
  def draw(logits, step, keys):
    def one(key_data, row):
      key = jax.random.fold_in(jax.random.wrap_key_data(key_data), step)
      return jax.random.categorical(key, row)
    return jax.vmap(one)(keys, filtered_logits(logits, sampling))

  return decode.token_by_token(tokens_to_logits, cache, max_lengths, max_decode_len, draw,
                               sentence_keys(sampling.seed, sentence_ids), eos_id=eos_id,
                               batch_sizes=batch_sizes)
