"""The launcher shared by the command-line entry points (train.py, evaluate.py, `python -m`
tools): process set-up, flag parsing, and one-line errors instead of tracebacks.

`run(main)` is `absl.app.run(main)` that
- on the CPU, sets glibc's allocator to keep the memory a step frees for the next one
  (`keep_freed_host_memory`, before JAX starts its backend);
- quiets TensorFlow's C++ logging (tensorflow-datasets imports it to read TFDS data);
- turns what a user can fix into one line on stderr and exit status 2: a missing config file,
  an unknown `--config.` key (with the closest known key), a bad flag value, and any
  `ConfigError`, `FileNotFoundError` or `DiskFull` (out of disk space or quota) raised by the
  program;
- ends a run stopped by a signal (`errors.Stopped`) with its one line and exit status 0
  (SIGTERM) or 130 (SIGINT), and a diverged one (`errors.Diverged`) with one line and 1;
- ends a process of a multi-process run that failed alone (`errors.FailedAlone`: the others
  stop too) with its line last, after any traceback, and leaves past JAX's shutdown barrier.

`check_backend()`, which the entry points call once JAX may start its backends (after
`jax.distributed.initialize`), refuses to run on the CPU when an accelerator was installed or
is present but JAX cannot use it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import difflib
import importlib.util
import logging as pylogging
import os
import re
import runpy
import sys
import traceback
from typing import Callable

from absl import app, flags, logging

from transformer.errors import ConfigError, Diverged, DiskFull, FailedAlone, Stopped

USER_ERRORS = (ConfigError, FileNotFoundError, DiskFull)
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
PROJECT_DIR = os.path.dirname(PACKAGE_DIR)
_INSTALL_FOLDERS = {"site-packages", "dist-packages"}

# glibc's allocator kept from handing freed memory back (`keep_freed_host_memory`): the
# mallopt(3) parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# Accelerator plugins for jax; with one installed, the CPU is not where the steps run.
_ACCELERATOR_MODULES = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin",
                        "jax_rocm7_plugin", "libtpu")
# Device files that show a GPU on this machine, and the install that uses it.
_GPU_DEVICE_FILES = {"/dev/nvidiactl": "pip install -e '.[cuda12]' (or '.[cuda13]')",
                     "/dev/kfd": "jax's ROCm build (jax[rocm7-local], see jax's install guide)"}


def _chosen_platform() -> str:
  """The platform JAX_PLATFORMS puts first ('cpu', 'cuda', ...), the one JAX then computes on
  by default; '' when it is unset."""
  return os.environ.get("JAX_PLATFORMS", "").strip().lower().split(",")[0]


def computes_on_cpu() -> bool:
  """Whether JAX will run on the CPU, judged without starting a backend."""
  platform = _chosen_platform()
  if platform:
    return platform == "cpu"
  return not any(importlib.util.find_spec(m) is not None for m in _ACCELERATOR_MODULES)


def _keeps_freed_memory() -> bool:
  """Whether freed host memory should be kept (see `keep_freed_host_memory`): JAX computes on
  the CPU, the C library is glibc, and TRANSFORMER_KEEP_FREED_MEMORY is not 0."""
  if os.environ.get("TRANSFORMER_KEEP_FREED_MEMORY", "1") == "0" or not computes_on_cpu():
    return False
  try:
    return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
  except (AttributeError, ValueError, OSError):  # no confstr, or a C library without the name
    return False


def keep_freed_host_memory() -> bool:
  """On the CPU, sets glibc's allocator to keep the memory a step frees for the next one;
  returns whether it did. Must come before JAX starts its CPU backend, whose threads take
  their heaps at start (`run` calls it first).

  XLA:CPU allocates each step's buffers with the C library's allocator and frees them when the
  step ends. The largest (the `[B, T, V]` logits and their gradient) are hundreds of megabytes,
  and glibc hands blocks that large straight back to the kernel (`mmap`/`munmap`, and trimming
  of per-thread heaps), so the next step page-faults and zeroes every page again (a base train
  step on 2 CPU cores: 11.1-11.4 s kept, 14.4-15.0 s not; docs/performance.md). Three
  mallopt(3) settings keep them: no `mmap` for large blocks, no trimming, one heap for all
  threads (per-thread heaps are released page by page). The process then holds its peak
  memory until it exits, as a training or evaluation run does anyway. Nothing happens on
  other C libraries, where an accelerator plugin is installed and JAX_PLATFORMS does not say
  `cpu`, or when TRANSFORMER_KEEP_FREED_MEMORY=0.
  """
  if not _keeps_freed_memory():
    return False
  libc = ctypes.CDLL(ctypes.util.find_library("c"))
  ok = libc.mallopt(_M_MMAP_MAX, 0)
  ok &= libc.mallopt(_M_TRIM_THRESHOLD, -1)  # -1: never trim (mallopt(3))
  ok &= libc.mallopt(_M_ARENA_MAX, 1)
  return bool(ok)


def check_backend() -> None:
  """Raises `ConfigError` when JAX would run on the CPU although an accelerator is installed
  or present: an accelerator extra whose plugin found no device, or a GPU on a machine whose
  install has no GPU support (pip only warns about an extra the project does not have, and
  then installs the CPU build). JAX_PLATFORMS=cpu runs on the CPU on purpose."""
  if _chosen_platform() == "cpu":
    return
  import jax  # starts the backends: after jax.distributed.initialize

  if jax.default_backend() != "cpu":
    return
  plugins = [m for m in _ACCELERATOR_MODULES if importlib.util.find_spec(m) is not None]
  if plugins:
    raise ConfigError(f"{', '.join(plugins)} is installed but JAX found no accelerator and "
                      "would run on the CPU (JAX's log says why: driver, CUDA or TPU runtime "
                      "version); fix that, or set JAX_PLATFORMS=cpu to run on the CPU")
  for path, install in _GPU_DEVICE_FILES.items():
    if os.path.exists(path):
      raise ConfigError(f"this machine has a GPU ({path}) but JAX would run on the CPU: this "
                        f"install has no GPU support; install it with {install}, or set "
                        "JAX_PLATFORMS=cpu to run on the CPU")


class OwnInfoOnly(pylogging.Filter):
  """Keeps INFO lines from this project's files (the package, wherever it is installed, and a
  source checkout's entry points and benchmarks); libraries (orbax logs every save step by
  step at INFO) still get through at WARNING and above."""

  def __init__(self, package_dir: str = PACKAGE_DIR, project_dir: str = PROJECT_DIR):
    super().__init__()
    self.package_dir = os.path.join(package_dir, "")
    # The folder above the package is a checkout (train.py, benchmarks/) unless the package
    # was installed into site-packages, where that folder holds every other library too.
    self.checkout_dir = (None if os.path.basename(project_dir) in _INSTALL_FOLDERS
                         else os.path.join(project_dir, ""))

  def filter(self, record: pylogging.LogRecord) -> bool:
    if record.levelno >= pylogging.WARNING or record.pathname.startswith(self.package_dir):
      return True
    if self.checkout_dir is None or not record.pathname.startswith(self.checkout_dir):
      return False
    inside = record.pathname[len(self.checkout_dir):].split(os.sep)
    return not _INSTALL_FOLDERS & set(inside)  # a virtual environment inside the checkout


def fail(message: str, status: int = 2) -> None:
  """Prints `error: message` on stderr and exits with `status`."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(status)


def _config_file(argv: list[str]) -> tuple[str, str | None] | None:
  """`(path, argument)` of `--config=path[:argument]`, or None when there is no such flag."""
  for arg in argv[1:]:
    if arg.startswith("--config="):
      path, _, argument = arg[len("--config="):].partition(":")
      return path, argument or None
  return None


def _unknown_override(argv: list[str], config=None) -> str | None:
  """`unknown config key K; did you mean M?` for the first `--config.K` that `config` (by
  default the one `--config=FILE` makes) lacks."""
  if config is None:
    spec = _config_file(argv)
    if spec is None:
      return None
    get_config = runpy.run_path(spec[0])["get_config"]
    config = get_config(spec[1]) if spec[1] is not None else get_config()
  for arg in argv[1:]:
    if not arg.startswith("--config."):
      continue
    key = arg[len("--config."):].split("=", 1)[0]
    node, parts = config, key.split(".")
    for depth, part in enumerate(parts):
      if not hasattr(node, "keys") or part not in node:
        siblings = list(node.keys()) if hasattr(node, "keys") else []
        close = difflib.get_close_matches(part, siblings, n=1)
        parent = ".".join(parts[:depth])
        hint = (f"; did you mean {'.'.join([parent, close[0]]).lstrip('.')}?" if close
                else f"; {parent or 'the config'} has {', '.join(sorted(siblings))}")
        return f"unknown config key {key}{hint}"
      node = node[part]
  return None


def _config_file_error(error: BaseException | None) -> str | None:
  """The message of a `ConfigError` that the config file's `get_config` raised (an unknown
  variant name, say). ml_collections and absl re-raise it wrapped in multi-line messages; the
  original, one line, is the last `ConfigError` down the chain."""
  found = None
  while error is not None:
    if isinstance(error, ConfigError):
      found = error
    error = error.__cause__ or error.__context__
  return str(found) if found is not None else None


def config_flag_error(argv: list[str], error: BaseException, config=None) -> str:
  """One line for an error raised while parsing `--config=…` and `--config.K=V` in `argv`:
  the config file's own `ConfigError`, an unknown key (with the closest known key), or the
  first line of the flag library's message. `config` is the config the overrides apply to
  when it comes from no file (`define_config`)."""
  # ml_collections raises KeyError/AttributeError for an override of a key the config does
  # not have; name it with the closest key instead of an escaped repr.
  return (_config_file_error(error) or _unknown_override(argv, config)
          or (str(error).strip().splitlines() or [type(error).__name__])[0])


def config_file_given(argv: list[str]) -> bool:
  """Whether `argv` names a config file (`--config=FILE` or `--config FILE`)."""
  return any(re.match(r"--?config(=|$)", arg) for arg in argv[1:])


def define_config(config, argv: list[str], help_string: str) -> flags.FlagHolder:
  """Defines `--config` as `config` itself (a workdir's saved config, say) rather than a file,
  with the `--config.KEY=VALUE` overrides of `argv` applied to it when flags are parsed. An
  unknown key is the same one line as over a config file: `error: unknown config key K; did
  you mean M?`, exit status 2.
  """
  from ml_collections import config_flags

  try:
    # ml_collections defines a flag for each override in `argv` now, resolving its key.
    return config_flags.DEFINE_config_dict("config", config, help_string, sys_argv=argv)
  except (KeyError, AttributeError, flags.Error) as e:
    fail(config_flag_error(argv, e, config))


def _parse_flags(argv: list[str]) -> list[str]:
  spec = _config_file(argv)
  if spec is not None and not os.path.isfile(spec[0]):
    fail(f"--config={spec[0]}: no such file; pass a config file such as configs/base.py")
  try:
    return flags.FLAGS(argv)
  except (KeyError, AttributeError, flags.Error) as e:
    fail(config_flag_error(argv, e))


def run(main: Callable[[list[str]], object]) -> None:
  """`app.run(main)` with the launcher's process set-up and one-line errors for user
  mistakes (see the module docstring)."""
  keep_freed_host_memory()
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # TensorFlow only reads TFDS data here

  def wrapped(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.set_verbosity(logging.INFO)
    logging.get_absl_handler().addFilter(OwnInfoOnly())
    try:
      return main(argv)
    except FailedAlone as e:  # the other processes of the run are leaving without this one
      line, status = _ending(e.__cause__, e.line)
      print(line, file=sys.stderr)
      e.leave(status)  # at once, past JAX's shutdown barrier
    except (*USER_ERRORS, Stopped, Diverged) as e:
      line, status = _ending(e)
      print(line, file=sys.stderr)
      sys.exit(status)

  app.run(wrapped, flags_parser=_parse_flags)


def _ending(error: BaseException, failed_alone: str = "") -> tuple[str, int]:
  """The last line and the exit status of a command that `error` ended. `failed_alone` is
  the line of a process of a multi-process run that failed alone (the others stop too):
  there, an error that is not a user's ends with that line, after its traceback."""
  if isinstance(error, USER_ERRORS):
    return f"error: {error}", 2
  if isinstance(error, Stopped):
    return str(error), error.exit_code
  if isinstance(error, Diverged):
    return f"error: {error}", 1
  if isinstance(error, KeyboardInterrupt):
    return f"error: {failed_alone}", 130
  traceback.print_exception(error)
  return f"error: {failed_alone}", 1
