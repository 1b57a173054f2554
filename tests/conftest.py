"""Test set-up: 8 fake CPU devices so multi-device code runs on any machine, two compile
settings (XLA's defaults for the tests that compare with an independent reference, in a
process of their own; fast compiling for the rest), one compilation cache for the session (its
subprocesses included), and one trained workdir shared by the end-to-end tests."""

import gc
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata

# Must happen before jax is imported anywhere.
os.environ["JAX_PLATFORMS"] = "cpu"
_IS_WORKER = "PYTEST_XDIST_WORKER" in os.environ
_DEVICES_FLAG = "--xla_force_host_platform_device_count=8"
# The tests compile hundreds of small programs whose run time is milliseconds, so compiling
# fast matters more than running fast: LLVM's optimisation of the generated code is skipped,
# and fusions are emitted by XLA's older element-wise emitter, which together compile a beam
# search in a sixth of the defaults' CPU time (docs/testing.md); and each program's machine
# code is generated as one LLVM module rather than split into parts compiled on threads: on 2
# busy cores the split costs a fifth to a quarter of a compile's CPU seconds and saves no wall
# time (docs/testing.md). Every test but those marked `reference_numerics` compiles so, and so
# do the subprocesses that set XLA_FLAGS themselves (for another device count), through
# FAST_XLA_FLAGS.
_FAST_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false",
               "--xla_cpu_parallel_codegen_split_count=1")
# The tests marked `reference_numerics` check the library's numbers against an independent
# reference, and compile with XLA's default options, as users' programs are: a session moves
# them into one child pytest process with XLA_FLAGS holding the device count alone
# (`ReferenceNumerics` below). In that child (and wherever it is set by hand),
# TRANSFORMER_TEST_COMPILE=xla_defaults compiles every test in-process at XLA's defaults.
XLA_DEFAULTS = os.environ.get("TRANSFORMER_TEST_COMPILE") == "xla_defaults"


def _known_to_xla(flags: tuple[str, ...]) -> tuple[str, ...]:
  """The flags this XLA knows (an unknown flag in XLA_FLAGS aborts the process, and
  xla_cpu_use_fusion_emitters is a transitional flag), asked of child processes before this
  one starts its backend."""

  def known(group):
    env = dict(os.environ, XLA_FLAGS=" ".join(group))
    return subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                          capture_output=True).returncode == 0

  return flags if known(flags) else tuple(f for f in flags if known([f]))


# The main process asks once; xdist's workers and every child inherit the answer.
if "TRANSFORMER_TEST_FAST_XLA_FLAGS" not in os.environ:
  os.environ["TRANSFORMER_TEST_FAST_XLA_FLAGS"] = " ".join(_known_to_xla(_FAST_FLAGS))
FAST_XLA_FLAGS = os.environ["TRANSFORMER_TEST_FAST_XLA_FLAGS"]
os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split()
     if f != _DEVICES_FLAG and f not in _FAST_FLAGS]
    + [_DEVICES_FLAG] + ([] if XLA_DEFAULTS else FAST_XLA_FLAGS.split()))
# Tests compile the same small programs in many places (and in subprocesses): keep every
# compiled program for the session, in a folder of its own that pytest-xdist's workers share
# (the main process makes it before they start; they inherit the variable). The cache key
# holds the XLA flags, so the two settings never share a program.
_CACHE = (os.environ["TRANSFORMER_TEST_XLA_CACHE"] if _IS_WORKER
          else tempfile.mkdtemp(prefix="transformer-test-xla-"))
os.environ["TRANSFORMER_TEST_XLA_CACHE"] = os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
# The two workers keep both cores busy; a thread pool of PyTorch's OpenMP or of NumPy's
# OpenBLAS would spin between calls, waiting for work that the other core's worker needs the
# core for (4% and 1% of the CPU samples of the model, decoding, research and export tests;
# 6% of the CPU seconds of the tests that call PyTorch most, docs/testing.md). One thread each,
# in the workers and every process they start. Their results are compared within tolerances.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from tests import frame_stack  # noqa: E402

# CPython 3.11 maps and unmaps its frame stack chunk by chunk as calls go deep and return: a
# quarter of a tracing test's CPU seconds in the kernel. The main process builds a small library
# that keeps the chunks on the C heap, and the workers and every process they start load it
# (tests/frame_stack.py; a test run in this process itself, with -n0, goes without).
_PRELOAD = None
if frame_stack.ENV not in os.environ:
  _PRELOAD = tempfile.mkdtemp(prefix="transformer-test-preload-")
  os.environ[frame_stack.ENV] = frame_stack.install(_PRELOAD)

import pytest  # noqa: E402

from tests import reference_numerics, support  # noqa: E402
from tests.reference_numerics import ReferenceNumerics  # noqa: E402
from transformer import cli  # noqa: E402

if not _IS_WORKER:  # the reference child's folder, which the workers share (as the cache)
  os.environ[reference_numerics.ENV] = tempfile.mkdtemp(prefix="transformer-test-reference-")

cli.keep_freed_host_memory()  # the entry points' setting, in-process; before a backend starts

REPO = pathlib.Path(__file__).resolve().parents[1]
TRAINED_STEPS = 120


def pytest_collection_finish(session):
  reference_numerics.start_if_collected(session)
  # The test modules and what they import are loaded: as the entry points do once their
  # imports are done, keep the garbage collector's full collections from walking them again
  # for the rest of the session.
  cli.freeze_imported_objects()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  yield
  # A module's tests are done and its fixtures torn down: collect what it left, then freeze
  # what is still alive (session fixtures, JAX's caches), so that no later collection walks it
  # again. A worker otherwise ends with a million objects that every full collection walks:
  # orbax's failed restores collect twice each (`orbax_failures`), 0.3 s a time late in a
  # session (docs/testing.md, "Garbage collection in the workers").
  if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session, exitstatus):
  if not _IS_WORKER:
    reference_numerics.stop_if_running()
    shutil.rmtree(_CACHE, ignore_errors=True)
    shutil.rmtree(os.environ[reference_numerics.ENV], ignore_errors=True)
  if _PRELOAD:
    shutil.rmtree(_PRELOAD, ignore_errors=True)


def pytest_report_header(config):
  return f"frame stack on the C heap (tests/frame_stack.py): {os.environ[frame_stack.ENV]}"


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
# seconds (docs/testing.md). A long group left out of this list goes out last and keeps one
# worker busy after the other is done. xdist keeps this order with `--no-loadscope-reorder`; by default
# it would sort the groups by their number of tests.
_LONGEST_GROUPS = ("training/test_multihost", "training/test_multihost_faults", "trained",
                   "model/test_model", "training/test_parallel", "decoding/test_beam_cache",
                   "training/test_preemption", "run/test_checkpoint", "test_cli",
                   "research/test_sweep", "benchmarks/test_against", "decoding/test_translate",
                   "run/test_compilation", "model/test_positions", "research/test_params",
                   "decoding/test_decode")


def _group(nodeid: str) -> str:
  """"trained", or the module's path in tests/ ("model/test_model")."""
  module = nodeid.split("::")[0]
  return "trained" if module in _TRAINED_MODULES else module.removeprefix("tests/")[:-3]


@pytest.hookimpl(tryfirst=True)  # before -m reads the markers and xdist reads the groups
def pytest_collection_modifyitems(session, config, items):
  for item in items:
    group = _group(item.nodeid)
    if _TRAINED_FIXTURES & set(item.fixturenames) and group != "trained":
      raise pytest.UsageError(f"{item.nodeid} uses a trained workdir: add its module to "
                              "_TRAINED_MODULES in tests/conftest.py")
    item.add_marker(pytest.mark.xdist_group(group))
  reference = [item.nodeid for item in items if item.get_closest_marker("reference_numerics")]
  if reference and not XLA_DEFAULTS:
    items[:] = [item for item in items if not item.get_closest_marker("reference_numerics")]
    items.append(ReferenceNumerics.from_parent(
        session, name="reference_numerics_at_xla_defaults", nodeids=reference, repo=REPO,
        xla_flags=_DEVICES_FLAG))
  # The groups longest first; the child's item last, since its child runs in the background
  # from the start (tests/reference_numerics.py) and the item only waits for it.
  rank = {group: i for i, group in enumerate(_LONGEST_GROUPS)}
  items.sort(key=lambda item: len(rank) + 1 if isinstance(item, ReferenceNumerics) else
             rank.get(_group(item.nodeid), len(rank)))


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
  library's own lock (`cache_lock`, as a sweep's runs share them), where each fresh folder
  would take 3 CPU seconds. The tests of preparing data keep folders of their own."""
  return session_folder(tmp_path_factory, "synthetic-data-cache")


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

  config.checkpoint_every_steps = config.eval_every_steps = TRAINED_STEPS // 2
  config.bleu_every_steps = TRAINED_STEPS // 2
  config.bleu_num_sentences = 16
  train_lib.train_and_evaluate(config, str(workdir))
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
