"""Test set-up: 8 fake CPU devices so multi-device code runs on any machine, one compilation
cache for the session (its subprocesses included), and one trained workdir shared by the
end-to-end tests."""

import os
import pathlib
import shutil
import tempfile

# Must happen before jax is imported anywhere.
os.environ["JAX_PLATFORMS"] = "cpu"
# The tests compile hundreds of small programs whose run time is milliseconds, so compiling
# fast matters more than running fast. LLVM's optimisation of the generated CPU code (not of
# the computation, which XLA's HLO passes shape) is skipped, and fusions are emitted by XLA's
# older element-wise emitter, which compiles decoding loops in about 0.6x the time of the
# fusion emitters (tests/decoding/test_beam_cache.py + test_translate.py: 54 s -> 33 s, one
# process).
# Subprocesses that need another device count use FAST_COMPILE_FLAGS.
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8 "
    + FAST_COMPILE_FLAGS).strip()
# Tests compile the same small programs in many places (and in subprocesses): keep every
# compiled program for the session, in a folder of its own that pytest-xdist's workers share
# (the main process makes it before they start; they inherit the variable).
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


def pytest_sessionfinish(session, exitstatus):
  if not _IS_WORKER:
    shutil.rmtree(_CACHE, ignore_errors=True)


# pytest-xdist (pyproject.toml runs two workers) hands out whole groups of tests: a module's
# tests run in one worker, so its module fixtures are built once, and the modules that use the
# trained workdirs run in one worker, so each is trained once.
_TRAINED_FIXTURES = {"trained", "copy_of_trained", "trained_on_tatoeba",
                     "copy_of_trained_on_tatoeba"}
_TRAINED_MODULES = {"tests/evaluation/test_evaluate_lib.py", "tests/research/test_inspection.py",
                    "tests/research/test_report.py", "tests/training/test_train_lib.py",
                    "tests/export/test_ctranslate2_export.py",
                    "tests/export/test_huggingface_export.py"}
# The longest groups (each ~15-130 s on 2 cores) go out first, so that the workers end together
# (seconds per group measured with `pytest -v --durations=0`, summed per worker.)
_LONGEST_GROUPS = ("tests/training/test_multihost.py", "trained", "tests/model/test_model.py",
                   "tests/run/test_checkpoint.py", "tests/test_cli.py",
                   "tests/decoding/test_beam_cache.py", "tests/training/test_preemption.py",
                   "tests/training/test_parallel.py", "tests/research/test_sweep.py",
                   "tests/research/test_params.py", "tests/benchmarks/test_against.py",
                   "tests/run/test_compilation.py")


def _group(nodeid: str) -> str:
  module = nodeid.split("::")[0]
  return "trained" if module in _TRAINED_MODULES else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  from xdist.scheduler import LoadScopeScheduling

  # xdist would otherwise reorder the groups by their number of tests, undoing the longest-first
  # order that pytest_collection_modifyitems gives them.
  config.option.loadscopereorder = False

  class ByGroup(LoadScopeScheduling):
    def _split_scope(self, nodeid):
      return _group(nodeid)

  return ByGroup(config, log)


def pytest_collection_modifyitems(config, items):
  for item in items:
    if _TRAINED_FIXTURES & set(item.fixturenames) and _group(item.nodeid) != "trained":
      raise pytest.UsageError(f"{item.nodeid} uses a trained workdir: add its module to "
                              "_TRAINED_MODULES in tests/conftest.py")
  rank = {group: i for i, group in enumerate(_LONGEST_GROUPS)}
  items.sort(key=lambda item: rank.get(_group(item.nodeid), len(rank)))


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
