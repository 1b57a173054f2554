"""The train-step benchmark: peak table lookup, batch sizing, model × dtype rows, the trace."""

import gzip
import json
import logging
import pathlib

import jax
import ml_collections
import pytest

from configs import base
from tests import support
from benchmarks import common, op_profile, train_step


@pytest.mark.parametrize("kind, dtype, peak, entry", [
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989e12, "H100"),
    ("NVIDIA H100 PCIe", "float32", 378e12, "H100 PCIe"),
    ("NVIDIA H200", "float32", 494e12, "H200"),
    ("NVIDIA A100-SXM4-40GB", "bfloat16", 312e12, "A100"),
    ("TPU v4", "bfloat16", 275e12, "TPU v4"),
    ("TPU v5 lite", "bfloat16", 197e12, "TPU v5 lite"),
    ("TPU v5", "bfloat16", 459e12, "TPU v5"),
])
def test_peak_table_picks_the_most_specific_entry(kind, dtype, peak, entry):
  assert common.spec_peak_flops(kind, dtype) == (peak, entry)


def test_unlisted_device_has_no_spec_peak():
  assert common.spec_peak_flops("cpu", "float32") is None


def test_a_given_peak_is_used_for_every_device_without_measuring(monkeypatch):
  def measured(**kwargs):
    raise AssertionError("measured a matmul although --peak_tflops gave the peak")

  monkeypatch.setattr(common, "measured_matmul_peak", measured)
  monkeypatch.setattr(common, "_MEASURED", {})
  assert common.peak_flops("float32", 1.5) == (1.5e12 * jax.device_count(),
                                               "given, 1.5 per device")
  with pytest.raises(AssertionError, match="measured a matmul"):
    common.peak_flops("float32")  # 0: this CPU is not in the table, so it is measured


class _Runner:
  rows_multiple = 8


@pytest.mark.parametrize("tokens, batch, length, rows", [
    (0, 64, 64, 64),  # no budget: --batch_size as given
    (25_000, 64, 64, 384),  # 390 rows, rounded down to what 8 devices split
    (100, 64, 64, 8),  # at least one row per device
])
def test_batch_rows_follow_the_token_budget(tokens, batch, length, rows):
  assert train_step.batch_rows(_Runner(), tokens, batch, length) == rows


def test_variants_cross_models_and_dtypes_and_keep_run_switches():
  config = base.get_config()
  config.model.remat = True
  config.grad_accum_steps = 2
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=2, tensor=1))
  rows = train_step.variants(config, ["base", "big"], ["float32", "bfloat16"])
  assert [(n, c.dtype) for n, c in rows] == [
      ("base", "float32"), ("base", "bfloat16"), ("big", "float32"), ("big", "bfloat16")]
  big = rows[2][1]
  assert big.model.d_model == 1024 and big.model.remat and big.grad_accum_steps == 2
  assert big.mesh.fsdp == 2
  assert [c.dtype for _, c in train_step.variants(config, [], [])] == ["float32"]


def test_named_variants_are_rows_with_the_run_switches_and_a_ratio_to_base():
  config = base.get_config()
  config.model.attention_impl = "xla"
  named = train_step.named_variants("configs/modern.py", "base,swiglu,mqa")
  rows = train_step.variants(config, [], ["float32"], named=named)
  assert [n for n, _ in rows] == ["base", "swiglu", "mqa"]
  assert rows[2][1].model.num_kv_heads == 1 and rows[2][1].model.attention_impl == "xla"
  figures = [{"model": n, "dtype": "float32", "loss_chunk_tokens": 0, "step_seconds": t}
             for n, t in (("base", 2.0), ("swiglu", 3.0), ("mqa", 1.0))]
  assert train_step.ratios_to_base(figures) == [1.0, 1.5, 0.5]
  # MQA's keys and values over one head, SwiGLU's third matrix at 2/3 width: FLOPs follow.
  flops = [common.forward_flops(c.model, 1, 8, 8) for _, c in rows]
  assert flops[2] < flops[0] and abs(flops[1] / flops[0] - 1) < 1e-3


def test_profile_writes_a_trace_and_an_unwritable_folder_is_one_warning(tmp_path, caplog):
  row = train_step.Row(support.tiny_config(), 16, 12, 10)  # test_parallel's program
  blocked = tmp_path / "file"
  blocked.write_text("")
  with caplog.at_level(logging.WARNING):
    assert row.profile(str(blocked / "p"), 1) == {}
  warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 1 and "cannot be written" in warnings[0].getMessage()

  traced = row.profile(str(tmp_path / "p"), 1)
  trace = pathlib.Path(traced["profile_trace"])
  assert trace.is_file() and trace.is_relative_to(tmp_path / "p")
  assert list(trace.parent.glob("*.xplane.pb"))  # what TensorBoard's profile plugin reads
  ops = traced["profile_seconds_per_step"]
  if not ops and "hlo_op" not in gzip.open(trace, "rt").read():
    pytest.skip("this jaxlib's CPU traces name no ops (jax 0.7 does not; 0.10 does)")
  for group in ("projections + feed-forward", "output layer + loss",
                "attention (scores, masks, softmax, weighted sum)",
                "optimizer update (Adam, gradient scaling and norm)"):
    assert ops.get(group, 0) > 0, ops


def test_gpu_kernels_in_a_command_buffer_are_grouped_by_their_own_names(tmp_path):
  """On a GPU, kernels run inside a CUDA graph carry the command buffer as their `hlo_op`;
  XLA's own kernels are named after their instruction ('.' written '_'), a library's are
  not and stay unnamed."""
  hlo = ("HloModule jit_step, entry_computation_layout={()}\n"
         '  %loop_add_fusion.28 = f32[8]{0} fusion(), kind=kLoop, metadata={op_name='
         '"jit(step)/Transformer.decode/decoder/layer_0/ffn/wi/dot_general"}\n'
         '  %input_reduce_fusion.3 = f32[8]{0} fusion(), kind=kInput, metadata={op_name='
         '"jit(step)/jvp(Transformer.logits)/reduce_max"}\n')
  event = lambda name, dur: {"ph": "X", "name": name, "dur": dur, "args": {
      "hlo_module": "jit_step", "hlo_op": "command_buffer_1"}}
  trace = tmp_path / "perfetto_trace.json.gz"
  with gzip.open(trace, "wt") as f:
    json.dump({"traceEvents": [event("loop_add_fusion_28", 3000.0),
                               event("input_reduce_fusion_3", 1000.0),
                               event("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_TNT", 2000.0)]}, f)
  assert op_profile.breakdown(str(trace), hlo, steps=1) == {
      "projections + feed-forward": 0.003, "copies and unnamed ops": 0.002,
      "output layer + loss": 0.001}
