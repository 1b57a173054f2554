"""Decoding suite: beam-search and greedy speed of the cached decoder.

  python -m benchmarks --config=configs/base.py --suite=decoding

A randomly initialised model from the config translates random source sentences. An untrained
model stops at random lengths, so EOS is disallowed (its logit lowered by 1e4) until each
sentence's limit forces it: every run decodes exactly the stated number of tokens.
Figures, all from the same run and model:
- beam 4 (config.decode.beam_size) at several batch sizes: sentences/s and ms per step;
- time per output token at several output lengths, with one cache size for all: a cached
  step does the same matrix products at every length (no recomputation of the prefix), and
  only its attention grows, reading the positions written so far;
- greedy against beam 4 at one batch size, sentences/s side by side, each with the CPU
  workarounds on and off (`config.cpu_workarounds`: `backend_ops.CPU` against
  `backend_ops.LIBRARY`, transformer/decoding/backend_ops.py): the four take turns
  (`--decoding_compare_rounds`), and each figure is the median of its turns; beside them
  the decoder's matrix products alone on greedy's rows and on beam's, which bound the
  beam/greedy ratio.
The batch-size and output-length figures use `config.cpu_workarounds` ('auto': on on a CPU).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from flax import traverse_util

from transformer.model import transformer as model_lib
from transformer.decoding import backend_ops
from transformer.decoding import decode
from transformer.decoding import translate
from benchmarks import common
from transformer.tokens import EOS_ID

_BATCHES = flags.DEFINE_list("decoding_batch_sizes", ["1", "32", "128"],
                             "Batch sizes (sentences) for the beam-search figures.")
_LENGTHS = flags.DEFINE_list("decoding_output_lengths", ["20", "80", "200"],
                             "Output lengths (tokens, EOS included) for the per-token figures.")
_SOURCE_LEN = flags.DEFINE_integer("decoding_source_length", 32,
                                   "Source tokens per sentence (EOS included).")
_OUTPUT_LEN = flags.DEFINE_integer("decoding_output_length", 32,
                                   "Output tokens per sentence for the batch-size figures.")
_COMPARE_BATCH = flags.DEFINE_integer("decoding_compare_batch", 32,
                                      "Batch size of the greedy vs beam comparison.")
_LENGTH_BATCH = flags.DEFINE_integer("decoding_length_batch", 8,
                                     "Batch size of the per-output-length figures.")
_ROUNDS = flags.DEFINE_integer("decoding_compare_rounds", 5,
                               "Turns greedy and beam each take in their comparison.")
_FLAX_WMT = flags.DEFINE_string(
    "flax_wmt_dir", "", "examples/wmt of a google/flax checkout: also time its beam search at "
    "the comparison's shape, taking turns with the project's (benchmarks/flax_peer.py).")


def _search_to_the_limit(model, params, inputs, max_lengths, *, max_decode_len, beam_size,
                         alpha, ops):
  """`translate.search` with EOS held back (its logit lowered by 1e4), so that every
  sentence runs to its limit, where the search forces EOS."""
  tokens_to_logits, cache, reorder = translate.decoding_setup(model, params, inputs,
                                                              max_decode_len, beam_size, ops=ops)

  def no_early_eos(ids, cache):
    logits, cache = tokens_to_logits(ids, cache)
    return logits.at[:, EOS_ID].add(-1e4), cache

  if beam_size == 1:
    return decode.greedy_search(no_early_eos, cache, max_lengths, max_decode_len, ops=ops)
  ids, _ = decode.beam_search(no_early_eos, cache, max_lengths, max_decode_len,
                              beam_size=beam_size, alpha=alpha, reorder_cache=reorder, ops=ops)
  return ids


@functools.lru_cache(maxsize=None)
def _decoder(model, beam_size: int, alpha: float, max_decode_len: int,
             ops: backend_ops.DecodingOps):
  """Jitted `(params, inputs [B, S], max_lengths [B]) -> ids` that never stops before the
  limit."""
  return jax.jit(functools.partial(_search_to_the_limit, model, max_decode_len=max_decode_len,
                                   beam_size=beam_size, alpha=alpha, ops=ops))


def _source(vocab_size: int, batch: int, source_len: int) -> np.ndarray:
  """Random source sentences `[batch, source_len]` ending in EOS, the same for a batch size."""
  rng = np.random.default_rng(batch)
  inputs = rng.integers(3, vocab_size, (batch, source_len), dtype=np.int32)
  inputs[:, -1] = EOS_ID
  return inputs


def _prepare(model, params, vocab_size, *, batch, source_len, output_len, max_decode_len,
             beam_size, alpha, cpu_workarounds: bool) -> tuple[Callable[[], None], dict]:
  """A compiled, checked decoding call and the figures that describe it (no timings yet)."""
  inputs = jnp.asarray(_source(vocab_size, batch, source_len))
  max_lengths = jnp.full((batch,), output_len, jnp.int32)
  ops = backend_ops.CPU if cpu_workarounds else backend_ops.LIBRARY
  run = _decoder(model, beam_size, alpha, max_decode_len, ops)
  ids = np.asarray(run(params, inputs, max_lengths))  # compiles
  produced = (ids == EOS_ID).argmax(axis=1) + 1
  if not np.all(produced == output_len):
    raise RuntimeError(f"decoded lengths {sorted(set(produced.tolist()))}, expected {output_len}")
  call = lambda: run(params, inputs, max_lengths).block_until_ready()
  return call, {"batch_size": batch, "beam_size": beam_size, "source_length": source_len,
                "output_length": output_len, "cache_length": max_decode_len,
                "cpu_workarounds": cpu_workarounds}


def _figures(info: dict, seconds: float) -> dict:
  batch, output_len = info["batch_size"], info["output_length"]
  return {**info, "seconds": seconds, "sentences_per_sec": batch / seconds,
          "ms_per_step": seconds / output_len * 1e3, "ms_per_token": seconds / output_len * 1e3,
          "us_per_sentence_token": seconds / (batch * output_len) * 1e6}


def _measure(model, params, vocab_size, **kwargs) -> dict:
  call, info = _prepare(model, params, vocab_size, **kwargs)
  return _figures(info, common.time_fn(call, warmup=0, min_runs=3, min_seconds=3.0))


def step_kernels(params) -> list[jax.Array]:
  """The weights one decoding step multiplies by, as 2-D `[in, out]` matrices.

  Every decoder layer's self-attention Q/K/V/output, cross-attention Q/output and
  feed-forward kernels, then the output projection. Cross-attention keys/values are
  projected once per sentence, not per step.
  """
  flat = traverse_util.flatten_dict(params["decoder"], sep="/")
  once_per_sentence = ("cross_attention/key/", "cross_attention/value/")
  # Head projections [D, H, K] -> [D, H * K]; head merges [H, V_, D] -> [H * V_, D].
  kernels = [k.reshape(-1, k.shape[-1]) if "/out/" in p else k.reshape(k.shape[0], -1)
             for p, k in flat.items() if p.endswith("kernel")
             and not any(s in p for s in once_per_sentence)]
  if "output_projection" in params:  # untied (model.tie_embeddings='none')
    return kernels + [params["output_projection"]["kernel"]]
  tied = params["target_embedding" if "target_embedding" in params else "shared_embedding"]
  return kernels + [tied["embedding"].T]


_PRODUCT_STEPS = 16  # decoding steps per call of `_products_only`


def _products_only(params, rows: int) -> Callable[[], None]:
  """A call doing `_PRODUCT_STEPS` decoding steps' matrix products alone on `rows` rows.

  Each step multiplies by every kernel of `step_kernels`, each product depending on the one
  before, as in the model; nothing else (no attention, no search). The time on greedy's rows
  against beam's bounds what their ratio could be on this device.
  """
  kernels = step_kernels(params)
  inputs = {w.shape[0]: jax.random.normal(jax.random.key(w.shape[0]), (rows, w.shape[0]))
            for w in kernels}

  @jax.jit
  def run(kernels, inputs):
    def step(_, carry):
      for w in kernels:
        carry = carry + jnp.sum((inputs[w.shape[0]] + carry) @ w) * 1e-30
      return carry
    return jax.lax.fori_loop(0, _PRODUCT_STEPS, step, jnp.zeros((), jnp.float32))

  run(kernels, inputs).block_until_ready()  # compiles
  return lambda: run(kernels, inputs).block_until_ready()


def run(config, workdir: str) -> dict:
  """Measures decoding speed for `config`'s model; prints a table and returns the figures."""
  del workdir
  model = model_lib.build_model(config)
  params = model_lib.init_params(model, jax.random.key(config.seed))
  beam, alpha = int(config.decode.beam_size), float(config.decode.length_penalty)
  vocab = config.model.vocab_size
  source_len, output_len = _SOURCE_LEN.value, _OUTPUT_LEN.value
  cache_len = min(source_len + config.decode.max_extra_len, config.model.max_len)
  if output_len > cache_len:
    raise ValueError(f"--decoding_output_length={output_len} exceeds the cache "
                     f"({cache_len} = source length + config.decode.max_extra_len)")
  setting = backend_ops.for_setting(config.cpu_workarounds) is backend_ops.CPU
  common_args = dict(source_len=source_len, alpha=alpha)

  by_batch = [_measure(model, params, vocab, batch=int(b), output_len=output_len,
                       max_decode_len=cache_len, beam_size=beam, cpu_workarounds=setting,
                       **common_args)
              for b in _BATCHES.value]

  lengths = [int(n) for n in _LENGTHS.value]
  long_cache = min(max(lengths), config.model.max_len)
  by_length = [_measure(model, params, vocab, batch=_LENGTH_BATCH.value, output_len=n,
                        max_decode_len=long_cache, beam_size=beam, cpu_workarounds=setting,
                        **common_args)
               for n in lengths]

  # Greedy and beam, each with the CPU workarounds on and off, taking turns.
  compare = _COMPARE_BATCH.value
  variants = [(b, on) for b in (1, beam) for on in (True, False)]
  prepared = [_prepare(model, params, vocab, batch=compare, output_len=output_len,
                       max_decode_len=cache_len, beam_size=b, cpu_workarounds=on,
                       **common_args) for b, on in variants]
  seconds = common.alternate([call for call, _ in prepared], _ROUNDS.value, 0.0,
                             warmup=0, min_runs=_ROUNDS.value)
  figures = {v: _figures(info, t) for v, (_, info), t in zip(variants, prepared, seconds)}
  products = common.alternate([_products_only(params, compare * b) for b in (1, beam)],
                              _ROUNDS.value, 0.0, warmup=0, min_runs=_ROUNDS.value)
  products_ms = [t / _PRODUCT_STEPS * 1e3 for t in products]
  speed = {v: f["sentences_per_sec"] for v, f in figures.items()}

  peer = None
  if _FLAX_WMT.value:  # the project's beam search against Flax's, taking turns
    from benchmarks import flax_peer

    ours = prepared[variants.index((beam, setting))][0]
    flax_call = flax_peer.beam_call(config, _FLAX_WMT.value,
                                    _source(vocab, compare, source_len), output_len)
    t_ours, t_flax = common.alternate([ours, flax_call], _ROUNDS.value, 0.0, warmup=0,
                                      min_runs=_ROUNDS.value)
    peer = {"batch_size": compare, "beam_size": beam, "output_length": output_len,
            "project_sentences_per_sec": compare / t_ours,
            "flax_sentences_per_sec": compare / t_flax, "project_over_flax": t_flax / t_ours}

  print(f"device  {common.device_name()}")
  print(f"model   {model_lib.count_params(params) / 1e6:.1f}M parameters, "
        f"vocabulary {vocab}, {config.dtype}; random init, EOS held back to the limit")
  print(f"\nbeam {beam}, {source_len} source -> {output_len} output tokens, cache {cache_len}")
  print(f"{'batch':>6} {'sentences/s':>12} {'ms/step':>9}")
  for f in by_batch:
    print(f"{f['batch_size']:>6} {f['sentences_per_sec']:>12.2f} {f['ms_per_step']:>9.2f}")
  print(f"\nbeam {beam}, batch {_LENGTH_BATCH.value}, cache {long_cache}: time per output token")
  print(f"{'length':>6} {'ms/token':>9} {'total s':>8}")
  for f in by_length:
    print(f"{f['output_length']:>6} {f['ms_per_token']:>9.2f} {f['seconds']:>8.2f}")
  print(f"\nbatch {compare}, {output_len} output tokens, sentences/s "
        f"(median of {_ROUNDS.value} turns):")
  print(f"{'CPU workarounds':>16} {'on':>8} {'off':>8} {'on/off':>7}")
  for b, name in ((1, "greedy"), (beam, f"beam {beam}")):
    print(f"{name:>16} {speed[b, True]:>8.2f} {speed[b, False]:>8.2f} "
          f"{speed[b, True] / speed[b, False]:>7.2f}")
  ratios = {on: speed[beam, on] / speed[1, on] for on in (True, False)}
  print(f"{'beam/greedy':>16} {ratios[True]:>8.2f} {ratios[False]:>8.2f}")
  print(f"the decoder's matrix products alone: {products_ms[0]:.1f} ms per step on "
        f"{compare} rows, {products_ms[1]:.1f} ms on {compare * beam} "
        f"({products_ms[1] / products_ms[0]:.2f}x)")
  if peer:
    print(f"\nagainst Flax examples/wmt, beam {beam}, batch {compare}, {output_len} output "
          f"tokens: project {peer['project_sentences_per_sec']:.2f}, Flax "
          f"{peer['flax_sentences_per_sec']:.2f} sentences/s ({peer['project_over_flax']:.2f}x)")
  return {"flax_examples_wmt": peer, "beam_by_batch": by_batch, "beam_by_output_length": by_length,
          "greedy_vs_beam": {"batch_size": compare, "cpu_workarounds": setting,
                             "greedy": figures[1, setting], "beam": figures[beam, setting],
                             "beam_over_greedy": ratios[setting],
                             "products_only_ms_per_step": {"greedy_rows": products_ms[0],
                                                           "beam_rows": products_ms[1]}},
          "cpu_workarounds_on_vs_off": [figures[v] for v in variants]}
