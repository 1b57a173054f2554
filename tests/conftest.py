"""Test set-up: 8 fake CPU devices so multi-device code runs on any machine."""

import os
import pathlib

# Must happen before jax is imported anywhere.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import pytest  # noqa: E402

from transformer import host_allocator  # noqa: E402

host_allocator.keep_freed_memory()  # as the entry points do, before a backend starts

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture
def shared_data() -> pathlib.Path:
  """`../shared/data`, the real text the tests read (never copied into the project)."""
  if not SHARED_DATA.is_dir():
    pytest.fail(f"{SHARED_DATA} is missing: these tests need the shared data folder beside "
                "the checkout (see ../shared/data/README.md)")
  return SHARED_DATA
