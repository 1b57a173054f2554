"""Flax's `examples/wmt` beam search at the project's shape, for the decoding suite's
side-by-side row (`--flax_wmt_dir`).

The peer's code is read from a checkout of google/flax, never copied here:

  git clone https://github.com/google/flax && \\
  python -m benchmarks --config=configs/base.py --suite=decoding \\
      --flax_wmt_dir=flax/examples/wmt

Its `models.Transformer` is built with the project's sizes (d_model, heads, d_ff, layers,
vocabulary, tied embeddings, dtype), randomly initialised, and decoded the way its
`train.predict_step` does (encode, expand to the beam, `decode.beam_search`), with EOS held
back as the suite holds back the project's own: both decode exactly the same number of tokens
for every sentence. Its cache is as long as the output (the project's is source length +
`config.decode.max_extra_len`, as when it translates).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from transformer.tokens import EOS_ID


def _load(flax_wmt_dir: str, name: str):
  """Imports `name`.py of the peer's folder as a module of its own name."""
  path = os.path.join(flax_wmt_dir, f"{name}.py")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"--flax_wmt_dir={flax_wmt_dir} holds no {name}.py; point it at "
                            "examples/wmt of a google/flax checkout")
  spec = importlib.util.spec_from_file_location(f"flax_wmt_{name}", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module


def beam_call(config, flax_wmt_dir: str, inputs: np.ndarray, output_len: int
              ) -> Callable[[], None]:
  """A compiled call decoding `inputs` ([B, S], ending in EOS) to `output_len` tokens with the
  peer's beam search (config.decode.beam_size, its length penalty)."""
  models, decode = _load(flax_wmt_dir, "models"), _load(flax_wmt_dir, "decode")
  m = config.model
  if m.d_k * m.num_heads != m.d_model or m.d_v != m.d_k:
    raise ValueError("the Flax example's attention has d_k = d_v = d_model / heads")
  shared = dict(vocab_size=m.vocab_size, output_vocab_size=m.vocab_size,
                share_embeddings=True, logits_via_embedding=True,
                dtype=jnp.dtype(config.dtype), emb_dim=m.d_model, num_heads=m.num_heads,
                num_layers=m.num_layers, qkv_dim=m.d_model, mlp_dim=m.d_ff,
                max_len=m.max_len, dropout_rate=0.0, attention_dropout_rate=0.0,
                deterministic=True)
  train_cfg = models.TransformerConfig(**shared)
  max_decode_len = output_len + 1  # its loop stops at index max_decode_len - 1
  decode_cfg = models.TransformerConfig(**{**shared, "decode": True})
  beam, alpha = int(config.decode.beam_size), float(config.decode.length_penalty)
  inputs = jnp.asarray(inputs)
  params = jax.jit(models.Transformer(train_cfg).init)(
      jax.random.key(0), inputs, inputs[:, :max_decode_len])["params"]

  @jax.jit
  def run(params, inputs):
    # As its `train.initialize_cache`: one row per sentence; the search expands it to beams.
    cache = models.Transformer(decode_cfg).init(
        jax.random.key(0), jnp.ones(inputs.shape, jnp.int32),
        jnp.ones((inputs.shape[0], max_decode_len), jnp.int32))["cache"]
    encoded = decode.flat_batch_beam_expand(
        models.Transformer(decode_cfg).apply({"params": params}, inputs,
                                            method=models.Transformer.encode), beam)
    raw_inputs = decode.flat_batch_beam_expand(inputs, beam)

    def tokens_ids_to_logits(flat_ids, flat_cache):
      logits, new_vars = models.Transformer(decode_cfg).apply(
          {"params": params, "cache": flat_cache}, encoded, raw_inputs, flat_ids,
          mutable=["cache"], method=models.Transformer.decode)
      logits = logits.squeeze(axis=1).at[:, EOS_ID].add(-1e4)  # held back, as ours
      return logits, new_vars["cache"]

    seqs, _ = decode.beam_search(inputs, cache, tokens_ids_to_logits, beam_size=beam,
                                 alpha=alpha, eos_id=EOS_ID, max_decode_len=max_decode_len)
    return seqs[:, -1, 1:]

  out = np.asarray(run(params, inputs))  # compiles
  if out.shape[1] != output_len or np.any(out == EOS_ID):
    raise RuntimeError(f"the Flax search returned {out.shape} with EOS inside; expected "
                       f"{output_len} tokens")
  return lambda: run(params, inputs).block_until_ready()
