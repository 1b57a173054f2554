"""Test set-up: 8 fake CPU devices so multi-device code runs on any machine, the two compile
settings, one compilation cache for the session, and the trained workdirs that the end-to-end
tests share."""

import os
import pathlib
import shutil
import tempfile

# Must happen before jax is imported anywhere.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
# Tests compile the same small programs in many places (and in subprocesses): JAX's persistent
# compilation cache keeps every program for the session, in a folder that pytest-xdist's
# workers share (the main process makes it before they start; they inherit the variable).
_IS_WORKER = "PYTEST_XDIST_WORKER" in os.environ
if not _IS_WORKER:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="transformer-test-xla-")
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
# Most tests compile many small programs that then run for milliseconds: they compile as
# Flax's examples' tests do, with `jax_disable_most_optimizations`, and so do the processes
# they start. The tests marked `reference_numerics` compile at XLA's defaults, as users'
# programs do (`pytest_runtest_setup` below).
os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
# Two workers keep both cores busy: a thread pool of PyTorch's OpenMP or NumPy's OpenBLAS
# would spin between calls waiting for a core the other worker holds.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import filelock  # noqa: E402
import jax  # noqa: E402
import pytest  # noqa: E402

from tests import support  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
TRAINED_STEPS = 120


def use_compile_setting(reference: bool) -> None:
  """XLA's defaults for a test marked `reference_numerics`, `jax_disable_most_optimizations`
  for the others."""
  fast = not reference
  if jax.config.read("jax_disable_most_optimizations") != fast:
    jax.config.update("jax_disable_most_optimizations", fast)
    # JAX's in-memory caches do not key their programs on this setting (the persistent cache
    # does, through the compile options): a program compiled under the other one must go.
    jax.clear_caches()


def pytest_collection_modifyitems(items):
  """Within each test file, the tests marked `reference_numerics` run after the others (each
  in its file's order), so the compile setting changes once per file, not at every marked test
  (each change empties JAX's in-memory caches)."""
  files = {}
  for item in items:
    files.setdefault(item.path, len(files))
  items.sort(key=lambda item: (files[item.path],
                               item.get_closest_marker("reference_numerics") is not None))


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures, which may compile
def pytest_runtest_setup(item):
  use_compile_setting(item.get_closest_marker("reference_numerics") is not None)


def pytest_sessionfinish(session, exitstatus):
  if not _IS_WORKER:
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


def session_folder(tmp_path_factory, name: str) -> pathlib.Path:
  """`name` in the session's temporary folder that every pytest-xdist worker sees at the same
  path (each worker's own base folder is one level below it); not created."""
  root = tmp_path_factory.getbasetemp()
  return (root.parent if _IS_WORKER else root) / name


@pytest.fixture(scope="session")
def synthetic_data_cache(tmp_path_factory) -> pathlib.Path:
  """A `config.data.cache_dir` that the session's workers and their train.py processes share,
  for the tests to which preparing the built-in synthetic pair is incidental (how train.py is
  started, its signals): its corpus, vocabulary and token caches are made once, under the
  library's own lock (`cache_lock`, as a sweep's runs share them). The tests of preparing
  data keep folders of their own."""
  return session_folder(tmp_path_factory, "synthetic-data-cache")


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """The real text the tests read in place (never copied into the project): ../shared/data,
  or $TRANSFORMER_SHARED_DATA. Without it the test is skipped with one line saying so, or
  fails where TRANSFORMER_REQUIRE_SHARED_DATA=1 (CI)."""
  return support.shared_data_or_skip()


def _trained_once(config, tmp_path_factory, name: str):
  """`(config, workdir)`: `config` trained for `TRAINED_STEPS` in the session folder `name`,
  saving and evaluating (dev loss, and dev BLEU on 16 sentences) halfway and at the end. The
  first worker to ask trains it; the others wait on the lock and read the same workdir
  (pytest-xdist's "Making session-scoped fixtures execute only once")."""
  from transformer.training import train_lib

  config.checkpoint_every_steps = config.eval_every_steps = TRAINED_STEPS // 2
  config.bleu_every_steps = TRAINED_STEPS // 2
  config.bleu_num_sentences = 16
  workdir = session_folder(tmp_path_factory, name)
  done = workdir.with_name(f"{name}.done")
  with filelock.FileLock(f"{workdir}.lock"):
    if not done.exists():
      shutil.rmtree(workdir, ignore_errors=True)  # what a failed attempt left
      train_lib.train_and_evaluate(config, str(workdir))
      done.touch()
  return config, workdir


def _copy(trained, tmp_path):
  config, workdir = trained
  copy = tmp_path / "trained"
  shutil.copytree(workdir, copy)
  return config.copy_and_resolve_references(), copy


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
  """`(config, workdir)`: a tiny model trained on the built-in synthetic pair for 120 steps,
  checkpoints at 60 and 120, dev loss and dev BLEU (16 sentences) logged at 60 and 120; for
  the end-to-end tests about training, resuming and reading a workdir, which need no real
  text. Tests only read it: a test that changes the workdir works on a copy
  (`copy_of_trained`)."""
  return _trained_once(support.synthetic_tiny(steps=TRAINED_STEPS), tmp_path_factory,
                       "trained")


@pytest.fixture
def copy_of_trained(trained, tmp_path):
  """`(config, workdir)`: a private copy of the trained workdir, to change freely."""
  return _copy(trained, tmp_path)


@pytest.fixture(scope="session")
def trained_on_tatoeba(shared_data, tmp_path_factory):
  """`(config, workdir)`: as `trained`, on Tatoeba (the shared data), for the tests that
  translate English, score Tatoeba's test split or compare with configs/tatoeba_small.py."""
  return _trained_once(support.tatoeba_tiny(shared_data, steps=TRAINED_STEPS),
                       tmp_path_factory, "trained_on_tatoeba")


@pytest.fixture
def copy_of_trained_on_tatoeba(trained_on_tatoeba, tmp_path):
  """`(config, workdir)`: a private copy of the Tatoeba workdir, to change freely."""
  return _copy(trained_on_tatoeba, tmp_path)
