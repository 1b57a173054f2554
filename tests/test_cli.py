"""The launcher: one line and an exit status for each way a command ends, on the CPU freed
host memory kept for reuse (a repeated step stops page-faulting) in the process it was
started in, and process-wide settings made by it alone (importing the library makes none)."""

import logging
import os
import re
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
# starts in $STARTS and prints the fewest faults of one call.
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
  print(min(faults[1:]))

cli.run(main)
"""


def _launch(tmp_path, **settings) -> tuple[int, int]:
  """`(starts, fewest faults)` of one launched command."""
  starts = tmp_path / f"starts-{len(list(tmp_path.iterdir()))}"
  out = subprocess.run([sys.executable, "-c", _LAUNCHED], cwd=REPO, check=True, text=True,
                       capture_output=True, env=_env(STARTS=str(starts), **settings))
  return len(starts.read_text().splitlines()), int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a glibc setting")
def test_the_launcher_keeps_freed_memory_in_the_process_it_was_started_in(tmp_path):
  starts, faults = _launch(tmp_path)
  assert starts == 1 and faults <= 50
  starts, faults_without = _launch(tmp_path, TRANSFORMER_KEEP_FREED_MEMORY="0")
  assert starts == 1 and faults_without > 50


# train.py run the ways a program other than the shell runs it: from a program read from
# standard input, and from a driver script that does work before and after it.
_TRAIN_ARGS = ["train.py", "--config=tests/tiny_config.py", "--config.num_train_steps=2",
               "--config.checkpoint_every_steps=2", "--config.eval_every_steps=2"]
_THROUGH_RUNPY = """
import gc, runpy, sys
collected_while_importing, frozen = [], []  # collections started once JAX is being imported

def count(phase, info):
  if phase != "start" or frozen or "jax" not in sys.modules:
    return
  if gc.get_freeze_count():  # walks every frozen object: asked until the freeze, not after
    frozen.append(True)
  else:
    collected_while_importing.append(info)

gc.callbacks.append(count)
print("driver started", flush=True)
sys.argv = {argv!r}
try:
  runpy.run_path("train.py", run_name="__main__")
except SystemExit as e:
  print("train.py ended with", e.code or 0, flush=True)
print("driver goes on", flush=True)
print("frozen:", gc.get_freeze_count(), flush=True)
print("collected while importing:", len(collected_while_importing), flush=True)
"""


@pytest.mark.parametrize("how", ["stdin", "driver script"])
def test_train_py_trains_when_run_from_another_program(tmp_path, synthetic_data_cache, how):
  """No re-execution: run through runpy from a program read from stdin, train.py trains (a
  restart cannot read stdin again); from a driver, the driver runs once and goes on after."""
  workdir = tmp_path / "w"
  program = _THROUGH_RUNPY.format(argv=[*_TRAIN_ARGS, f"--workdir={workdir}",
                                        f"--config.data.cache_dir={synthetic_data_cache}"])
  # The session's environment (its compile settings and compilation cache), as every other
  # test's train.py: what is tested is how train.py is started, not how it compiles.
  env = dict(os.environ, PYTHONPATH=REPO)
  if how == "stdin":
    run = subprocess.run([sys.executable, "-"], input=program, cwd=REPO, env=env, text=True,
                         capture_output=True)
  else:
    (tmp_path / "driver.py").write_text(program)
    run = subprocess.run([sys.executable, str(tmp_path / "driver.py")], cwd=REPO, env=env,
                         text=True, capture_output=True)
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout.count("driver started") == 1, run.stdout
  assert "train.py ended with 0" in run.stdout and "driver goes on" in run.stdout
  assert sorted(os.listdir(workdir / "checkpoints")) == ["2"]
  # train.py imports with the garbage collector off, then takes the imports out of its walks
  # (`cli.importing`): JAX, Flax, optax and orbax are over 100,000 objects, and the collector
  # would start some 300 times while they are made.
  assert int(re.search(r"frozen: (\d+)", run.stdout).group(1)) > 100_000, run.stdout
  assert "collected while importing: 0" in run.stdout, run.stdout


def _record(path: str, level: int = logging.INFO) -> logging.LogRecord:
  return logging.LogRecord("absl", level, path, 1, "a line", None, None)


@pytest.mark.parametrize("package_dir, kept, dropped", [
    # Installed into site-packages (pip install ., not -e): the package's lines, not orbax's.
    ("/env/lib/python3.11/site-packages/transformer",
     ["/env/lib/python3.11/site-packages/transformer/training/train_lib.py"],
     ["/env/lib/python3.11/site-packages/orbax/checkpoint/manager.py"]),
    # A checkout: the package's, train.py's and the benchmarks', not its virtualenv's.
    ("/src/project/transformer",
     ["/src/project/transformer/run/checkpoint.py", "/src/project/train.py",
      "/src/project/benchmarks/train_step.py"],
     ["/src/project/.venv/lib/python3.11/site-packages/orbax/checkpoint/manager.py",
      "/elsewhere/lib.py"]),
])
def test_info_lines_are_the_projects_wherever_it_is_installed(package_dir, kept, dropped):
  own = cli.OwnInfoOnly(package_dir, os.path.dirname(package_dir))
  assert all(own.filter(_record(path)) for path in kept)
  assert not any(own.filter(_record(path)) for path in dropped)
  assert all(own.filter(_record(path, logging.WARNING)) for path in dropped)


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
