"""One process of the multi-host test: the library's training loop on an in-memory stream.

  python tests/multihost_driver.py --workdir=DIR --steps=3 --local_devices=2 \\
      --coordinator_address=127.0.0.1:PORT --num_processes=2 --process_id=0 \\
      [--parallelism=pmap] [--mesh=1,2,2]

Runs `train_lib.train_and_evaluate` up to --steps (resuming from the workdir's latest
checkpoint, saving one at the end), logging the loss of every step to DIR/metrics.jsonl.
Batches are a pure function of the global step (`support.global_batch`); each process feeds
only its own rows (`runner.process_rows`). `run` is also called inside the test process as the
single-process reference.
"""

from __future__ import annotations

import argparse
import os
import sys


def run(config, workdir: str) -> None:
  from tests import support
  from transformer.training import parallel
  from transformer.training import train_lib

  rows = parallel.create(config).process_rows(support.ROWS)
  # The resumed launch runs another parallelism: a deliberate config change.
  train_lib.train_and_evaluate(config, workdir, data=support.in_memory_data(rows),
                               allow_config_changes=True)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--steps", type=int, required=True)
  parser.add_argument("--local_devices", type=int, default=2)
  parser.add_argument("--coordinator_address")
  parser.add_argument("--num_processes", type=int)
  parser.add_argument("--process_id", type=int)
  parser.add_argument("--parallelism", default="jit")
  parser.add_argument("--mesh", default="-1,1,1", help="data,fsdp,tensor")
  args = parser.parse_args()

  import jax

  from tests import support
  from transformer.training import distributed

  jax.config.update("jax_num_cpu_devices", args.local_devices)
  distributed.initialize("auto", args.coordinator_address, args.num_processes, args.process_id)
  mesh = tuple(int(s) for s in args.mesh.split(","))
  run(support.in_memory_config(args.steps, args.parallelism, mesh), args.workdir)
  print(f"process {jax.process_index()}/{jax.process_count()}: trained to step {args.steps}",
        file=sys.stderr)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  main()
