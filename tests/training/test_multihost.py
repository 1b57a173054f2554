"""Multi-host training: local processes (2 CPU devices each) joined by `jax.distributed`,
through the library's loop and train.py's launcher (`tests/multihost_driver.py`).

What a cluster user does every day, each against one uninterrupted single-process run, in
one chain of launches on one workdir:
- a run sharded across processes (FSDP + tensor parallel, mesh 1×2×2) gets a preemption
  notice (SIGTERM) on one process only: all of them stop after the same step with one
  checkpoint and exit status 0, and the same command resumes it;
- it is then resumed under another mesh (resharded on restore), under pmap, and with another
  number of processes (2 → 1 → 2): the train state. The batches come from a stream that
  depends on the step alone; the real input pipeline refuses a data position saved by other
  processes or devices (tests/data/test_input_pipeline.py);
- a process killed (SIGKILL) or hung (SIGSTOP) makes the others exit non-zero within the
  heartbeat timeout, with one line naming it.
Every loss and the final parameters must match the reference to f32 reassociation (sums
over other device splits): rtol 1e-5 on losses, atol 1e-4 on parameters.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from tests import multihost_driver, support
from tests.conftest import session_folder
from transformer.data import cache_lock
from transformer.errors import ConfigError
from transformer.run import best as best_lib
from transformer.run import checkpoint
from transformer.run import checkpoint_layout
from transformer.training import distributed

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 120  # per launch; a hang (e.g. a process waiting for a dead peer) fails here
REFERENCE_STEPS = 40
HEARTBEAT_S = 4  # config.heartbeat_timeout_seconds of the lost-process tests


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(workdir, steps: int, parallelism: str = "jit", mesh: str = "1,2,2",
            processes: int = 2, **flags) -> list[subprocess.Popen]:
  """Starts the driver as `processes` processes (2 CPU devices each; one process gets 4)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
  # conftest's 8-device XLA flag would override jax_num_cpu_devices in the children.
  env["XLA_FLAGS"] = ""
  common = [sys.executable, os.path.join(REPO, "tests", "multihost_driver.py"),
            f"--workdir={workdir}", f"--steps={steps}", f"--parallelism={parallelism}",
            f"--mesh={mesh}", *(f"--{k}={v}" for k, v in flags.items())]
  popen = dict(env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  if processes == 1:
    return [subprocess.Popen(common + ["--local_devices=4"], **popen)]
  address = f"127.0.0.1:{_free_port()}"
  return [subprocess.Popen(
      common + ["--local_devices=2", f"--coordinator_address={address}",
                f"--num_processes={processes}", f"--process_id={i}"], **popen)
      for i in range(processes)]


def _wait(procs: list[subprocess.Popen], timeout: float = TIMEOUT_S) -> list[str]:
  """Waits for a launch; returns each process's output. Fails on a timeout."""
  outputs, deadline = [], time.monotonic() + timeout
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=max(deadline - time.monotonic(), 0.1))[0])
  except subprocess.TimeoutExpired:
    for p in procs:
      p.kill()
    pytest.fail(f"multi-host launch {procs[0].args[2:]} still running after {timeout:.0f} s")
  return outputs


def _succeeds(procs: list[subprocess.Popen]) -> None:
  for i, (p, out) in enumerate(zip(procs, _wait(procs))):
    assert p.returncode == 0, f"process {i} failed:\n{out[-3000:]}"


def _when_logged(workdir, step: int, procs) -> None:
  """Returns once process 0 has logged `step` (metrics.jsonl has a line per step)."""
  path, deadline = workdir / "metrics.jsonl", time.monotonic() + TIMEOUT_S
  while not (path.exists() and len(path.read_text().splitlines()) >= step):
    if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
      pytest.fail(f"the run ended or stalled before step {step}:\n"
                  + "\n".join(p.communicate()[0][-2000:] for p in procs))
    time.sleep(0.05)


def _lines(output: str) -> list[str]:
  """The output without gloo's connection notes."""
  return [l for l in output.splitlines() if l.strip() and "[Gloo]" not in l]


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
  """One process (the test's 8 devices, data parallel), trained to REFERENCE_STEPS without a
  stop; read, never changed. Trained once for the session: in the folder pytest-xdist's
  workers share, the first worker to ask trains it while the other waits (its lock)."""
  workdir = session_folder(tmp_path_factory, "multihost-single")
  with cache_lock.building(workdir):
    if not (workdir / "trained").exists():
      shutil.rmtree(workdir, ignore_errors=True)
      multihost_driver.run(support.in_memory_config(REFERENCE_STEPS), str(workdir))
      (workdir / "trained").touch()
  return workdir


def _matches_reference(workdir, reference) -> None:
  """The losses logged in `workdir` (one per step, none retrained) and its final parameters
  equal the reference's up to its step."""
  losses, expected = support.logged(workdir), support.logged(reference)
  steps = [s for s, _ in losses]
  assert steps == list(range(1, len(steps) + 1)), steps  # resumed where it stopped
  np.testing.assert_allclose([v for _, v in losses], [v for _, v in expected[:len(losses)]],
                             rtol=1e-5)
  params = checkpoint.Checkpointer(str(workdir), read_only=True).restore_params(steps[-1])
  if steps[-1] == REFERENCE_STEPS:
    ref_params = checkpoint.Checkpointer(str(reference), read_only=True).restore_params(
        REFERENCE_STEPS)
    for (path, value), (_, ref) in zip(jax.tree_util.tree_leaves_with_path(params),
                                       jax.tree_util.tree_leaves_with_path(ref_params)):
      # Adam moves parameters by ~0.03 a step; rounding noise is far below that.
      np.testing.assert_allclose(value, ref, atol=1e-4, err_msg=jax.tree_util.keystr(path))


def _resume_steps_named(line: str) -> set[int]:
  """The checkpoint a line says the next run resumes from, and the one it names should the
  save under way complete."""
  found = re.search(r"(?:resumes from checkpoint (\d+)|starts from step (0))(?: \(or from "
                    r"checkpoint (\d+), should its save under way complete\))?", line)
  return {int(g) for g in found.groups() if g} if found else set()


# (steps past the last stop, parallelism, mesh data,fsdp,tensor, processes) of each launch
# that resumes the stopped run, in its workdir; the last one runs to REFERENCE_STEPS.
RESUMES = [
    (2, "jit", "4,1,1", 1),   # another mesh and one process of 4 devices: resharded on restore
    (None, "pmap", "-1,1,1", 2),  # two again, replicated
]


def _stop_with_sigterm(workdir, signalled: int, after_step: int) -> int:
  """Launches the run (mesh 1×2×2, sharded over both processes) to REFERENCE_STEPS, sends
  SIGTERM to process `signalled` once step `after_step` is logged; returns the step every
  process stopped after."""
  procs = _launch(workdir, REFERENCE_STEPS)
  _when_logged(workdir, after_step, procs)
  procs[signalled].send_signal(signal.SIGTERM)
  stopped = []
  for p, out in zip(procs, _wait(procs)):
    assert p.returncode == 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    (line,) = [l for l in _lines(out) if l.startswith("stopped by SIGTERM")]
    stopped.append(int(re.search(r"checkpoint (\d+) is saved", line).group(1)))
  # Room after the stop for every resume of the chain, the last with at least one step.
  assert stopped[0] == stopped[1] < REFERENCE_STEPS - max(m for m, *_ in RESUMES if m), stopped
  assert checkpoint_layout.resume_step(str(workdir)) == stopped[0]
  return stopped[0]


def test_a_run_stopped_by_sigterm_resumes_under_any_mesh_and_process_count(reference, tmp_path):
  """A preemption notice (SIGTERM) to one host only, which JAX's preemption sync point carries
  to the others: every process saves the same step and exits 0; the same command resumes
  there. The run then resumes under another mesh, under pmap and with another number of
  processes, and ends as an uninterrupted one."""
  workdir = tmp_path / "run"
  stopped = _stop_with_sigterm(workdir, 1, after_step=3)
  for more, parallelism, mesh, processes in RESUMES:
    steps = REFERENCE_STEPS if more is None else stopped + more
    _succeeds(_launch(workdir, steps, parallelism, mesh, processes))
    assert checkpoint_layout.resume_step(str(workdir)) == steps
    assert not (tmp_path / "checkpoints-set-aside").exists()
    assert not (workdir / "checkpoints-set-aside").exists()
  assert (workdir / "config.json").is_file()
  _matches_reference(workdir, reference)


def test_the_best_checkpoint_of_a_sharded_run_holds_its_step_s_parameters(tmp_path):
  """`config.select` on a run sharded across both processes (mesh 1×2×2), dev loss every 2
  steps: the best snapshot, whose shards each process writes, names the first step of the
  lowest dev loss and holds that step's parameters, as its checkpoint does."""
  workdir = tmp_path / "run"
  _succeeds(_launch(workdir, 6, select_every=2, checkpoint_every=2))
  dev = support.logged(workdir, "dev/loss")
  assert [s for s, _ in dev] == [2, 4, 6]
  best_step = next(s for s, v in dev if v == min(v for _, v in dev))
  snapshot = best_lib.BestSnapshot(str(workdir), read_only=True)
  assert snapshot.record()["step"] == best_step
  params, step = snapshot.restore_params()
  assert step == best_step
  saved = checkpoint.Checkpointer(str(workdir), read_only=True).restore_params(best_step)
  jax.tree.map(np.testing.assert_array_equal, params, saved)


@pytest.mark.parametrize("lost, how", [(1, signal.SIGKILL), (0, signal.SIGSTOP)],
                         ids=["process 1 killed", "process 0 (the coordinator) hung"])
def test_a_lost_process_ends_the_others_with_one_line_naming_it(tmp_path, lost, how):
  workdir = tmp_path / "run"
  procs = _launch(workdir, 100_000, heartbeat_timeout=HEARTBEAT_S)
  _when_logged(workdir, 3, procs)
  procs[lost].send_signal(how)
  start = time.monotonic()
  survivor = procs[1 - lost]
  try:
    (output,) = _wait([survivor], timeout=HEARTBEAT_S + 30)
  finally:
    procs[lost].kill()
  waited = time.monotonic() - start
  assert survivor.returncode == 1, output[-3000:]
  # The watch's one line, well before JAX's own heartbeat timeout would abort it.
  assert waited < distributed.jax_heartbeat_timeout(HEARTBEAT_S), waited
  line = _lines(output)[-1]
  assert line.startswith(f"error: process {lost}"), output[-3000:]
  assert " of 2 was lost: " in line, line
  if lost == 1:  # process 0's host is asked of the store process 0 holds: not while it hangs
    assert line.startswith("error: process 1 (host "), line
    assert f"was lost: nothing from it for {HEARTBEAT_S} s" in line, line
  assert (checkpoint_layout.resume_step(str(workdir)) or 0) in _resume_steps_named(line), line
  assert "Check failure stack trace" not in output  # not JAX's abort
  assert not (workdir / "train.lock").exists() or lost == 0  # process 0 holds the lock


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
