"""The launcher: one line and an exit status for each way a command ends, on the CPU freed
host memory kept for reuse (a repeated step stops page-faulting), and process-wide settings
made by it alone (importing the library makes none)."""

import os
import subprocess
import sys

import pytest

from transformer import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A jitted matmul whose 144 MB result (like a step's [B, T, V] logits) is allocated and freed
# on every call; prints the fewest page faults of one call after the first. (With the setting
# the heap may still grow for a call or two, while a result is freed after the next call
# starts; then calls stop faulting.)
_PROGRAM = """
import resource, sys
from transformer import cli
applied = cli.keep_freed_host_memory()
import jax, jax.numpy as jnp
f = jax.jit(lambda x: x @ x.T)
x = jnp.ones((6000, 64))
faults = []
for _ in range(10):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  f(x).block_until_ready()  # the result is freed at once
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(applied, min(faults[1:]))
"""


def _env(**settings) -> dict:
  """The tests' environment without a GLIBC_TUNABLES of their own, plus `settings`."""
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  return dict(env, JAX_PLATFORMS="cpu", XLA_FLAGS="", **settings)


def _run(keep: str) -> tuple[bool, int]:
  env = _env(TRANSFORMER_KEEP_FREED_MEMORY=keep)
  out = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, check=True,
                       capture_output=True, text=True).stdout.split()
  return out[0] == "True", int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a glibc setting")
def test_repeated_step_stops_faulting_only_with_the_setting():
  applied, faults = _run("1")
  not_applied, faults_without = _run("0")
  assert applied and not not_applied
  # Without it every call faults its 144 MB in again: 35,000 pages of 4 KiB (or 72 huge pages
  # where transparent huge pages are always on).
  assert faults_without > 50
  assert faults <= faults_without / 20


# The same call measured in a command started by the launcher (cli.run), which counts its
# starts in $STARTS and prints GLIBC_TUNABLES and the fewest faults of one call.
_LAUNCHED = """
import os, resource
from transformer import cli
with open(os.environ["STARTS"], "a") as f:
  f.write("started\\n")

def main(argv):
  import jax, jax.numpy as jnp
  f = jax.jit(lambda x: x @ x.T)
  x = jnp.ones((6000, 64))
  faults = []
  for _ in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
  print(os.environ.get("GLIBC_TUNABLES", "-"), min(faults[1:]))

cli.run(main)
"""


def _launch(tmp_path, **settings) -> tuple[int, str, int]:
  """`(starts, GLIBC_TUNABLES, fewest faults)` of one launched command."""
  starts = tmp_path / f"starts-{len(list(tmp_path.iterdir()))}"
  out = subprocess.run([sys.executable, "-c", _LAUNCHED], cwd=REPO, check=True, text=True,
                       capture_output=True, env=_env(STARTS=str(starts), **settings))
  tunables, faults = out.stdout.split()
  return len(starts.read_text().splitlines()), tunables, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a glibc setting")
def test_the_launcher_starts_a_command_again_once_with_glibc_keeping_freed_memory(tmp_path):
  starts, tunables, faults = _launch(tmp_path)
  assert starts == 2 and faults <= 50
  assert set(tunables.split(":")) == {f"{k}={v}" for k, v in cli._MALLOC_TUNABLES.items()}
  # Off, or the tunables given already (one of them the user's own): started once.
  starts, tunables, faults_without = _launch(tmp_path, TRANSFORMER_KEEP_FREED_MEMORY="0")
  assert (starts, tunables) == (1, "-") and faults_without > 50
  given = "glibc.malloc.arena_max=2:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=9"
  starts, tunables, _ = _launch(tmp_path, GLIBC_TUNABLES=given)
  assert (starts, tunables) == (1, given)
  starts, tunables, _ = _launch(tmp_path, GLIBC_TUNABLES="glibc.malloc.arena_max=2")
  assert starts == 2 and tunables.startswith("glibc.malloc.arena_max=2:")
  assert "arena_max=1" not in tunables


# Imports every module of the package after the libraries it builds on (their own set-up is
# theirs), and prints the flags the package defined and what else changed process-wide.
_IMPORT_ALL = """
import logging, pkgutil, sys
from absl import app, flags
from absl import logging as absl_logging
import flax, jax, optax, orbax.checkpoint
from jax._src import monitoring
import transformer

def state():
  return (sys.unraisablehook, list(logging.getLogger("asyncio").filters),
          list(logging.getLogger().handlers), len(monitoring.get_event_listeners()),
          len(monitoring.get_event_time_span_listeners()))

before = state()
for module in pkgutil.walk_packages(transformer.__path__, "transformer."):
  if not module.name.endswith("__main__"):
    __import__(module.name)
print([m for m in flags.FLAGS.flags_by_module_dict() if m.startswith("transformer")],
      [b for a, b in zip(before, state()) if a != b])
"""


def test_importing_the_library_changes_nothing_process_wide():
  """No flag (the research tools define theirs when run as programs, train.py the
  distributed ones), no hook, logging filter or jax listener; the launcher makes those."""
  out = subprocess.run([sys.executable, "-c", _IMPORT_ALL], cwd=REPO, capture_output=True,
                       text=True, env=_env())
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip() == "[] []"


def test_cpu_judged_from_jax_platforms(monkeypatch):
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert cli.computes_on_cpu()
  monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
  assert not cli.computes_on_cpu()
  assert not cli.keep_freed_host_memory()


def test_cpu_fallback_with_an_accelerator_installed_or_present_is_an_error(monkeypatch,
                                                                          tmp_path):
  real_find_spec = cli.importlib.util.find_spec
  monkeypatch.delenv("JAX_PLATFORMS")  # the tests' cpu setting means "on purpose"
  monkeypatch.setattr(cli, "_GPU_DEVICE_FILES", {})
  cli.check_backend()  # the CPU with nothing else: fine
  monkeypatch.setattr(cli.importlib.util, "find_spec",
                      lambda name: object() if name == "jax_cuda12_plugin"
                      else real_find_spec(name))
  with pytest.raises(ValueError, match="jax_cuda12_plugin is installed but JAX found no "
                     "accelerator.*JAX_PLATFORMS=cpu"):
    cli.check_backend()
  monkeypatch.setattr(cli.importlib.util, "find_spec", real_find_spec)
  device = tmp_path / "nvidiactl"
  device.write_text("")
  monkeypatch.setattr(cli, "_GPU_DEVICE_FILES", {str(device): "pip install -e '.[cuda12]'"})
  with pytest.raises(ValueError,
                     match=r"has a GPU .*install it with pip install -e '\.\[cuda12\]'"):
    cli.check_backend()
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  cli.check_backend()  # on the CPU on purpose


_RAISES = """
from transformer import cli
from transformer import errors
def main(argv):
  raise {}
cli.run(main)
"""


@pytest.mark.parametrize("raised, status, line", [
    ("errors.Stopped('stopped by SIGTERM after step 7: checkpoint 7 is saved', 0)", 0,
     "stopped by SIGTERM after step 7: checkpoint 7 is saved"),
    ("errors.Stopped('stopped by SIGINT after step 3: checkpoint 3 is saved', 130)", 130,
     "stopped by SIGINT after step 3: checkpoint 3 is saved"),
    ("errors.Diverged('the training loss became NaN at step 5')", 1,
     "error: the training loss became NaN at step 5"),
    ("errors.ConfigError('config.x=1 must be 2')", 2, "error: config.x=1 must be 2"),
])
def test_endings_are_one_line_with_their_exit_status(raised, status, line):
  result = subprocess.run([sys.executable, "-c", _RAISES.format(raised)], capture_output=True,
                          text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == status
  assert result.stderr.strip() == line


def test_a_missing_config_file_is_one_line(tmp_path):
  result = subprocess.run(
      [sys.executable, "train.py", "--config=configs/nonexistent.py", f"--workdir={tmp_path}/w"],
      cwd=REPO, capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2
  assert result.stderr.strip() == ("error: --config=configs/nonexistent.py: no such file; pass "
                                   "a config file such as configs/base.py")
  assert not (tmp_path / "w").exists()
