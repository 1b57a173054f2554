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
import types


class StepStream:
  """This process's rows of `support.global_batch(step)`, step after step; its position is
  saved in checkpoints like the input pipeline's iterator."""

  def __init__(self, rows: slice):
    self.rows, self.step = rows, 0

  def __next__(self):
    from tests import support

    batch = {k: v[self.rows] for k, v in support.global_batch(self.step).items()}
    self.step += 1
    return batch

  def get_state(self) -> dict:
    return {"next_index": self.step}

  def set_state(self, state: dict) -> None:
    self.step = int(state["next_index"])


def config_for(steps: int, parallelism: str = "jit", mesh=(-1, 1, 1)):
  """`support.tiny_config` trained to `steps` with a checkpoint at the end and the loss of
  every step logged; no dev split, vocabulary or BLEU."""
  from tests import support

  config = support.tiny_config(parallelism, mesh)
  config.num_train_steps = config.checkpoint_every_steps = steps
  config.log_every_steps = 1
  config.eval_every_steps = steps
  config.keep_checkpoints = 2
  config.bleu_every_steps = 0
  config.bleu_at_end = False
  config.data.update(eval_split="", test_split="")
  return config


def run(config, workdir: str) -> None:
  from tests import support
  from transformer import parallel, train_lib

  rows = parallel.create(config).process_rows(support.ROWS)
  data = types.SimpleNamespace(tokenizer=None, train=StepStream(rows), eval_batches=None,
                               splits={})
  train_lib.train_and_evaluate(config, workdir, data=data)


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

  from transformer import distributed

  jax.config.update("jax_num_cpu_devices", args.local_devices)
  distributed.initialize("auto", args.coordinator_address, args.num_processes, args.process_id)
  mesh = tuple(int(s) for s in args.mesh.split(","))
  run(config_for(args.steps, args.parallelism, mesh), args.workdir)
  print(f"process {jax.process_index()}/{jax.process_count()}: trained to step {args.steps}",
        file=sys.stderr)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  main()
