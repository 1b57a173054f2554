"""The adapter to JAX's coordination-service client (transformer/run/coordination.py), pinned to
the JAX releases it was checked on. The multi-host tests (tests/training/test_multihost*.py)
use the real client across processes."""

import jax
from packaging.version import Version

from transformer.run import coordination


def test_jax_is_a_release_the_adapter_was_checked_on():
  first, end = map(Version, coordination.CHECKED_JAX)
  assert first <= Version(jax.__version__) < end, (
      f"jax {jax.__version__} is outside the releases transformer/run/coordination.py was "
      f"checked on ({first} to before {end}): check that its client still works (the "
      "multi-host tests) and widen CHECKED_JAX")


def test_a_single_process_has_no_client_and_gathers_its_own_value():
  assert jax.process_count() == 1
  assert coordination.client() is None
  assert coordination.gather("a value", "x") == ["x"]

