"""Trains a Transformer: `python train.py --config=configs/base.py --workdir=runs/base`.

Override any config key with `--config.<key>=value` (e.g. `--config.model.num_heads=16`).
Re-running the same command resumes from the workdir's latest checkpoint (with
--allow_config_changes to change e.g. --config.num_train_steps). SIGTERM or Ctrl-C save a
checkpoint after the step in flight and exit. The work is done by
`transformer.training.train_lib.train_and_evaluate`; this file only parses flags.

Multi-host: run the same command on every host; the distributed runtime starts on its own
under SLURM (srun) and on TPU pod slices, or from --coordinator_address, --num_processes and
--process_id (see transformer/training/distributed.py).
"""

from absl import flags
from ml_collections import config_flags

from transformer import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config (configs/*.py).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Folder for checkpoints, logs and outputs.")
_ALLOW_CHANGES = flags.DEFINE_bool(
    "allow_config_changes", False, "Resume although keys other than model and data keys "
    "(e.g. num_train_steps) differ from the workdir's config.json.")
# Multi-host start-up (transformer/training/distributed.py).
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", ["auto", "on", "off"],
    "Multi-host start-up: 'auto' initialises jax.distributed when the coordinator flags are "
    "given or the environment shows a multi-process launch (SLURM srun, a multi-host TPU "
    "slice, Open MPI); 'on' always calls jax.distributed.initialize() (JAX then finds the "
    "cluster itself); 'off' never does.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0, e.g. 10.0.0.1:1234 (all processes).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index, 0 .. n-1.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  from transformer.training import distributed, train_lib  # once the flags are good
  distributed.initialize(  # before anything touches a device
      _DISTRIBUTED.value, _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
      heartbeat_timeout_seconds=_CONFIG.value.heartbeat_timeout_seconds)
  cli.check_backend()
  train_lib.train_and_evaluate(_CONFIG.value, _WORKDIR.value,
                               allow_config_changes=_ALLOW_CHANGES.value)


if __name__ == "__main__":
  cli.run(main)
