"""The launcher: one line and an exit status for each way a command ends, on the CPU freed
host memory kept for reuse in the process it was started in, and process-wide settings made
by it alone (importing the library makes none)."""

import logging
import os
import subprocess
import sys

import pytest

from transformer import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def _env(**settings) -> dict:
  """The tests' environment on the CPU, plus `settings`."""
  return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="", **settings)


# A command started by the launcher (cli.run), which counts its starts in $STARTS and prints
# whether the launcher kept freed host memory (what `keep_freed_host_memory` returned).
_LAUNCHED = """
import os
from transformer import cli
with open(os.environ["STARTS"], "a") as f:
  f.write("started\\n")
kept = []
keep = cli.keep_freed_host_memory
cli.keep_freed_host_memory = lambda: kept.append(keep()) or kept[-1]

def main(argv):
  print(kept)

cli.run(main)
"""


def _launch(tmp_path, **settings) -> tuple[int, str]:
  """`(starts, what the launcher's keep_freed_host_memory calls returned)` of one command."""
  starts = tmp_path / f"starts-{len(list(tmp_path.iterdir()))}"
  out = subprocess.run([sys.executable, "-c", _LAUNCHED], cwd=REPO, check=True, text=True,
                       capture_output=True, env=_env(STARTS=str(starts), **settings))
  return len(starts.read_text().splitlines()), out.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a glibc setting")
def test_the_launcher_keeps_freed_memory_once_in_the_process_it_was_started_in(tmp_path):
  assert _launch(tmp_path) == (1, "[True]")
  assert _launch(tmp_path, TRANSFORMER_KEEP_FREED_MEMORY="0") == (1, "[False]")


def test_freed_memory_is_kept_only_on_the_cpu_and_unless_turned_off(monkeypatch):
  """Off the CPU, or with TRANSFORMER_KEEP_FREED_MEMORY=0, the allocator is left alone."""
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("TRANSFORMER_KEEP_FREED_MEMORY", "0")
  assert not cli.keep_freed_host_memory()
  monkeypatch.setenv("TRANSFORMER_KEEP_FREED_MEMORY", "1")
  monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
  assert not cli.keep_freed_host_memory()
  monkeypatch.delenv("JAX_PLATFORMS")
  monkeypatch.setattr(cli.importlib.util, "find_spec",
                      lambda name: object() if name == "jax_cuda12_plugin" else None)
  assert not cli.keep_freed_host_memory()  # an accelerator plugin computes elsewhere


# train.py run the ways a program other than the shell runs it: from a program read from
# standard input, and from a driver script that does work before and after it.
_TRAIN_ARGS = ["train.py", "--config=tests/tiny_config.py", "--config.num_train_steps=2",
               "--config.checkpoint_every_steps=2", "--config.eval_every_steps=2"]
_THROUGH_RUNPY = """
import runpy, sys
print("driver started", flush=True)
sys.argv = {argv!r}
try:
  runpy.run_path("train.py", run_name="__main__")
except SystemExit as e:
  print("train.py ended with", e.code or 0, flush=True)
print("driver goes on", flush=True)
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


# A process of a multi-process run that failed alone (`errors.FailedAlone`, raised from its
# error): `leave` says with which status the launcher ends it.
_FAILED_ALONE = """
import os, sys
from transformer import cli
from transformer import errors

def leave(status):
  print(f"left with {{status}}", file=sys.stderr, flush=True)
  os._exit(status)

def main(argv):
  try:
    raise {}
  except BaseException as e:
    raise errors.FailedAlone("process 1 of 2 failed: the error; every process of the run "
                             "stops; the next run resumes from checkpoint 4", leave) from e
cli.run(main)
"""
_LINE = ("error: process 1 of 2 failed: the error; every process of the run stops; the next "
         "run resumes from checkpoint 4")


@pytest.mark.parametrize("raised, status, last_lines, traceback", [
    ("RuntimeError('the data loader broke')", 1, [_LINE], True),
    ("KeyboardInterrupt()", 130, [_LINE], False),
    ("errors.ConfigError('/data/train.de line 7: invalid UTF-8')", 2,
     ["error: /data/train.de line 7: invalid UTF-8"], False),
])
def test_a_process_that_failed_alone_ends_with_its_line_and_leaves_at_once(raised, status,
                                                                            last_lines,
                                                                            traceback):
  """Its own error's line where a user can fix it, else the line every process of the run
  ends with, after the error's traceback; then `leave` with the status, not `sys.exit`."""
  result = subprocess.run([sys.executable, "-c", _FAILED_ALONE.format(raised)], cwd=REPO,
                          capture_output=True, text=True, env=_env())
  lines = result.stderr.strip().splitlines()
  assert result.returncode == status, result.stderr
  assert lines[-2:] == [*last_lines, f"left with {status}"], result.stderr
  assert ("Traceback (most recent call last)" in result.stderr) == traceback, result.stderr
  if traceback:
    assert "RuntimeError: the data loader broke" in result.stderr
