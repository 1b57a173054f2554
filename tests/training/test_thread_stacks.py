"""Where another thread is (`thread_stacks`), as the step clock asks it of the main thread:
inside JAX or not, and the innermost frame of the project's or the user's code."""

import threading

import jax
import jax.numpy as jnp

from transformer.training import thread_stacks


def _started(target) -> threading.Thread:
  thread = threading.Thread(target=target, daemon=True)
  thread.start()
  return thread


def test_a_thread_waiting_in_its_own_code_is_named_there_and_not_in_jax():
  release = threading.Event()

  def waits_for_data():
    release.wait()  # threading's frames are the standard library's, skipped

  thread = _started(waits_for_data)
  try:
    assert not thread_stacks.in_jax(thread)
    where = thread_stacks.own_frame(thread)
    assert where.startswith("waits_for_data (tests/training/test_thread_stacks.py:"), where
  finally:
    release.set()
    thread.join()


def test_a_thread_waiting_on_a_jax_result_is_inside_jax():
  entered, release = threading.Event(), threading.Event()

  def host(x):
    entered.set()
    release.wait()
    return x

  def computes():
    shape = jax.ShapeDtypeStruct((), jnp.float32)
    jax.jit(lambda x: jax.pure_callback(host, shape, x))(jnp.float32(1)).block_until_ready()

  thread = _started(computes)
  try:
    assert entered.wait(60)
    assert thread_stacks.in_jax(thread)
  finally:
    release.set()
    thread.join()
  assert thread_stacks.own_frame(threading.Thread()) == "a library call"  # not started: none
