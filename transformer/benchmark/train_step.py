"""Train-step suite: step time, target tokens/s, MFU, memory and projected training time.

  # the default: --config as given, 64 rows x 64 tokens
  python -m transformer.benchmark --config=configs/base.py --suite=train_step
  # the paper's budget (~25k target tokens per step), base and big, f32 and bf16 side by side
  python -m transformer.benchmark --config=configs/base.py --suite=train_step \\
      --models=base,big --dtypes=float32,bfloat16 --tokens_per_batch=25000
  # memory options for the big model on one accelerator
  ... --config.grad_accum_steps=2 --config.model.remat=True --config.model.attention_impl=cudnn

Batches are random full-length token rows (no padding), so every slot is a real token and the
model FLOPs count only useful work. Each row of the table reports: step time; target tokens
per second; MFU (model matmul FLOPs per second over the device peak: the spec-sheet peak of
`common.PEAK_FLOPS`, or a measured matmul on CPU); memory (the compiled step's arguments +
outputs + temporaries, from XLA, and where the device reports it the process's peak so far);
and the hours `--project_steps` steps (default 100k, the paper's base run) would take.
"""

from __future__ import annotations

import importlib

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
_TOKENS = flags.DEFINE_integer(
    "tokens_per_batch", 0, "If > 0, rows per step = this // --target_length, rounded down to "
    "what the devices and grad_accum_steps split (the paper: 25000); else --batch_size.")
_MODELS = flags.DEFINE_list(
    "models", [], "Configs in configs/ to measure (e.g. base,big), each with --config's "
    "implementation switches (attention_impl, remat, grad_accum_steps, parallelism, mesh); "
    "default: --config itself.")
_DTYPES = flags.DEFINE_list(
    "dtypes", [], "Compute dtypes measured side by side (e.g. float32,bfloat16); default: "
    "config.dtype.")
_PROJECT_STEPS = flags.DEFINE_integer(
    "project_steps", 100_000, "Steps in the projected training time (paper base: 100k).")
_MIN_SECONDS = flags.DEFINE_float("min_seconds", 5.0, "Time each row for at least this long.")

# What a named model in --models takes over from --config: how to run, not what to compute.
CARRIED = ("grad_accum_steps", "parallelism", "mesh")
CARRIED_MODEL = ("attention_impl", "remat")


def random_batch(vocab_size: int, batch: int, src_len: int, tgt_len: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  return {"inputs": rng.integers(3, vocab_size, (batch, src_len), dtype=np.int32),
          "targets": rng.integers(3, vocab_size, (batch, tgt_len), dtype=np.int32)}


def variants(config, models: list[str], dtypes: list[str]) -> list[tuple[str, object]]:
  """`(name, config)` for each model × dtype to measure."""
  named = [("config", config)]
  if models:
    named = []
    for name in models:
      variant = importlib.import_module(f"configs.{name}").get_config()
      for key in CARRIED:
        variant[key] = config[key]
      for key in CARRIED_MODEL:
        variant.model[key] = config.model[key]
      named.append((name, variant))
  out = []
  for name, variant in named:
    for dtype in dtypes or [variant.dtype]:
      copy = variant.copy_and_resolve_references()
      copy.dtype = dtype
      out.append((name, copy))
  return out


def batch_rows(runner, tokens_per_batch: int, batch_size: int, tgt_len: int) -> int:
  """Rows per step: from the token budget if given, as a multiple the devices can split."""
  if tokens_per_batch <= 0:
    return batch_size
  multiple = runner.rows_multiple
  return max(tokens_per_batch // tgt_len // multiple, 1) * multiple


def _compile(runner, step, args):
  """The executable and XLA's memory estimate in bytes (None where it cannot be had)."""
  if runner.axis_name is not None:  # pmap: compiled on first call; no ahead-of-time handle
    return step, None
  compiled = step.lower(*args).compile()
  m = compiled.memory_analysis()
  if m is None:
    return compiled, None
  return compiled, (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
                    + m.temp_size_in_bytes)


def measure(config, batch: int | None, src_len: int, tgt_len: int, *,
            tokens_per_batch: int = 0, min_seconds: float = 5.0,
            project_steps: int = 100_000) -> dict:
  """Times the compiled train step of `config` at one batch shape; returns figures."""
  config_checks.validate(config)
  runner = parallel.create(config)
  batch = batch_rows(runner, tokens_per_batch, batch or 0, tgt_len)
  model = model_lib.build_model(config)
  tx = optimizer.create_optimizer(config)
  state = runner.init_state(
      lambda: train_lib.create_train_state(model, tx, jax.random.key(0)))
  step = runner.compile_train_step(
      train_lib.make_train_step(model, tx, config, axis_name=runner.axis_name), state)
  data = runner.place_batch(random_batch(config.model.vocab_size, batch, src_len, tgt_len))
  rng = jax.random.key(1)
  step, compiled_bytes = _compile(runner, step, (state, data, rng))
  holder = {"state": state}

  def run_once():
    holder["state"], m = step(holder["state"], data, rng)
    jax.block_until_ready(m["loss"])

  seconds = common.time_fn(run_once, warmup=2, min_runs=3, min_seconds=min_seconds)
  flops = common.train_step_flops(config.model, batch, src_len, tgt_len)
  peak, peak_source = common.peak_flops(config.dtype)
  stats = jax.local_devices()[0].memory_stats() or {}
  runtime_peak = stats.get("peak_bytes_in_use")
  return {
      "num_params": model_lib.count_params(state.params),
      "batch_size": batch, "source_length": src_len, "target_length": tgt_len,
      "grad_accum_steps": config.grad_accum_steps, "dtype": config.dtype,
      "attention_impl": config.model.attention_impl, "remat": config.model.remat,
      "step_seconds": seconds,
      "target_tokens_per_sec": batch * tgt_len / seconds,
      "model_tflop_per_step": flops / 1e12,
      "model_tflops_per_sec": flops / seconds / 1e12,
      "peak_tflops": peak / 1e12, "peak_source": peak_source,
      "mfu": flops / seconds / peak,
      "compiled_memory_gib": compiled_bytes / 2 ** 30 if compiled_bytes else None,
      "peak_memory_gib": runtime_peak / 2 ** 30 if runtime_peak else None,
      "project_steps": project_steps,
      "projected_hours": seconds * project_steps / 3600,
  }


def _gib(x) -> str:
  return "-" if x is None else f"{x:.2f}"


def run(config, workdir: str) -> dict:
  del workdir
  rows = []
  print(f"device {common.device_name()}")
  header = (f"{'model':<7}{'dtype':<10}{'params':>8}{'batch':>15}{'step ms':>10}"
            f"{'tgt tok/s':>11}{'TFLOP/s':>9}{'MFU':>7}{'mem GiB':>9}{'peak GiB':>9}"
            f"{'h/' + format(_PROJECT_STEPS.value, ','):>12}")
  print(header)
  for name, variant in variants(config, _MODELS.value, _DTYPES.value):
    try:
      fig = measure(variant, _BATCH.value, _SRC_LEN.value, _TGT_LEN.value,
                    tokens_per_batch=_TOKENS.value, min_seconds=_MIN_SECONDS.value,
                    project_steps=_PROJECT_STEPS.value)
    except jax.errors.JaxRuntimeError as e:
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      # One row that does not fit should not lose the others.
      print(f"{name:<7}{variant.dtype:<10} out of device memory: try "
            "--config.grad_accum_steps=2 (or more) or --config.model.remat=True", flush=True)
      rows.append({"model": name, "dtype": variant.dtype, "error": "out of device memory"})
      continue
    fig["model"] = name
    rows.append(fig)
    batch = f"{fig['batch_size']}x{fig['source_length']}/{fig['target_length']}"
    print(f"{name:<7}{fig['dtype']:<10}{fig['num_params'] / 1e6:>7.1f}M{batch:>15}"
          f"{fig['step_seconds'] * 1e3:>10.1f}{fig['target_tokens_per_sec']:>11,.0f}"
          f"{fig['model_tflops_per_sec']:>9.3f}{fig['mfu']:>7.1%}"
          f"{_gib(fig['compiled_memory_gib']):>9}{_gib(fig['peak_memory_gib']):>9}"
          f"{fig['projected_hours']:>12.1f}", flush=True)
  print("batch = rows x source/target tokens; MFU = model matmul FLOPs (3 x forward) / peak; "
        "mem = XLA's estimate for the step (arguments + outputs + temporaries); peak = the "
        "device's peak bytes in use so far (GPU/TPU only); h/N = hours for N steps")
  measured = [r for r in rows if "error" not in r]
  for peak_source in sorted({r["peak_source"] for r in measured}):
    used = sorted({f"{r['peak_tflops']:.3g}" for r in measured
                   if r["peak_source"] == peak_source})
    print(f"peak TFLOP/s {', '.join(used)}: {peak_source}")
  return {"measurements": rows}
