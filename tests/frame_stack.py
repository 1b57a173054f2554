"""CPython's frame stack on the C heap for the test processes, where CPython maps and unmaps it.

CPython 3.11 and 3.12 keep a thread's frames in 16 KiB chunks that they map from the kernel
when a call goes past the end of one and unmap when that call returns (python/cpython#142183,
fixed in 3.13 and 3.14 in 2026 by keeping one spare chunk). Tracing and lowering a model runs
hundreds of frames deep below pytest's own, so its calls cross such an end over and over, each
crossing an mmap, an munmap and four page faults: `tests/research/test_params.py` (47
parameter counts, nothing but tracing) made 687,000 page faults and spent 5.5 of its 22 CPU
seconds in the kernel (docs/testing.md).

Where deep calls fault so, `install` builds `frame_stack.c` with the C compiler Python was
built with and puts it in LD_PRELOAD, where pytest-xdist's workers and every process they
start (train.py, the multi-host drivers, the reference tests' child) load it: before the
interpreter starts, it points CPython's arena allocator at malloc and free, and the chunks,
like any block the C library frees, are reused. It changes where Python objects live, not a
number a test computes. Where deep calls do not fault so (a CPython with the fix), without a
C compiler, or on another system, nothing is installed and the suite runs as before. Setting
TRANSFORMER_TEST_FRAME_STACK (e.g. to `cpython`) before pytest starts leaves CPython's own
allocator too.
"""

from __future__ import annotations

import os
import pathlib
import platform
import resource
import shlex
import subprocess
import sys
import sysconfig

ENV = "TRANSFORMER_TEST_FRAME_STACK"  # the library's path once installed, else why not
# `page_faults_of_deep_calls()` on CPython 3.11.7: 7,000 (four per chunk crossed) mapping the
# chunks, 0 on the heap. Fewer than this many, and nothing is installed.
FAULTS_WITHOUT = 1000
SOURCE = pathlib.Path(__file__).with_name("frame_stack.c")


def install(folder: str) -> str:
  """Builds the library in `folder` and adds it to LD_PRELOAD for the processes this one
  starts; returns its path, or why it is not installed (then LD_PRELOAD is left as it was)."""
  if platform.system() != "Linux" or sys.implementation.name != "cpython":
    return "not installed: LD_PRELOAD of CPython's allocator is for CPython on Linux"
  faults = page_faults_in_a_fresh_process()
  if faults < FAULTS_WITHOUT:
    return (f"not needed: deep calls made {faults} page faults on CPython "
            f"{platform.python_version()}")
  library = pathlib.Path(folder) / "frame_stack.so"
  failures = []
  for compiler in (shlex.split(sysconfig.get_config_var("CC") or "cc"), ["cc"]):
    try:
      built = subprocess.run([*compiler, "-shared", "-fPIC", "-O2", "-o", str(library),
                              str(SOURCE)], capture_output=True, text=True)
    except OSError as e:
      failures.append(f"{compiler[0]}: {e.strerror}")
      continue
    if built.returncode == 0:
      os.environ["LD_PRELOAD"] = " ".join(filter(None, [str(library),
                                                        os.environ.get("LD_PRELOAD", "")]))
      return str(library)
    failures.append(f"{compiler[0]}: {built.stderr.strip()[-200:]}")
  return "not installed: no C compiler built it (" + "; ".join(failures) + ")"


def installed() -> bool:
  return os.environ.get(ENV, "").endswith(".so")


def page_faults_in_a_fresh_process(environ=None) -> int:
  """`page_faults_of_deep_calls()` in a new interpreter with `environ` (by default this
  process's environment, LD_PRELOAD included)."""
  done = subprocess.run([sys.executable, __file__], env=environ, capture_output=True,
                        text=True, check=True)
  return int(done.stdout)


def page_faults_of_deep_calls(rounds: int = 500, depth: int = 600) -> int:
  """The page faults (`ru_minflt`) this process makes calling `depth` frames deep and back,
  `rounds` times: several chunk ends crossed each way per round."""

  def down(n):
    return down(n - 1) if n else 0

  down(depth)
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  for _ in range(rounds):
    down(depth)
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


if __name__ == "__main__":
  print(page_faults_of_deep_calls())
