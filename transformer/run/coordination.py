"""What the processes of a multi-process run tell each other outside collectives: JAX's
coordination service (its key-value store, served by process 0), which every process reaches
once `jax.distributed.initialize` has run.

`gather` gives every process the same answer from all of them, so that each decides alike
(whether a checkpoint is damaged, say) where a process that decided alone would go on with
other collectives than the rest.

This module is the project's one adapter to a private part of JAX: `jax.distributed` offers
`initialize`, `is_initialized` and `shutdown` but no access to the store, so `client` reads
`jax._src.distributed.global_state.client`, as JAX's own `multihost_utils` and orbax do. It
was checked on the JAX releases `CHECKED_JAX` spans (tests/run/test_coordination.py fails
outside them). A public key-value API in `jax.distributed` would remove it; no upstream issue
asks for one yet.
"""

from __future__ import annotations

import itertools

import jax

# Long enough for the slowest process to reach the same point (a large checkpoint read);
# a process that never does is lost, and `peer_watch` ends the run first.
GATHER_TIMEOUT_MS = 30 * 60 * 1000
_rounds = itertools.count()  # every process gathers in the same order
# The JAX releases `client` was checked on: [first, end).
CHECKED_JAX = ("0.10.0", "0.12.0")


def client():
  """JAX's coordination-service client, or None in a single-process run."""
  if jax.process_count() == 1:
    return None
  from jax._src import distributed  # the client JAX's own multihost utilities use

  return distributed.global_state.client


def gather(name: str, value: str) -> list[str]:
  """Every process's `value`, by process index, once each has given its own (`[value]` in a
  single process). Every process must call it, in the same order as the other calls of it.

  Args:
    name: what is being gathered, for the store's keys (one line).
    value: this process's part.
  """
  store = client()
  if store is None:
    return [value]
  key = f"transformer/gather/{next(_rounds)}/{name}"
  store.key_value_set(f"{key}/{jax.process_index()}", value)
  return [store.blocking_key_value_get(f"{key}/{p}", GATHER_TIMEOUT_MS)
          for p in range(jax.process_count())]
