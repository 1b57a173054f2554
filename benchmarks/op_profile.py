"""Where a compiled step's time goes: a `jax.profiler` trace, and its ops grouped by role.

`trace` records a few calls of a step into a folder (TensorBoard's profile plugin reads the
`.xplane.pb`; https://ui.perfetto.dev opens the `perfetto_trace.json.gz`). `breakdown` reads
the Perfetto trace back: every op the step's program ran is a trace event naming its HLO
instruction, and the compiled program's text names, for each instruction, the JAX operation
and the Flax module it came from (`op_name`, e.g. `.../decoder/layer_0/ffn/wi/dot_general`).
That path decides the group. XLA fuses neighbouring operations, and a fusion is counted
under the operation that ends it, so the groups are approximate at their edges. Op times
are summed over the threads that ran them, so on a CPU they can add up to more than the
step's wall time.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
from typing import Callable

import jax
from absl import logging

from transformer.run import writable

# (group, test on the instruction's op_name), first match wins. Model ops carry the Flax
# module path ("Transformer.decode/decoder/layer_0/..."); what the loss and the optimizer do
# lies outside it, the loss inside the differentiated function (jvp/transpose), the optimizer
# after it.
GROUPS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("parameter copies", lambda n: n.startswith("state.")),
    ("dropout", lambda n: "Dropout" in n or "threefry" in n or "random_bits" in n),
    ("LayerNorm + residual", lambda n: "Transformer" in n and (
        re.search(r"/(norm|final_norm)/", n) is not None or re.search(r"_block/add", n)
        is not None)),
    ("output layer + loss", lambda n: "Transformer.logits" in n or (
        "shared_embedding.attend" in n) or ("Transformer" not in n and "jvp(" in n)),
    ("projections + feed-forward", lambda n: re.search(
        r"/(query|key|value|out|wi|wo)/|/ffn/", n) is not None),
    ("attention (scores, masks, softmax, weighted sum)", lambda n: "attention" in n),
    ("embeddings + positions", lambda n: "embedder" in n),
    ("masks and other model ops", lambda n: "Transformer" in n),
    ("optimizer update (Adam, gradient scaling and norm)", lambda n: n.startswith("jit(")),
)
UNNAMED = "copies and unnamed ops"


def trace(run_once: Callable[[], None], directory: str, steps: int) -> str | None:
  """Records `steps` calls of `run_once` (which blocks until done) into `directory`.

  Returns:
    The Perfetto trace written, or None when `directory` cannot be written: one warning,
    and nothing is traced.
  """
  reason = writable.cannot_write(directory)
  if reason is not None:
    logging.warning("profile folder %s cannot be written (%s): running without a trace",
                    directory, reason)
    return None
  with jax.profiler.trace(directory, create_perfetto_trace=True):
    for _ in range(steps):
      run_once()
  found = sorted(glob.glob(os.path.join(directory, "plugins", "profile", "*",
                                        "perfetto_trace.json.gz")), key=os.path.getmtime)
  return found[-1] if found else None


def op_names(hlo_text: str) -> dict[str, str]:
  """Instruction name -> `op_name` metadata, from a compiled program's `as_text()`."""
  names = {}
  for line in hlo_text.splitlines():
    match = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name=\"([^\"]*)\"", line)
    if match:
      names[match.group(1)] = match.group(2)
  return names


def group_of(op_name: str | None) -> str:
  if not op_name:
    return UNNAMED
  for group, test in GROUPS:
    if test(op_name):
      return group
  return UNNAMED


def breakdown(perfetto_path: str, hlo_text: str, steps: int) -> dict[str, float]:
  """Seconds per step of each group's ops, from a trace of `steps` calls of the program
  whose compiled text is `hlo_text`."""
  module = re.search(r"HloModule (\S+?),", hlo_text).group(1)
  names = op_names(hlo_text)
  with gzip.open(perfetto_path, "rt") as f:
    data = json.load(f)
  events = data["traceEvents"] if isinstance(data, dict) else data
  seconds: dict[str, float] = {}
  # Kernels that XLA emits are named after their instruction, '.' written '_'.
  by_kernel = {name.replace(".", "_"): op for name, op in names.items()}
  for e in events:
    args = e.get("args") or {}
    if e.get("ph") != "X" or args.get("hlo_module") != module or "hlo_op" not in args:
      continue
    # On GPUs, kernels run inside a command buffer (a CUDA graph) carry its name as their
    # `hlo_op`: the kernel's own name tells XLA's fusions; a library's (cuBLAS) stays
    # unnamed unless the command buffers are off (docs/performance.md).
    op = names.get(args["hlo_op"]) or by_kernel.get(e.get("name", ""))
    group = group_of(op)
    seconds[group] = seconds.get(group, 0.0) + e["dur"] * 1e-6 / steps
  return dict(sorted(seconds.items(), key=lambda kv: -kv[1]))
