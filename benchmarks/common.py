"""What every benchmark suite shares: the device, its peak FLOP/s, model FLOPs, timing.

Model FLOPs count the matrix multiplications a step performs (the standard MFU convention):
per layer, the Q/K/V/output projections, the attention scores and weighted sums over the
padded lengths (causal masking not subtracted), and the feed-forward network; the tied
output projection; a training step is 3× the forward pass (backward = 2× forward).
"""

from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from transformer import records
from transformer.model import config as model_config

# Dense matmul peaks in FLOP/s from vendor specifications, matched in order as substrings of
# `device_kind` (so "H100 PCIe" before "H100", "TPU v5 lite" (v5e) before "TPU v5" (v5p)).
# float32 matmuls run as TF32 on NVIDIA GPUs and as bfloat16 passes on TPUs under JAX's
# default matmul precision, so their peaks are those rates.
PEAK_FLOPS = {
    "H200": {"bfloat16": 989e12, "float32": 494e12},  # SXM
    "H100 PCIe": {"bfloat16": 756e12, "float32": 378e12},
    "H100": {"bfloat16": 989e12, "float32": 494e12},  # SXM
    "A100": {"bfloat16": 312e12, "float32": 156e12},
    "TPU v4": {"bfloat16": 275e12, "float32": 275e12},
    "TPU v5 lite": {"bfloat16": 197e12, "float32": 197e12},  # v5e
    "TPU v5e": {"bfloat16": 197e12, "float32": 197e12},
    "TPU v5p": {"bfloat16": 459e12, "float32": 459e12},
    "TPU v5": {"bfloat16": 459e12, "float32": 459e12},  # v5p reports "TPU v5"
    "TPU v6 lite": {"bfloat16": 918e12, "float32": 918e12},  # v6e (Trillium)
}


# The device a figure was measured on, as the records name it (`cpu:AMD EPYC, 2 cores x1`).
device_name = records.device_name
cpu_model = records.cpu_model


def time_fn(fn: Callable[[], object], *, warmup: int = 1, min_runs: int = 3,
            min_seconds: float = 2.0, best: bool = False) -> float:
  """Median seconds per call of `fn` (which must block until its result is ready), or with
  `best` the fastest call."""
  for _ in range(warmup):
    fn()
  times = []
  start = time.perf_counter()
  while len(times) < min_runs or time.perf_counter() - start < min_seconds:
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  times.sort()
  return times[0] if best else times[len(times) // 2]


def alternate(calls: list[Callable[[], object]], rounds: int, min_seconds: float, *,
              warmup: int = 2, min_runs: int = 3) -> list[float]:
  """Median seconds per call of each of `calls` (which block until done), timed in `rounds`
  turns: on a shared machine a slow spell then slows every row alike. Each row runs at least
  `min_runs` times and about `min_seconds` in all, after `warmup` untimed calls."""
  for call in calls:
    for _ in range(warmup):
      call()
  per_turn = -(-min_runs // rounds)
  times = [[] for _ in calls]
  for _ in range(rounds):
    for call, ts in zip(calls, times):
      start, n = time.perf_counter(), 0
      while n < per_turn or time.perf_counter() - start < min_seconds / rounds:
        t = time.perf_counter()
        call()
        ts.append(time.perf_counter() - t)
        n += 1
  return [float(np.median(ts)) for ts in times]


def measured_matmul_peak(n: int = 2048, dtype=jnp.float32) -> float:
  """FLOP/s of a jitted n×n matmul on the default device: the attainable peak on CPU.

  The fastest of many calls over 3 s: on a shared machine other work only ever slows a call
  down, and a peak read low would inflate every MFU measured against it.
  """
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda x: x @ x)
  seconds = time_fn(lambda: f(a).block_until_ready(), min_seconds=3.0, best=True)
  return 2 * n ** 3 / seconds


_MEASURED: dict[str, float] = {}


def spec_peak_flops(device_kind: str, dtype: str) -> tuple[float, str] | None:
  """(peak FLOP/s of one device, table entry) for a device kind, or None if not listed."""
  for name, peaks in PEAK_FLOPS.items():
    if name.lower() in device_kind.lower():
      return peaks[dtype], name
  return None


def peak_flops(dtype: str, given_tflops: float = 0.0) -> tuple[float, str]:
  """(peak FLOP/s of all devices, where it comes from) for the device kind and dtype.

  `given_tflops` > 0 is one device's peak as the user knows it (a device the table lacks, or
  a CPU measured before). Otherwise a device kind not in `PEAK_FLOPS` (a CPU) gets a measured
  2048² jitted matmul in `dtype`, once per process: about 3 s of every core.
  """
  if given_tflops > 0:
    return given_tflops * 1e12 * jax.device_count(), f"given, {given_tflops:g} per device"
  kind = jax.devices()[0].device_kind
  spec = spec_peak_flops(kind, dtype)
  if spec is not None:
    return spec[0] * jax.device_count(), f"spec sheet ({spec[1]}, {dtype})"
  if dtype not in _MEASURED:
    _MEASURED[dtype] = measured_matmul_peak(dtype=jnp.dtype(dtype))
  return (_MEASURED[dtype] * jax.device_count(),
          f"measured 2048² jitted {dtype} matmul on {kind}")


def forward_flops(model_cfg, batch: int, src_len: int, tgt_len: int) -> float:
  """Matmul FLOPs of one forward pass over a `[batch, src_len]` → `[batch, tgt_len]` batch
  (keys and values over the key/value heads, a gated feed-forward's third matrix; relative
  position terms, which are not matmuls of the model's width, left out)."""
  m = model_config.ModelConfig(**dict(model_cfg))  # `config.model`, its derived widths
  d, h, k, v, g, f, n = m.d_model, m.num_heads, m.d_k, m.d_v, m.kv_heads, m.ffn_width, m.num_layers
  gated = m.activation in model_config.GATED
  proj = 2 * d * (h * k + g * (k + v)) + 2 * h * v * d  # Q, K, V, output per token
  ffn = (3 if gated else 2) * 2 * d * f

  def attend(q_len, kv_len):  # scores and weighted sum, per query token
    return 2 * kv_len * h * (k + v)

  encoder = src_len * (proj + attend(src_len, src_len) + ffn)
  decoder_self = tgt_len * (proj + attend(tgt_len, tgt_len) + ffn)
  cross = tgt_len * (2 * d * h * k + 2 * h * v * d + attend(tgt_len, src_len))
  cross += src_len * 2 * d * g * (k + v)  # keys/values of the encoder output
  logits = tgt_len * 2 * d * m.vocab_size
  return batch * (n * (encoder + decoder_self + cross) + logits)


def train_step_flops(model_cfg, batch: int, src_len: int, tgt_len: int) -> float:
  return 3 * forward_flops(model_cfg, batch, src_len, tgt_len)
