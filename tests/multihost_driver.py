"""One process of the multi-host tests: train.py's path (the launcher, `jax.distributed`, the
library's training loop) on an in-memory stream instead of a corpus.

  python tests/multihost_driver.py --workdir=DIR --steps=3 --local_devices=2 \\
      --coordinator_address=127.0.0.1:PORT --num_processes=2 --process_id=0 \\
      [--parallelism=pmap] [--mesh=1,2,2] [--heartbeat_timeout=100] [--step_timeout=0]
      [--checkpoint_every=N] [--select_every=N]
      [--fault=disk_full --fault_process=1 --fault_step=3]

Without the coordinator flags it is one process. It trains up to --steps (resuming from the
workdir's latest checkpoint, saving one at the end), logging the loss of every step to
DIR/metrics.jsonl, and ends as train.py does (`cli.run`: exit status 0 after SIGTERM, one line
for what a user can fix), printing `process P/N: resumed at step S` when it restores a
checkpoint. Batches are a pure function of the global step
(`support.global_batch`); each process feeds only its own rows (`runner.process_rows`), so
any mesh and any number of processes see the same global batches. `run` is also called
inside the test process as the single-process reference. `--fault` makes one process fail
alone, as a cluster's processes do.
"""

from __future__ import annotations

import os
import sys

from absl import flags

_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder.", required=True)
_STEPS = flags.DEFINE_integer("steps", None, "Train up to this step.", required=True)
_LOCAL_DEVICES = flags.DEFINE_integer("local_devices", 2, "CPU devices of this process.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
_PARALLELISM = flags.DEFINE_enum("parallelism", "jit", ["jit", "pmap"], "config.parallelism")
_MESH = flags.DEFINE_string("mesh", "-1,1,1", "config.mesh as data,fsdp,tensor.")
_HEARTBEAT = flags.DEFINE_integer("heartbeat_timeout", 100,
                                  "config.heartbeat_timeout_seconds")
_STEP_TIMEOUT = flags.DEFINE_integer("step_timeout", 0, "config.step_timeout_seconds")
_CHECKPOINT_EVERY = flags.DEFINE_integer("checkpoint_every", 0,
                                         "config.checkpoint_every_steps (0: at the end only)")
_SELECT_EVERY = flags.DEFINE_integer(
    "select_every", 0, "Dev loss on two fixed batches every N steps, choosing the best "
    "checkpoint (config.select='loss'); 0: no dev split.")
_FAULT = flags.DEFINE_enum(
    "fault", None, ["disk_full", "config_error", "loader_error", "loader_hang"],
    "What goes wrong on process --fault_process alone: its save of checkpoint --fault_step "
    "runs out of disk space (inside orbax, as on a full disk), or its data loader raises a "
    "ConfigError, raises a RuntimeError or blocks for good when asked for batch --fault_step.")
_FAULT_PROCESS = flags.DEFINE_integer("fault_process", 1, "The process the fault happens on.")
_FAULT_STEP = flags.DEFINE_integer("fault_step", 3, "The step (see --fault).")


class FaultyStream:
  """`support.StepStream`, except at batch `step` (0-based), where `fault` happens."""

  def __init__(self, stream, fault: str, step: int):
    self.stream, self.fault, self.fault_step = stream, fault, step

  def __next__(self):
    if self.stream.step == self.fault_step:
      if self.fault == "config_error":
        from transformer.errors import ConfigError

        raise ConfigError("/data/train.de line 7: invalid UTF-8; fix or drop that line")
      if self.fault == "loader_error":
        raise RuntimeError("the data loader broke")
      import threading

      threading.Event().wait()  # "loader_hang": a read that never returns
    return next(self.stream)

  def get_state(self) -> dict:
    return self.stream.get_state()

  def set_state(self, state: dict) -> None:
    self.stream.set_state(state)


def run(config, workdir: str, fault: str | None = None) -> None:
  import jax

  from tests import support
  from transformer.training import parallel
  from transformer.training import train_lib

  rows = parallel.create(config).process_rows(support.ROWS)
  data = support.in_memory_data(rows)
  stream, restore = data.train, data.train.set_state

  def set_state(state):  # called when a checkpoint is restored: say which one
    restore(state)
    print(f"process {jax.process_index()}/{jax.process_count()}: resumed at step "
          f"{stream.step}", file=sys.stderr)

  stream.set_state = set_state
  if config.select == "loss":  # --select_every: two dev batches, this process's rows of each
    data.eval_batches = lambda: ({k: v[rows] for k, v in support.global_batch(step).items()}
                                 for step in (100_000, 100_001))
  if fault and fault != "disk_full":
    data.train = FaultyStream(data.train, fault, _FAULT_STEP.value)
  # Resumed launches run another mesh or parallelism: a deliberate config change.
  train_lib.train_and_evaluate(config, workdir, data=data, allow_config_changes=True)


def main(argv) -> None:
  del argv
  import signal

  # Ctrl-C as a terminal delivers it, even where the tests were started in the background
  # from a non-interactive shell, whose children inherit SIGINT ignored.
  signal.signal(signal.SIGINT, signal.default_int_handler)

  import jax

  from tests import support
  from transformer.training import distributed, train_lib  # noqa: F401

  jax.config.update("jax_num_cpu_devices", _LOCAL_DEVICES.value)
  mesh = tuple(int(s) for s in _MESH.value.split(","))
  config = support.in_memory_config(_STEPS.value, _PARALLELISM.value, mesh)
  config.heartbeat_timeout_seconds = _HEARTBEAT.value
  config.step_timeout_seconds = _STEP_TIMEOUT.value
  if _CHECKPOINT_EVERY.value:
    config.checkpoint_every_steps = _CHECKPOINT_EVERY.value
  if _SELECT_EVERY.value:
    config.select, config.eval_every_steps = "loss", _SELECT_EVERY.value
    config.keep_checkpoints = 100  # every one, to compare with the best
  distributed.initialize("auto", _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                         heartbeat_timeout_seconds=config.heartbeat_timeout_seconds)
  fault = _FAULT.value if jax.process_index() == _FAULT_PROCESS.value else None
  if fault == "disk_full":
    from orbax.checkpoint._src.serialization import serialization

    from tests.run.test_disk import _SERIALIZE, failing_serialize

    setattr(serialization, _SERIALIZE,
            failing_serialize(getattr(serialization, _SERIALIZE), _FAULT_STEP.value))
  run(config, _WORKDIR.value, fault)
  print(f"process {jax.process_index()}/{jax.process_count()}: trained to step {_STEPS.value}",
        file=sys.stderr)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from transformer import cli

  cli.run(main)
