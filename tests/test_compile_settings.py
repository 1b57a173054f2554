"""The test set-up's two compile settings (tests/conftest.py): a test marked
`reference_numerics` compiles as a fresh process with no setting does, as users' programs are
compiled; the other tests compile with `jax_disable_most_optimizations`; no program compiled
under one setting serves the other; each file runs its marked tests after the others."""

import hashlib
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

# Not conftest's REPO: the fresh process imports this module, and conftest sets up a session.
REPO = pathlib.Path(__file__).resolve().parents[1]


def _loop(x, w):  # [4, 16], [16, 16]: a matmul, fusions and a loop, as a decoding step has
  def step(h, _):
    h = jax.nn.softmax(jnp.tanh(h @ w) * 2.0, axis=-1)
    return h, h.sum()

  return jax.lax.scan(step, x, None, length=4)


def optimised_hlo() -> str:
  """A hash of `_loop`'s HLO after XLA's passes: its instructions, without the metadata that
  holds the Python stack that traced them. (LLVM's optimisation level, which
  `jax_disable_most_optimizations` lowers, does not show in it.)"""
  compiled = jax.jit(_loop).lower(jnp.ones((4, 16)), jnp.ones((16, 16))).compile()
  instructions = [re.sub(r", metadata=\{[^}]*\}", "", line)
                  for line in compiled.as_text().splitlines() if " = " in line]
  return hashlib.sha256("\n".join(instructions).encode()).hexdigest()[:16]


@pytest.fixture(scope="module")
def fresh_process() -> str:
  """`optimised_hlo()` in a process with 8 CPU devices and no other JAX or XLA setting."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
  env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8",
             PYTHONPATH=str(REPO))
  done = subprocess.run(
      [sys.executable, "-c",
       "from tests.test_compile_settings import optimised_hlo; print(optimised_hlo())"],
      cwd=REPO, env=env, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-2000:]
  return done.stdout.strip()


@pytest.mark.reference_numerics
def test_reference_tests_compile_as_a_fresh_process_does(fresh_process):
  assert not jax.config.read("jax_disable_most_optimizations")
  assert optimised_hlo() == fresh_process


def test_the_other_tests_compile_with_most_optimizations_disabled():
  assert jax.config.read("jax_disable_most_optimizations")


def test_a_program_compiled_under_one_setting_does_not_serve_the_other():
  """One jitted function called under each setting in turn: under the second it is compiled
  anew (a miss of the persistent cache, whose key holds the setting), and back under the
  first it is read from the persistent cache, not from JAX's in-memory caches, which
  `use_compile_setting` empties."""
  from tests.conftest import use_compile_setting
  from transformer.run import compilation

  loop, args = jax.jit(_loop), (jnp.ones((4, 24)), jnp.ones((24, 24)))  # shapes of its own
  seen = []
  try:
    for reference in (False, True, False):
      use_compile_setting(reference)
      with compilation.CompileMonitor() as monitor:
        jax.block_until_ready(loop(*args))
      seen.append((monitor.cache_misses, monitor.cache_hits))
  finally:
    use_compile_setting(False)  # this test's own setting
  assert seen == [(1, 0), (1, 0), (0, 1)]


def test_the_conftest_the_tests_import_is_the_one_pytest_loaded(pytestconfig):
  """One copy of the set-up in a process: a second would make a compilation-cache folder of
  its own and point the environment at it, and no session end would remove it."""
  import tests.conftest

  assert pytestconfig.pluginmanager.is_registered(tests.conftest)


def test_each_file_runs_its_reference_tests_last(request):
  """The setting changes once per file (`pytest_collection_modifyitems`), here and in every
  file collected with this one."""
  marked = {}
  for item in request.session.items:
    marked.setdefault(item.path, []).append(
        item.get_closest_marker("reference_numerics") is not None)
  for path, flags in marked.items():
    assert flags == sorted(flags), path
