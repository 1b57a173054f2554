"""Keeps freed host memory in the process when XLA computes on the CPU.

XLA:CPU allocates each step's buffers with the C library's allocator and frees them when the
step ends. A Transformer step's largest buffers are hundreds of megabytes (the `[B, T, V]`
logits and their gradient), and glibc hands blocks that large straight back to the kernel
(`mmap`/`munmap`, and trimming of per-thread heaps), so the next step page-faults and zeroes
every page again, in the kernel (the README's performance table has the measured cost).

`keep_freed_memory()` tells glibc to keep such blocks for reuse: no `mmap` for large blocks,
no trimming, and one heap shared by all threads (per-thread heaps are released page by page).
The process then holds its peak memory until it exits, which a training or evaluation run on
the CPU does anyway. It must run before JAX starts its CPU backend (whose threads take their
heaps at start), so the entry points call it first thing; it does nothing on other C
libraries, when an accelerator plugin is installed and JAX_PLATFORMS does not say `cpu`, or
when TRANSFORMER_KEEP_FREED_MEMORY=0.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os

# mallopt(3) parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# Accelerator plugins for jax; with one installed, the CPU is not where the steps run.
_ACCELERATOR_MODULES = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin",
                        "jax_rocm7_plugin", "libtpu")


def computes_on_cpu() -> bool:
  """Whether JAX will run on the CPU, judged without starting a backend."""
  platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
  if platforms:
    return platforms.split(",")[0] == "cpu"
  return not any(importlib.util.find_spec(m) is not None for m in _ACCELERATOR_MODULES)


def keep_freed_memory() -> bool:
  """Makes glibc keep freed blocks for reuse when JAX computes on the CPU (see the module
  docstring). Returns whether the setting was applied."""
  if os.environ.get("TRANSFORMER_KEEP_FREED_MEMORY", "1") == "0" or not computes_on_cpu():
    return False
  name = ctypes.util.find_library("c")
  if name is None:
    return False
  libc = ctypes.CDLL(name)
  if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
    return False  # not glibc: its allocator has its own policy
  ok = libc.mallopt(_M_MMAP_MAX, 0)
  ok &= libc.mallopt(_M_TRIM_THRESHOLD, -1)  # -1: never trim (mallopt(3))
  ok &= libc.mallopt(_M_ARENA_MAX, 1)
  return bool(ok)
