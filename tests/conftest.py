"""Test set-up: 8 fake CPU devices so multi-device code runs on any machine, one compilation
cache for the session (its subprocesses included), and one trained workdir shared by the
end-to-end tests."""

import os
import pathlib
import shutil
import tempfile

# Must happen before jax is imported anywhere.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
# Tests compile the same small programs in many places (and in subprocesses): keep every
# compiled program for the session, in a folder of its own.
_CACHE = tempfile.mkdtemp(prefix="transformer-test-xla-")
os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"

import pytest  # noqa: E402

from tests import support  # noqa: E402
from transformer import cli  # noqa: E402

cli.keep_freed_host_memory()  # as the entry points do, before a backend starts

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
TRAINED_STEPS = 200


def pytest_sessionfinish(session, exitstatus):
  shutil.rmtree(_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """`../shared/data`, the real text the tests read (never copied into the project)."""
  if not SHARED_DATA.is_dir():
    pytest.fail(f"{SHARED_DATA} is missing: these tests need the shared data folder beside "
                "the checkout (see ../shared/data/README.md)")
  return SHARED_DATA


@pytest.fixture(scope="session")
def trained(shared_data, tmp_path_factory):
  """`(config, workdir)`: a tiny model trained on Tatoeba for 200 steps, checkpoints at 100
  and 200, dev loss and dev BLEU (16 sentences) logged at 100 and 200.

  Shared by the end-to-end tests: a test that changes the workdir works on a copy
  (`copy_of_trained`).
  """
  from transformer import train_lib

  config = support.tatoeba_tiny(shared_data, steps=TRAINED_STEPS)
  config.checkpoint_every_steps = config.eval_every_steps = TRAINED_STEPS // 2
  config.bleu_every_steps = TRAINED_STEPS // 2
  config.bleu_num_sentences = 16
  workdir = tmp_path_factory.mktemp("trained")
  train_lib.train_and_evaluate(config, str(workdir))
  return config, workdir


@pytest.fixture
def copy_of_trained(trained, tmp_path):
  """`(config, workdir)`: a private copy of the trained workdir, to change freely."""
  config, workdir = trained
  copy = tmp_path / "trained"
  shutil.copytree(workdir, copy)
  return config.copy_and_resolve_references(), copy
