"""Test set-up: 8 fake CPU devices so multi-device code runs on any machine, two compile
settings (XLA's defaults for the tests that compare with an independent reference, fast
compiling for the rest), one compilation cache for the session (its subprocesses included),
and one trained workdir shared by the end-to-end tests."""

import functools
import os
import pathlib
import shutil
import tempfile
from importlib import metadata

# Must happen before jax is imported anywhere.
os.environ["JAX_PLATFORMS"] = "cpu"
# 8 devices, and otherwise XLA's own flags: the compiler users run. (xdist's workers inherit
# the main process's variables and run this again.)
_DEVICES_FLAG = "--xla_force_host_platform_device_count=8"
if _DEVICES_FLAG not in os.environ.get("XLA_FLAGS", "").split():
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICES_FLAG}".strip()
# The tests compile hundreds of small programs whose run time is milliseconds, so compiling
# fast matters more than running fast: every process of the session (its subprocesses
# included) skips LLVM's optimisation of the generated code, except while a test marked
# `reference_numerics` runs (`_compile_fast`). docs/testing.md has the figures.
os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
# Tests compile the same small programs in many places (and in subprocesses): keep every
# compiled program for the session, in a folder of its own that pytest-xdist's workers share
# (the main process makes it before they start; they inherit the variable). The cache key
# holds the compile options, so the two settings never share a program.
_IS_WORKER = "PYTEST_XDIST_WORKER" in os.environ
_CACHE = (os.environ["TRANSFORMER_TEST_XLA_CACHE"] if _IS_WORKER
          else tempfile.mkdtemp(prefix="transformer-test-xla-"))
os.environ["TRANSFORMER_TEST_XLA_CACHE"] = os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"

import pytest  # noqa: E402

from tests import support  # noqa: E402
from transformer import cli  # noqa: E402

cli.keep_freed_host_memory()  # the entry points' setting, in-process; before a backend starts

REPO = pathlib.Path(__file__).resolve().parents[1]
TRAINED_STEPS = 120

# The tests that check the library's numbers against an independent reference carry the
# marker `reference_numerics` (in their modules: `pytestmark`, a decorator, or one parameter's
# `marks`) and compile with XLA's default options, as users' programs are compiled (`pytest -m
# reference_numerics` runs them alone); tests/test_compile_settings.py checks both settings.
# docs/testing.md lists them.

# Subprocesses that set XLA_FLAGS themselves (for another device count) take these: LLVM's
# optimisation skipped and fusions emitted by XLA's older element-wise emitter, which
# together compile a beam search in a fifth of the defaults' CPU time (docs/testing.md).
_FAST_XLA_FLAGS = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


@functools.cache
def fast_xla_flags() -> str:
  """`_FAST_XLA_FLAGS` as XLA_FLAGS, less those this XLA does not know: an unknown flag there
  aborts the process, and xla_cpu_use_fusion_emitters is a transitional flag."""
  import jax

  lowered = jax.jit(lambda x: x + 1).lower(0.0)
  known = []
  for name, value in _FAST_XLA_FLAGS.items():
    try:
      lowered.compile({name: value})
    except jax.errors.JaxRuntimeError:  # "No such compile option"
      continue
    known.append(f"--{name}={str(value).lower()}")
  return " ".join(known)


def _compile_fast(fast: bool) -> bool:
  """Switches this process between fast compiling and XLA's defaults; returns the setting it
  had."""
  import jax

  had = jax.config.read("jax_disable_most_optimizations")
  if fast != had:
    jax.config.update("jax_disable_most_optimizations", fast)
    # jit's in-memory caches are not keyed on the setting (the persistent cache's key is).
    jax.clear_caches()
  return had


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  # Before the test's fixtures, which compile under the test's setting.
  _compile_fast(not _is_reference(item))


def pytest_sessionfinish(session, exitstatus):
  if not _IS_WORKER:
    shutil.rmtree(_CACHE, ignore_errors=True)


# pytest-xdist (pyproject.toml runs two workers, `--dist loadgroup`) hands out whole groups of
# tests, each named by an `xdist_group` marker: a module's tests run in one worker, so its
# module fixtures are built once, and the modules that use the trained workdirs run in one
# worker, so each is trained once.
_TRAINED_FIXTURES = {"trained", "copy_of_trained", "trained_on_tatoeba",
                     "copy_of_trained_on_tatoeba"}
_TRAINED_MODULES = {"tests/evaluation/test_evaluate_lib.py", "tests/research/test_inspection.py",
                    "tests/research/test_report.py", "tests/training/test_train_lib.py",
                    "tests/export/test_ctranslate2_export.py",
                    "tests/export/test_huggingface_export.py"}
# The longest groups go out first, so that the workers end together: the multi-host tests
# (2-3 min on 2 cores, much of it waiting for heartbeat timeouts), then the others by their CPU
# seconds (docs/testing.md). xdist keeps this order with `--no-loadscope-reorder`; by default
# it would sort the groups by their number of tests.
_LONGEST_GROUPS = ("training/test_multihost", "trained", "model/test_model",
                   "training/test_parallel", "decoding/test_beam_cache",
                   "training/test_preemption", "run/test_checkpoint", "test_cli",
                   "research/test_sweep", "benchmarks/test_against", "decoding/test_translate",
                   "run/test_compilation", "model/test_positions", "research/test_params",
                   "decoding/test_decode")


def _group(nodeid: str) -> str:
  """"trained", or the module's path in tests/ ("model/test_model")."""
  module = nodeid.split("::")[0]
  return "trained" if module in _TRAINED_MODULES else module.removeprefix("tests/")[:-3]


def _is_reference(item) -> bool:
  return item.get_closest_marker("reference_numerics") is not None


@pytest.hookimpl(tryfirst=True)  # before -m reads the markers and xdist reads the groups
def pytest_collection_modifyitems(config, items):
  for item in items:
    group = _group(item.nodeid)
    if _TRAINED_FIXTURES & set(item.fixturenames) and group != "trained":
      raise pytest.UsageError(f"{item.nodeid} uses a trained workdir: add its module to "
                              "_TRAINED_MODULES in tests/conftest.py")
    item.add_marker(pytest.mark.xdist_group(group))
  # Within a group, the reference tests first: one switch of compile setting per group.
  rank = {group: i for i, group in enumerate(_LONGEST_GROUPS)}
  items.sort(key=lambda item: (rank.get(_group(item.nodeid), len(rank)),
                               not _is_reference(item)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
  # Workers tell the main process each test's group as a suffix of its node id; on pytest 9.2
  # that suffix is lost (pytest-dev/pytest-xdist#1386) and every test would go out on its own:
  # each worker would train the workdirs and build every module's fixtures.
  if node.config.getoption("dist") == "loadgroup" and ids and "@" not in ids[0]:
    raise pytest.UsageError(
        f"pytest-xdist {metadata.version('pytest-xdist')} does not group tests on pytest "
        f"{pytest.__version__} (pytest-dev/pytest-xdist#1386): pip install 'pytest<9.2', as "
        "pyproject.toml's test extra says, or run with -n0")


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """The real text the tests read in place (never copied into the project): ../shared/data,
  or $TRANSFORMER_SHARED_DATA. Without it the test is skipped with one line saying so, or
  fails where TRANSFORMER_REQUIRE_SHARED_DATA=1 (CI)."""
  return support.shared_data_or_skip()


def _train(config, workdir: pathlib.Path):
  """Trains `config` (a `support.*_tiny` config) for `TRAINED_STEPS` in `workdir`, saving and
  evaluating (dev loss, and dev BLEU on 16 sentences) halfway and at the end."""
  from transformer.training import train_lib

  # A fixture, not a comparison: fast, whichever test asks for it first.
  was_fast = _compile_fast(True)
  config.checkpoint_every_steps = config.eval_every_steps = TRAINED_STEPS // 2
  config.bleu_every_steps = TRAINED_STEPS // 2
  config.bleu_num_sentences = 16
  try:
    train_lib.train_and_evaluate(config, str(workdir))
  finally:
    _compile_fast(was_fast)
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
  text. A test that changes the workdir works on a copy (`copy_of_trained`).
  """
  return _train(support.synthetic_tiny(steps=TRAINED_STEPS), tmp_path_factory.mktemp("trained"))


@pytest.fixture
def copy_of_trained(trained, tmp_path):
  """`(config, workdir)`: a private copy of the trained workdir, to change freely."""
  return _copy(trained, tmp_path)


@pytest.fixture(scope="session")
def trained_on_tatoeba(shared_data, tmp_path_factory):
  """`(config, workdir)`: as `trained`, on Tatoeba (the shared data), for the tests that
  translate English, score Tatoeba's test split or compare with configs/tatoeba_small.py."""
  return _train(support.tatoeba_tiny(shared_data, steps=TRAINED_STEPS),
                tmp_path_factory.mktemp("trained_on_tatoeba"))


@pytest.fixture
def copy_of_trained_on_tatoeba(trained_on_tatoeba, tmp_path):
  """`(config, workdir)`: a private copy of the Tatoeba workdir, to change freely."""
  return _copy(trained_on_tatoeba, tmp_path)
