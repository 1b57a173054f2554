"""The train-step benchmark's pure parts: peak table lookup, batch sizing, model × dtype rows."""

import ml_collections
import pytest

from configs import base
from transformer.benchmark import common, train_step


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
