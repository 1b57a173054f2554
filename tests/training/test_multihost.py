"""Multi-host training: two local processes (2 CPU devices each) joined by jax.distributed.

The two processes train 3 steps with the model sharded across both (FSDP + tensor parallel,
mesh 1×2×2) through the library's own loop, write one orbax checkpoint, and are then
restarted under pmap to resume from it to step 5. Every loss and the final parameters must
match one process.
"""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests import multihost_driver, support
from tests.conftest import FAST_COMPILE_FLAGS
from transformer.run import checkpoint
from transformer.training import distributed
from transformer.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 120  # per launch; a hang (e.g. a process waiting for a dead peer) fails here


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(workdir: str, steps: int, parallelism: str, mesh: str) -> list[subprocess.Popen]:
  """Starts the driver as 2 processes of 2 CPU devices each."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
  # conftest's 8-device XLA flag would override jax_num_cpu_devices in the children.
  env["XLA_FLAGS"] = FAST_COMPILE_FLAGS
  address = f"127.0.0.1:{_free_port()}"
  procs = [subprocess.Popen(
      [sys.executable, os.path.join(REPO, "tests", "multihost_driver.py"),
       f"--workdir={workdir}", f"--steps={steps}", "--local_devices=2",
       f"--coordinator_address={address}", "--num_processes=2", f"--process_id={i}",
       f"--parallelism={parallelism}", f"--mesh={mesh}"],
      env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  return procs


def _wait(procs: list[subprocess.Popen]) -> None:
  """Waits for a launch; fails on a process error or a timeout."""
  outputs = []
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=TIMEOUT_S)[0])
  except subprocess.TimeoutExpired:
    for p in procs:
      p.kill()
    pytest.fail(f"multi-host launch {procs[0].args[2:]} timed out after {TIMEOUT_S}s")
  for i, (p, out) in enumerate(zip(procs, outputs)):
    assert p.returncode == 0, f"process {i} failed:\n{out[-3000:]}"


def test_two_processes_match_one_and_resume_from_their_checkpoint(tmp_path):
  multi = tmp_path / "multi"
  procs = _launch(str(multi), 3, "jit", "1,2,2")
  # The reference (one process, the test's 8 devices) trains while the launch runs.
  multihost_driver.run(support.in_memory_config(5), str(tmp_path / "single"))
  _wait(procs)
  assert sorted(os.listdir(multi / "checkpoints")) == ["3"]
  assert [s for s, _ in support.logged(multi)] == [1, 2, 3]
  _wait(_launch(str(multi), 5, "pmap", "-1,1,1"))
  losses = support.logged(multi)
  assert [s for s, _ in losses] == [1, 2, 3, 4, 5]  # resumed at 4, not retrained
  assert (multi / "config.json").is_file()

  reference = support.logged(tmp_path / "single")
  np.testing.assert_allclose([v for _, v in losses], [v for _, v in reference], rtol=1e-5)
  params, ref_params = (checkpoint.Checkpointer(str(w), read_only=True).restore_params(5)
                        for w in (multi, tmp_path / "single"))
  for (path, value), (_, ref) in zip(jax.tree_util.tree_leaves_with_path(params),
                                     jax.tree_util.tree_leaves_with_path(ref_params)):
    # Five Adam steps move parameters by ~0.1 (lr ≈ 0.03); rounding noise is far below that.
    np.testing.assert_allclose(value, ref, atol=1e-4, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("environ, expected", [
    ({}, None),
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, None),
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_PROCID": "2"}, "slurm"),
    ({"TPU_WORKER_HOSTNAMES": "t1"}, None),
    ({"TPU_WORKER_HOSTNAMES": "t1,t2,t3,t4"}, "tpu"),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, "ompi"),
])
def test_cluster_detection(environ, expected):
  assert distributed.detect_cluster(environ) == expected


def test_single_process_never_starts_the_runtime():
  assert distributed.initialize("auto", environ={}) is False
  assert distributed.initialize("off", environ={"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}) is False


@pytest.mark.parametrize("kwargs, message", [
    (dict(coordinator_address="127.0.0.1:1234"), "give all three"),
    (dict(coordinator_address="h:1", num_processes=2, process_id=2), "must be in 0..1"),
    (dict(mode="off", num_processes=2), "contradicts"),
])
def test_bad_distributed_flags(kwargs, message):
  with pytest.raises(ConfigError, match=message):
    distributed.initialize(**{"mode": "auto", **kwargs})


def test_the_distributed_flags_are_train_pys_alone(tmp_path):
  """Importing the module defines no flag (the research tools and tests import it beside
  flags of their own); train.py defines them and passes them on."""
  imported = subprocess.run(
      [sys.executable, "-c", "from absl import flags, logging; before = set(flags.FLAGS); "
       "from transformer.training import distributed; print(set(flags.FLAGS) - before)"],
      env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, check=True)
  assert imported.stdout.strip() == "set()"
  trained = subprocess.run(
      [sys.executable, "train.py", "--config=configs/base.py", f"--workdir={tmp_path}/w",
       "--distributed=off", "--num_processes=2"],
      cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True)
  assert trained.returncode == 2, trained.stderr[-2000:]
  assert trained.stderr.strip().splitlines()[-1].startswith(
      "error: --distributed=off contradicts --coordinator_address/--num_processes")
