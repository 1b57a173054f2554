"""One process of the multi-host test: trains a tiny Transformer on an in-memory batch stream.

  python tests/multihost_driver.py --workdir=DIR --steps=3 --local_devices=2 \\
      --coordinator_address=127.0.0.1:PORT --num_processes=2 --process_id=0 \\
      [--parallelism=pmap] [--mesh=1,2,2]

Resumes from the workdir's latest checkpoint, trains up to --steps, saves a checkpoint there,
and on process 0 writes `DIR/result_<steps>.npz`: the loss of each step it trained and the
final parameters (gathered from all processes). Batches are a pure function of the global
step; each process feeds only its own rows (`runner.process_rows`). `train` is also called
inside the test process as the single-process reference.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROWS = 16  # global batch rows
VOCAB = 64


def tiny_config(parallelism: str = "jit", mesh=(-1, 1, 1)):
  from configs import base

  config = base.get_config()
  config.model.update(vocab_size=VOCAB, d_model=32, d_ff=64, num_heads=4, d_k=8, d_v=8,
                      num_layers=1, max_len=32, dropout_rate=0.0)
  config.warmup_steps = 10
  # Adam divides each gradient element by its own running scale: with the paper's eps = 1e-9,
  # an element whose gradient is pure rounding noise takes a learning-rate-sized step in a
  # random direction, so runs that differ only in summation order drift apart elementwise.
  # A larger eps keeps the comparisons about the parallelism, not about that noise.
  config.adam_eps = 1e-6
  config.parallelism = parallelism
  config.mesh.update(dict(zip(("data", "fsdp", "tensor"), mesh)))
  return config


def global_batch(step: int, rows: int = ROWS) -> dict[str, np.ndarray]:
  """The batch of global step `step`: random tokens with random padding, the same everywhere."""
  rng = np.random.default_rng(1000 + step)
  inputs = rng.integers(3, VOCAB, (rows, 12)).astype(np.int32)
  targets = rng.integers(3, VOCAB, (rows, 10)).astype(np.int32)
  inputs[np.arange(12) >= rng.integers(4, 13, (rows, 1))] = 0
  targets[np.arange(10) >= rng.integers(3, 11, (rows, 1))] = 0
  return {"inputs": inputs, "targets": targets}


def train(config, workdir: str, steps: int, devices=None):
  """Trains from the latest checkpoint in `workdir` (or from scratch) up to `steps`.

  Returns:
    `(losses, params)`: per-token loss by step (1-based) for the steps trained here, and the
    final parameters as host NumPy arrays.
  """
  import jax
  from jax.experimental import multihost_utils

  from transformer import checkpoint, model as model_lib, optimizer, parallel, train_lib

  runner = parallel.create(config, devices)
  model = model_lib.build_model(config)
  tx = optimizer.create_optimizer(config)
  init_fn = lambda: train_lib.create_train_state(model, tx, jax.random.key(0))  # noqa: E731
  ckpt = checkpoint.Checkpointer(workdir, keep=2)
  start = ckpt.latest_step()
  if start is None:
    start = 0
    state = runner.init_state(init_fn)
    checkpoint.save_config(workdir, config)
  else:
    abstract = runner.abstract_state(jax.eval_shape(init_fn))
    state, _, meta = ckpt.restore(start, abstract)
    assert meta["step"] == start == int(state.step), (meta, start, state.step)
  step_fn = runner.compile_train_step(
      train_lib.make_train_step(model, tx, config, axis_name=runner.axis_name), state)
  rows = runner.process_rows(ROWS)
  losses = {}
  for step in range(start, steps):
    batch = {k: v[rows] for k, v in global_batch(step).items()}
    state, metrics = step_fn(state, runner.place_batch(batch), jax.random.key(1))
    losses[step + 1] = float(metrics["loss"]) / float(metrics["weight"])
  ckpt.save(steps, runner.host_state(state), {}, {"step": steps})
  ckpt.wait()
  ckpt.close()
  params = multihost_utils.process_allgather(runner.host_state(state).params, tiled=True)
  return losses, jax.tree.map(np.asarray, params)


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
  config = tiny_config(args.parallelism, tuple(int(s) for s in args.mesh.split(",")))
  losses, params = train(config, args.workdir, args.steps)
  if jax.process_index() == 0:
    flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(params)}
    np.savez(os.path.join(args.workdir, f"result_{args.steps}.npz"),
             steps=np.array(sorted(losses)), losses=np.array([losses[s] for s in sorted(losses)]),
             **{f"param{k}": v for k, v in flat.items()})
  print(f"process {jax.process_index()}/{jax.process_count()}: trained to step {args.steps}",
        file=sys.stderr)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  main()
