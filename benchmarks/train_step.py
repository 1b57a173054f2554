"""Train-step suite: step time, target tokens/s, MFU, memory and projected training time.

  # the default: --config as given, 64 rows x 64 tokens
  python -m benchmarks --config=configs/base.py --suite=train_step
  # the paper's budget (~25k target tokens per step), base and big, f32 and bf16 side by side
  python -m benchmarks --config=configs/base.py --suite=train_step \\
      --models=base,big --dtypes=float32,bfloat16 --tokens_per_batch=25000
  # memory options for the big model on one accelerator
  ... --config.grad_accum_steps=2 --config.model.remat=True --config.model.attention_impl=cudnn
  # the dense output layer + loss against chunks of 4096 tokens, taking turns 3 times
  ... --loss_chunk_tokens=0,4096 --rounds=3
  # a profiler trace of a few steps of each row, and its op time by role
  ... --profile_dir=runs/profile
  # every row of configs/modern.py, its step time also as a ratio to the base row's
  python -m benchmarks --config=configs/base.py --suite=train_step \
      --variants_of=configs/modern.py --variant_names=all --rounds=3

Batches are random full-length token rows (no padding), so every slot is a real token and the
model FLOPs count only useful work. Each row of the table reports: step time; target tokens
per second; MFU (model matmul FLOPs per second over the device peak: `--peak_tflops` where
given, else the spec-sheet peak of `common.PEAK_FLOPS`, or a matmul measured for 3 s on CPU);
memory (the compiled step's arguments + outputs + temporaries, from XLA, and where the device
reports it the process's peak so far); and the hours `--project_steps` steps (default 100k,
the paper's base run) would take.
With `--variants_of` (a config file with `NAMES`, such as configs/modern.py), each named
variant is a row, and a column gives each row's step time over the `base` row's.
Every row is compiled first, then the rows are timed in `--rounds` turns each, so that rows
compared side by side (e.g. `--loss_chunk_tokens=0,4096`) see the same machine.
With `--profile_dir`, each row also records a `jax.profiler` trace of `--profile_steps` steps
in its own subfolder and prints the step's op time grouped by role (`benchmarks/op_profile.py`).
"""

from __future__ import annotations

import importlib
import os
import runpy

import jax
import numpy as np
from absl import flags

from transformer.run import config_checks
from transformer.model import transformer as model_lib
from transformer.training import optimizer
from transformer.training import parallel
from transformer.training import steps as steps_lib
from benchmarks import common
from benchmarks import op_profile

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
_PEAK_TFLOPS = flags.DEFINE_float(
    "peak_tflops", 0.0, "One device's peak TFLOP/s for MFU, in the rows' dtype; 0: the spec "
    "sheet's (common.PEAK_FLOPS), or on a device the table lacks (a CPU) a jitted matmul "
    "measured for 3 s.")
_LOSS_CHUNKS = flags.DEFINE_list(
    "loss_chunk_tokens", [], "config.loss_chunk_tokens values measured side by side (e.g. "
    "0,4096; 0 = the dense output layer and loss); default: --config's.")
_ROUNDS = flags.DEFINE_integer(
    "rounds", 1, "Rows take turns this many times, each timed for --min_seconds / rounds "
    "per turn; every row's figure is the median of its steps.")
_DROPOUT_RNGS = flags.DEFINE_list(
    "dropout_rng_impls", [], "config.dropout_rng_impl values measured side by side (e.g. "
    "threefry2x32,rbg); default: --config's.")
_PROFILE_DIR = flags.DEFINE_string(
    "profile_dir", None, "Write a jax.profiler trace of each row's step here (one subfolder "
    "per row) and print where its time goes; an unwritable folder is a warning.")
_PROFILE_STEPS = flags.DEFINE_integer("profile_steps", 2, "Steps in each profiler trace.")
_VARIANTS_OF = flags.DEFINE_string(
    "variants_of", None, "A config file with NAMES and get_config(name), e.g. "
    "configs/modern.py: its --variant_names are the rows (with --config's implementation "
    "switches), each step time also given over the 'base' row's; instead of --models.")
_VARIANT_NAMES = flags.DEFINE_string("variant_names", "all", "Comma-separated variant names "
                                     "of --variants_of, or 'all'.")

# What a named model in --models takes over from --config: how to run, not what to compute.
CARRIED = ("grad_accum_steps", "parallelism", "mesh")
CARRIED_MODEL = ("attention_impl", "remat")


def random_batch(vocab_size: int, batch: int, src_len: int, tgt_len: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  return {"inputs": rng.integers(3, vocab_size, (batch, src_len), dtype=np.int32),
          "targets": rng.integers(3, vocab_size, (batch, tgt_len), dtype=np.int32)}


def _carry(config, variant):
  """`variant` run as `config` says: its implementation switches (`CARRIED*`)."""
  for key in CARRIED:
    variant[key] = config[key]
  for key in CARRIED_MODEL:
    variant.model[key] = config.model[key]
  return variant


def named_variants(config_file: str, names: str) -> list[tuple[str, object]]:
  """`(name, config)` of the variants `names` ('all' or comma-separated) of a config file
  with `NAMES` (the sweep's rule: `sweep.select`)."""
  from transformer.research import sweep

  get_config = runpy.run_path(config_file)["get_config"]
  return [(name, get_config(name)) for name in sweep.select(config_file, names)]


def variants(config, models: list[str], dtypes: list[str], loss_chunks: list[int] = (),
             rng_impls: list[str] = (),
             named: list[tuple[str, object]] = ()) -> list[tuple[str, object]]:
  """`(name, config)` for each model (or `named` variant) × dtype × loss_chunk_tokens ×
  dropout_rng_impl to measure."""
  if named:
    named = [(name, _carry(config, variant)) for name, variant in named]
  elif models:
    named = [(name, _carry(config, importlib.import_module(f"configs.{name}").get_config()))
             for name in models]
  else:
    named = [("config", config)]
  out = []
  for name, variant in named:
    for dtype in dtypes or [variant.dtype]:
      for chunk in loss_chunks or [config.loss_chunk_tokens]:
        for impl in rng_impls or [config.dropout_rng_impl]:
          copy = variant.copy_and_resolve_references()
          copy.dtype, copy.loss_chunk_tokens, copy.dropout_rng_impl = dtype, chunk, impl
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


class Row:
  """One compiled train step ready to time: `run_once()` runs a step and waits for it."""

  def __init__(self, config, batch: int | None, src_len: int, tgt_len: int,
               tokens_per_batch: int = 0):
    config_checks.validate(config)
    runner = parallel.create(config)
    batch = batch_rows(runner, tokens_per_batch, batch or 0, tgt_len)
    model = model_lib.build_model(config)
    tx = optimizer.create_optimizer(config)
    state = runner.init_state(
        lambda: steps_lib.create_train_state(model, tx, jax.random.key(0)))
    step = runner.compile_train_step(
        steps_lib.make_train_step(model, tx, config, axis_name=runner.axis_name), state)
    self.data = runner.place_batch(
        random_batch(config.model.vocab_size, batch, src_len, tgt_len))
    self.rng = steps_lib.dropout_key(jax.random.key(1), config.dropout_rng_impl)
    self.step, compiled_bytes = _compile(runner, step, (state, self.data, self.rng))
    self.state = state
    self.config, self.shape = config, (batch, src_len, tgt_len)
    self.figures = {
        "num_params": model_lib.count_params(state.params),
        "batch_size": batch, "source_length": src_len, "target_length": tgt_len,
        "grad_accum_steps": config.grad_accum_steps, "dtype": config.dtype,
        "attention_impl": config.model.attention_impl, "remat": config.model.remat,
        "dropout_rng_impl": config.dropout_rng_impl,
        "loss_chunk_tokens": config.loss_chunk_tokens,
        "compiled_memory_gib": compiled_bytes / 2 ** 30 if compiled_bytes else None,
    }

  def run_once(self) -> None:
    self.state, m = self.step(self.state, self.data, self.rng)
    jax.block_until_ready(m["loss"])

  def profile(self, directory: str, steps: int) -> dict:
    """Traces `steps` steps into `directory`: the trace's path and, where the compiled
    program's text is at hand (jit), op seconds per step by role (`op_profile.breakdown`)."""
    path = op_profile.trace(self.run_once, directory, steps)
    if not path:
      return {}
    out = {"profile_trace": path}
    if hasattr(self.step, "as_text"):
      out["profile_seconds_per_step"] = op_profile.breakdown(path, self.step.as_text(), steps)
    return out

  def result(self, seconds: float, project_steps: int, peak_tflops: float = 0.0) -> dict:
    """The figures for a step time of `seconds` (MFU against `common.peak_flops`)."""
    batch, src_len, tgt_len = self.shape
    flops = common.train_step_flops(self.config.model, batch, src_len, tgt_len)
    peak, peak_source = common.peak_flops(self.config.dtype, peak_tflops)
    stats = jax.local_devices()[0].memory_stats() or {}
    runtime_peak = stats.get("peak_bytes_in_use")
    return {
        **self.figures,
        "step_seconds": seconds,
        "target_tokens_per_sec": batch * tgt_len / seconds,
        "model_tflop_per_step": flops / 1e12,
        "model_tflops_per_sec": flops / seconds / 1e12,
        "peak_tflops": peak / 1e12, "peak_source": peak_source,
        "mfu": flops / seconds / peak,
        "peak_memory_gib": runtime_peak / 2 ** 30 if runtime_peak else None,
        "project_steps": project_steps,
        "projected_hours": seconds * project_steps / 3600,
    }


def _gib(x) -> str:
  return "-" if x is None else f"{x:.2f}"


def ratios_to_base(rows: list[dict]) -> list[float | None]:
  """Each row's step time over that of the row named 'base' run the same way (dtype, loss
  chunking, dropout's generator); None where there is none."""
  def how(r):
    return r["dtype"], r["loss_chunk_tokens"], r.get("dropout_rng_impl")

  base = {how(r): r["step_seconds"]
          for r in rows if r["model"] == "base" and "step_seconds" in r}
  return [r["step_seconds"] / base[how(r)] if "step_seconds" in r and how(r) in base else None
          for r in rows]


def run(config, workdir: str) -> dict:
  del workdir
  rows, prepared = [], []
  print(f"device {common.device_name()}")
  named = named_variants(_VARIANTS_OF.value, _VARIANT_NAMES.value) if _VARIANTS_OF.value else ()
  for name, variant in variants(config, _MODELS.value, _DTYPES.value,
                                [int(c) for c in _LOSS_CHUNKS.value], _DROPOUT_RNGS.value,
                                named):
    try:
      prepared.append((name, Row(variant, _BATCH.value, _SRC_LEN.value, _TGT_LEN.value,
                                 _TOKENS.value)))
    except jax.errors.JaxRuntimeError as e:
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      # One row that does not fit should not lose the others.
      print(f"{name:<7}{variant.dtype:<10} out of device memory: try "
            "--config.grad_accum_steps=2 (or more) or --config.model.remat=True", flush=True)
      rows.append({"model": name, "dtype": variant.dtype, "error": "out of device memory"})
  seconds = common.alternate([row.run_once for _, row in prepared], _ROUNDS.value,
                             _MIN_SECONDS.value)
  for (name, row), t in zip(prepared, seconds):
    fig = {"model": name, **row.result(t, _PROJECT_STEPS.value, _PEAK_TFLOPS.value)}
    if _PROFILE_DIR.value:
      fig.update(row.profile(os.path.join(
          _PROFILE_DIR.value, f"{name}-{fig['dtype']}-chunk{fig['loss_chunk_tokens']}-"
          f"{fig['dropout_rng_impl']}"), _PROFILE_STEPS.value))
    rows.append(fig)
  ratios = ratios_to_base(rows)
  width = max([7, *(len(name) + 1 for name, _ in prepared)])
  header = (f"{'model':<{width}}{'dtype':<10}{'chunk':>6}{'dropout rng':>13}{'params':>8}"
            f"{'batch':>15}{'step ms':>10}{'x base':>8}{'tgt tok/s':>11}{'TFLOP/s':>9}{'MFU':>7}"
            f"{'mem GiB':>9}{'peak GiB':>9}{'h/' + format(_PROJECT_STEPS.value, ','):>12}")
  print(header)
  for fig, ratio in zip(rows, ratios):
    if "error" in fig:
      continue
    batch = f"{fig['batch_size']}x{fig['source_length']}/{fig['target_length']}"
    fig["step_ratio_to_base"] = ratio
    print(f"{fig['model']:<{width}}{fig['dtype']:<10}{fig['loss_chunk_tokens']:>6}"
          f"{fig['dropout_rng_impl']:>13}{fig['num_params'] / 1e6:>7.1f}M{batch:>15}"
          f"{fig['step_seconds'] * 1e3:>10.1f}{'-' if ratio is None else f'{ratio:.2f}':>8}"
          f"{fig['target_tokens_per_sec']:>11,.0f}"
          f"{fig['model_tflops_per_sec']:>9.3f}{fig['mfu']:>7.1%}"
          f"{_gib(fig['compiled_memory_gib']):>9}{_gib(fig['peak_memory_gib']):>9}"
          f"{fig['projected_hours']:>12.1f}", flush=True)
  print("batch = rows x source/target tokens; chunk = config.loss_chunk_tokens (0: dense "
        "output layer + loss); x base = step time over the 'base' row's (the rows timed in "
        "turns); MFU = model matmul FLOPs (3 x forward) / peak; mem = XLA's "
        "estimate for the step (arguments + outputs + temporaries); peak = the device's peak "
        "bytes in use so far (GPU/TPU only); h/N = hours for N steps")
  measured = [r for r in rows if "error" not in r]
  for peak_source in sorted({r["peak_source"] for r in measured}):
    used = sorted({f"{r['peak_tflops']:.3g}" for r in measured
                   if r["peak_source"] == peak_source})
    print(f"peak TFLOP/s {', '.join(used)}: {peak_source}")
  for r in measured:
    if "profile_trace" in r and not r.get("profile_seconds_per_step"):
      print(f"\n{r['model']} {r['dtype']}: trace {r['profile_trace']} names no ops (an older "
            "jaxlib's CPU trace)")
    elif r.get("profile_seconds_per_step"):
      ops = r["profile_seconds_per_step"]
      print(f"\n{r['model']} {r['dtype']} chunk {r['loss_chunk_tokens']}: op time per step "
            f"by role (summed over threads; step {r['step_seconds'] * 1e3:.0f} ms), trace "
            f"{r['profile_trace']}")
      for group, sec in ops.items():
        print(f"  {group:<52}{sec * 1e3:>10.1f} ms{sec / sum(ops.values()):>7.1%}")
  return {"measurements": rows}
