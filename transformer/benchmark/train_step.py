"""Train-step suite: step time, target tokens/s and MFU of the jitted train step.

  python -m transformer.benchmark --config=configs/base.py --suite=train_step \\
      --batch_size=64 --source_length=64 --target_length=64

Batches are random full-length token rows (no padding), so every slot is a real token.
"""

from __future__ import annotations

import jax
import numpy as np
from absl import flags

from transformer import config_checks
from transformer import model as model_lib
from transformer import optimizer
from transformer import parallel
from transformer import train_lib
from transformer.benchmark import common

_BATCH = flags.DEFINE_integer("batch_size", 64, "Rows per train step (global).")
_SRC_LEN = flags.DEFINE_integer("source_length", 64, "Source tokens per row.")
_TGT_LEN = flags.DEFINE_integer("target_length", 64, "Target tokens per row.")


def random_batch(vocab_size: int, batch: int, src_len: int, tgt_len: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  return {"inputs": rng.integers(3, vocab_size, (batch, src_len), dtype=np.int32),
          "targets": rng.integers(3, vocab_size, (batch, tgt_len), dtype=np.int32)}


def measure(config, batch: int, src_len: int, tgt_len: int) -> dict:
  """Times the compiled train step of `config` at one batch shape; returns figures."""
  config_checks.validate(config)
  runner = parallel.create(config)
  model = model_lib.build_model(config)
  tx = optimizer.create_optimizer(config)
  state = runner.init_state(
      lambda: train_lib.create_train_state(model, tx, jax.random.key(0)))
  step = runner.compile_train_step(train_lib.make_train_step(model, tx, config), state)
  data = runner.place_batch(random_batch(config.model.vocab_size, batch, src_len, tgt_len))
  rng = jax.random.key(1)
  holder = {"state": state}

  def run_once():
    holder["state"], m = step(holder["state"], data, rng)
    jax.block_until_ready(m["loss"])

  seconds = common.time_fn(run_once, warmup=2, min_runs=3, min_seconds=5.0)
  flops = common.train_step_flops(config.model, batch, src_len, tgt_len)
  peak, peak_source = common.peak_flops(config.dtype)
  stats = jax.devices()[0].memory_stats() or {}
  return {
      "batch_size": batch, "source_length": src_len, "target_length": tgt_len,
      "dtype": config.dtype, "step_seconds": seconds,
      "target_tokens_per_sec": batch * tgt_len / seconds,
      "model_tflop_per_step": flops / 1e12,
      "model_tflops_per_sec": flops / seconds / 1e12,
      "peak_tflops": peak / 1e12, "peak_source": peak_source,
      "mfu": flops / seconds / peak,
      "peak_memory_gib": stats.get("peak_bytes_in_use", 0) / 2 ** 30 or None,
  }


def run(config, workdir: str) -> dict:
  del workdir
  fig = measure(config, _BATCH.value, _SRC_LEN.value, _TGT_LEN.value)
  print(f"device            {common.device_name()}")
  print(f"batch             {fig['batch_size']} x ({fig['source_length']} src, "
        f"{fig['target_length']} tgt) tokens, {fig['dtype']}")
  print(f"step time         {fig['step_seconds'] * 1e3:.1f} ms")
  print(f"target tokens/s   {fig['target_tokens_per_sec']:,.0f}")
  print(f"model FLOP/step   {fig['model_tflop_per_step']:.3f} T (3 x forward matmuls)")
  print(f"model FLOP/s      {fig['model_tflops_per_sec']:.3f} T")
  print(f"peak FLOP/s       {fig['peak_tflops']:.3f} T ({fig['peak_source']})")
  print(f"MFU               {fig['mfu']:.1%}")
  if fig["peak_memory_gib"]:
    print(f"peak memory       {fig['peak_memory_gib']:.2f} GiB")
  return fig
