"""The test processes keep CPython's frame stack on the C heap (tests/frame_stack.py): deep
calls that cross its chunks' ends make no page faults there, and do without the library."""

import os

import pytest

from tests import frame_stack


@pytest.fixture
def library() -> str:
  if not frame_stack.installed():
    pytest.skip(f"tests/frame_stack.py's library is not in use: {os.environ[frame_stack.ENV]}")
  return os.environ[frame_stack.ENV]


def test_processes_the_tests_start_cross_chunk_ends_without_page_faults(library):
  with_it = frame_stack.page_faults_in_a_fresh_process()
  preload = [p for p in os.environ["LD_PRELOAD"].split() if p != library]
  without = frame_stack.page_faults_in_a_fresh_process(
      dict(os.environ, LD_PRELOAD=" ".join(preload)))
  assert without >= frame_stack.FAULTS_WITHOUT, without  # what the library is for
  assert with_it < without / 20, (with_it, without)


def test_the_workers_load_it(library):
  if "PYTEST_XDIST_WORKER" not in os.environ:
    pytest.skip("run with -n0: the tests run in the process that built the library")
  with open("/proc/self/maps") as maps:
    assert library in maps.read()
