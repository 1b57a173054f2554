"""Multi-host start-up: `jax.distributed.initialize`, from flags or the cluster's environment.

JAX's multi-controller model: every host runs the same program; after initialisation
`jax.devices()` lists the devices of all processes, a mesh spans them, each process feeds its
own rows of every batch, and orbax writes one checkpoint that every process restores.

  # SLURM (srun) or a Cloud TPU pod slice: the cluster is detected from the environment
  srun python train.py --config=configs/base.py --workdir=/shared/runs/base
  # anywhere else: name the coordinator (process 0's host:port) and this process
  python train.py ... --coordinator_address=10.0.0.1:1234 --num_processes=2 --process_id=0

A plain single-process run never touches the distributed runtime (`--distributed=auto`
looks for a multi-process launch first). The flags are train.py's, passed to `initialize`;
importing this module defines none. Only process 0 logs at INFO level and writes text
outputs (metric_writer.py, workdir.save_config); the others log warnings only.
"""

from __future__ import annotations

import faulthandler
import os
from typing import Mapping

import jax
from absl import logging

from transformer.errors import ConfigError


def detect_cluster(environ: Mapping[str, str] = os.environ) -> str | None:
  """The kind of multi-process launch the environment describes, or None for one process.

  Only launches with more than one process count: a SLURM allocation running one task, or a
  single-host TPU VM, is a plain run.
  """
  if "SLURM_PROCID" in environ and int(environ.get("SLURM_NTASKS", "1")) > 1:
    return "slurm"
  hosts = environ.get("TPU_WORKER_HOSTNAMES", "") or environ.get("TPU_PROCESS_ADDRESSES", "")
  if len([h for h in hosts.split(",") if h]) > 1 or "MEGASCALE_COORDINATOR_ADDRESS" in environ:
    return "tpu"
  if int(environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
    return "ompi"
  return None


def jax_heartbeat_timeout(heartbeat_timeout_seconds: int) -> int:
  """JAX's own heartbeat timeout for a run whose processes are lost after
  `heartbeat_timeout_seconds` (config.heartbeat_timeout_seconds): a margin later, so that
  `peer_watch.PeerWatch` names the lost process first and JAX's abort is only the backstop."""
  return heartbeat_timeout_seconds + max(10, heartbeat_timeout_seconds // 2)


def fatal_errors_name_one_thread() -> None:
  """A fatal signal (an abort, a segmentation fault) prints the Python stack of the thread it
  hit alone, not of every thread (absl's `app.run` enables `faulthandler` for all of them).

  When process 0 is killed, JAX's client aborts every other process within a second, from a
  thread of its own that runs no Python (docs/failures.md): the stacks of every Python thread
  (some 45 lines of the training loop, orbax's and the peer watch's threads) would only bury
  JAX's line saying that the coordination service is gone. A crash in the main thread still
  prints the main thread's stack. Where nothing enabled `faulthandler`, nothing changes."""
  if faulthandler.is_enabled():
    faulthandler.enable(all_threads=False)


def initialize(mode: str = "auto", coordinator_address: str | None = None,
               num_processes: int | None = None, process_id: int | None = None,
               environ: Mapping[str, str] = os.environ,
               heartbeat_timeout_seconds: int = 100) -> bool:
  """Starts the distributed runtime if asked or needed; returns whether it did.

  Must run before anything else touches JAX devices.

  Args:
    mode: 'auto', 'on' or 'off' (see train.py's `--distributed` flag).
    coordinator_address: host:port of process 0; with it, `num_processes` and `process_id`
      are required.
    num_processes: number of processes.
    process_id: this process's index.
    environ: the environment to inspect (for tests).
    heartbeat_timeout_seconds: the run's config.heartbeat_timeout_seconds.
  """
  explicit = (coordinator_address, num_processes, process_id)
  heartbeat = jax_heartbeat_timeout(heartbeat_timeout_seconds)
  if mode == "off":
    if any(v is not None for v in explicit):
      raise ConfigError("--distributed=off contradicts --coordinator_address/--num_processes/"
                        "--process_id; drop one or the other")
    return False
  if any(v is not None for v in explicit):
    if any(v is None for v in explicit):
      raise ConfigError(
          f"--coordinator_address={coordinator_address}, --num_processes={num_processes} and "
          f"--process_id={process_id}: give all three (or none, on SLURM or TPU)")
    if not 0 <= process_id < num_processes:
      raise ConfigError(f"--process_id={process_id} must be in 0..{num_processes - 1} "
                        f"(--num_processes={num_processes})")
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               heartbeat_timeout_seconds=heartbeat)
  elif mode == "on" or detect_cluster(environ):
    jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat)
  else:
    return False
  if jax.process_index() != 0:
    logging.set_verbosity(logging.WARNING)
  fatal_errors_name_one_thread()
  logging.info("process %d of %d: %d local device(s), %d in all", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())
  return True

