"""Multi-host training: two local processes (2 CPU devices each) joined by jax.distributed.

The two processes train 3 steps with the model sharded across both (FSDP + tensor parallel,
mesh 1×2×2), write one orbax checkpoint, and are then restarted under pmap to resume from it
to step 5. Every loss and the final parameters must match one 4-device process.
"""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests import multihost_driver
from transformer import distributed
from transformer.config_checks import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 120  # per launch; a hang (e.g. a process waiting for a dead peer) fails here


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(workdir: str, steps: int, parallelism: str, mesh: str) -> list[subprocess.Popen]:
  """Starts the driver as 2 processes of 2 CPU devices each."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
  # conftest's 8-device XLA flag would override jax_num_cpu_devices in the children.
  # conftest's 8-device XLA flag would override jax_num_cpu_devices in the children; the
  # programs run for milliseconds, so spend little time optimising them.
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if "xla_force_host_platform_device_count" not in f]
  env["XLA_FLAGS"] = " ".join(flags + ["--xla_backend_optimization_level=0"])
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


def _load(path: str):
  with np.load(path) as f:
    params = {k[len("param"):]: f[k] for k in f.files if k.startswith("param")}
    return dict(zip(f["steps"].tolist(), f["losses"].tolist())), params


def test_two_processes_match_one_and_resume_from_their_checkpoint(tmp_path):
  multi = str(tmp_path / "multi")
  procs = _launch(multi, 3, "jit", "1,2,2")
  # The reference (one process, 4 of the test's 8 devices) trains while the launch runs.
  ref_losses, ref_params = multihost_driver.train(
      multihost_driver.tiny_config(), str(tmp_path / "single"), 5, devices=jax.devices()[:4])
  _wait(procs)
  losses_a, _ = _load(os.path.join(multi, "result_3.npz"))
  assert sorted(os.listdir(os.path.join(multi, "checkpoints"))) == ["3"]
  _wait(_launch(multi, 5, "pmap", "-1,1,1"))
  losses_b, params = _load(os.path.join(multi, "result_5.npz"))
  assert sorted(losses_a) == [1, 2, 3] and sorted(losses_b) == [4, 5]  # resumed, not retrained
  assert os.path.exists(os.path.join(multi, "config.json"))

  np.testing.assert_allclose([*losses_a.values(), *losses_b.values()],
                             [ref_losses[s] for s in range(1, 6)], rtol=1e-5)
  ref_flat = _flat(ref_params)
  assert params.keys() == ref_flat.keys()
  for name, value in ref_flat.items():
    # Five Adam steps move parameters by ~0.1 (lr ≈ 0.03); rounding noise is far below that.
    np.testing.assert_allclose(params[name], value, atol=1e-4, err_msg=name)


def _flat(tree) -> dict[str, np.ndarray]:
  return {jax.tree_util.keystr(p): np.asarray(v)
          for p, v in jax.tree_util.tree_leaves_with_path(tree)}


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
