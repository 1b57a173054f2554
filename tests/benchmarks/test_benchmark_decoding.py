"""The decoding benchmark's pure parts: the weights a step multiplies by, interleaved timing."""

import jax
import pytest

from configs import base
from transformer.model import transformer as model_lib
from benchmarks import common, decoding
from transformer import records


@pytest.mark.parametrize("d_k, d_v", [(8, 8), (4, 8)])
def test_step_kernels_are_the_products_of_a_decoding_step(d_k, d_v):
  """Their sizes add up to a one-token decoder pass's matrix FLOPs as `common` counts them
  (minus the attention over one position), Table 3 row (B)'s d_k != d_v included."""
  config = base.get_config()
  config.model.update(vocab_size=50, d_model=16, d_ff=24, num_heads=2, d_k=d_k, d_v=d_v,
                      num_layers=3)
  model = model_lib.build_model(config)
  # Shapes are all this needs: traced, not computed.
  kernels = jax.eval_shape(lambda: decoding.step_kernels(
      model_lib.init_params(model, jax.random.key(0))))
  assert all(k.ndim == 2 for k in kernels)
  assert kernels[-1].shape == (16, 50)  # the tied output projection comes last
  m = config.model
  attention_over_one_position = m.num_layers * 2 * m.num_heads * (m.d_k + m.d_v)
  expected = common.forward_flops(m, batch=1, src_len=0, tgt_len=1) - attention_over_one_position
  assert 2 * sum(k.size for k in kernels) == expected


def test_alternate_takes_turns_and_returns_medians():
  order = []
  calls = [lambda: order.append("a"), lambda: order.append("b")]
  seconds = common.alternate(calls, 3, 0.0, warmup=0, min_runs=3)
  assert order == ["a", "b"] * 3
  assert len(seconds) == 2 and all(t >= 0 for t in seconds)


def test_a_cpu_figure_names_the_processor_and_its_cores(tmp_path, monkeypatch):
  """On the CPU JAX's device_kind is only "cpu": a figure must say which processor and how
  many cores made it."""
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n")
  assert common.cpu_model(str(cpuinfo)) == "AMD EPYC 7B13"
  # A cloud VM's name that hides the model: the family, model and vector width say it.
  cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
                     "model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n\n"
                     "processor\t: 1\nmodel name\t: other\n")
  assert common.cpu_model(str(cpuinfo)) == "AMD EPYC (family 25 model 1, AVX2)"
  cpuinfo.write_text(cpuinfo.read_text().replace("avx2", "avx2 avx512f avx512bw"))
  assert common.cpu_model(str(cpuinfo)) == "AMD EPYC (family 25 model 1, AVX-512)"
  monkeypatch.setattr(records, "cpu_model", lambda: "AMD EPYC 7B13")
  monkeypatch.setattr(records.os, "sched_getaffinity", lambda pid: {0, 1})
  assert common.device_name() == f"cpu:AMD EPYC 7B13, 2 cores x{jax.device_count()}"
