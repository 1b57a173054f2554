"""A trained model as a CTranslate2 model folder, built from NumPy through CTranslate2's spec API.

Glossary: D d_model, H heads, K d_k, F d_ff, V vocabulary, L layers per stack.

The paper's model is CTranslate2's `TransformerSpec` as it is, with no permutation and no
departure: post-LN layers (`pre_norm=False`; pre-LN with final LayerNorms for
`model.norm='pre'`), ReLU feed-forward with its biases, attention projections without biases
(CTranslate2's are optional), one embedding matrix for the source, the target and the output
projection, multiplied by sqrt(D), the norms' ε (`layer_norm_epsilon`). The position
encodings are given as a table, the project's own interleaved sinusoids (or the learned
table), so CTranslate2's built-in sines-then-cosines are not used.

The departures of configs/modern.py map to the spec's own options (`_stack_options`):
`rms_norm`, the activations (GELU is CTranslate2's erf form, Swish its x·σ(x)), `ffn_glu`
for the gated networks, the position scheme's own (`position_schemes`: `rotary_dim=0` with
`rotary_interleave` for RoPE, the encoder's position table then zero;
`relative_attention_bias` for T5's buckets, each layer given its stack's table;
`relative_position` for Shaw et al.'s keys and values), `num_heads_kv` for
multi-query and grouped-query attention, separate source, target and output matrices, and
absent biases (LayerNorm's β zero). ALiBi (CTranslate2's encoder has none) and QK-norm (its
RMS form's scores varied from run to run; it has no L2 form with a learned scale) are
refused (`model_source.check_exportable`). The decoder starts from
`<pad>` (id 0, `decoder_start_token`) and CTranslate2 appends `</s>` to each source
(`add_source_eos`), as this project does.

Beside CTranslate2's `model.bin`, `config.json` and `shared_vocabulary.json`, the folder holds
`export.json`: where the weights came from and the decoding defaults, stated in CTranslate2's
terms (`ctranslate2_search` applies them exactly as the project does).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import numpy as np

from transformer.errors import ConfigError
from transformer.export import model_source
from transformer.export.model_source import Source
from transformer.model import config as model_config
from transformer.model import position_schemes

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
                 "bfloat16", "float32")
# Sinusoidal models read positions up to this many (CTranslate2 takes a table of fixed size);
# inputs are truncated at CTranslate2's `max_input_length`, 1024 by default.
SINUSOID_ROWS = 1024 + 512


def _stack_options(m) -> dict:
  """The options of CTranslate2's encoder and decoder specs that express `config.model` m."""
  from ctranslate2.specs import common_spec

  activation = {"relu": common_spec.Activation.RELU, "reglu": common_spec.Activation.RELU,
                "gelu": common_spec.Activation.GELU, "geglu": common_spec.Activation.GELU,
                "swish": common_spec.Activation.SWISH, "swiglu": common_spec.Activation.SWISH}
  return dict(
      pre_norm=m.norm == "pre", activation=activation[m.activation],
      ffn_glu=m.activation in model_config.GATED, rms_norm=m.norm_type == "rmsnorm",
      num_heads_kv=m.num_kv_heads if m.num_kv_heads not in (0, m.num_heads) else None,
      **position_schemes.get(m.positional).ctranslate2_options())


def _embeddings(m, p: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """`(source, target, output)` matrices, each `[V, D]`, as `tie_embeddings` shares them."""
  match m.tie_embeddings:
    case "three_way":
      shared = p["shared_embedding"]["embedding"]
      return shared, shared, shared
    case "two_way":
      target = p["target_embedding"]["embedding"]
      return p["source_embedding"]["embedding"], target, target
    case "none":
      return (p["source_embedding"]["embedding"], p["target_embedding"]["embedding"],
              np.ascontiguousarray(p["output_projection"]["kernel"].T))
  raise ConfigError(f"config.model.tie_embeddings={m.tie_embeddings!r} has no export")


def build_spec(source: Source):
  """The `ctranslate2.specs.TransformerSpec` of `source`, weights set, vocabulary registered."""
  m = source.model
  model_source.check_exportable(m, "ctranslate2")  # refused even without the package
  from ctranslate2.specs import transformer_spec

  options = _stack_options(m)
  encoder = transformer_spec.TransformerEncoderSpec(m.num_layers, m.num_heads, **options)
  decoder = transformer_spec.TransformerDecoderSpec(m.num_layers, m.num_heads, **options)
  spec = transformer_spec.TransformerSpec(encoder, decoder)
  p = model_source.copied_params(source)  # optimize() quantizes the arrays in place
  source_embedding, target_embedding, output = _embeddings(m, p)  # [V, D] each
  rows = max(SINUSOID_ROWS, m.max_len)  # a learned table keeps its own, max_len

  encoder.embeddings[0].weight = source_embedding
  encoder.scale_embeddings = True  # × sqrt(D) (§3.4)
  for i, layer_spec in enumerate(encoder.layer):
    layer = p["encoder"][f"layer_{i}"]
    _self_attention(layer_spec.self_attention, layer["self_attention"],
                    layer["attention_block"]["norm"], p["encoder"], m)
    _ffn(layer_spec.ffn, layer["ffn"], layer["ffn_block"]["norm"])

  decoder.embeddings.weight = target_embedding
  decoder.scale_embeddings = True
  decoder.projection.weight = output  # the pre-softmax projection (§3.4: tied); no bias
  for i, layer_spec in enumerate(decoder.layer):
    layer = p["decoder"][f"layer_{i}"]
    _self_attention(layer_spec.self_attention, layer["self_attention"],
                    layer["self_attention_block"]["norm"], p["decoder"], m)
    _cross_attention(layer_spec.attention, layer["cross_attention"],
                     layer["cross_attention_block"]["norm"])
    _ffn(layer_spec.ffn, layer["ffn"], layer["ffn_block"]["norm"])

  for stack, side in ((encoder, "encoder"), (decoder, "decoder")):
    # CTranslate2 keeps an encoder position table for RoPE; the model adds nothing there.
    if hasattr(stack, "position_encodings"):
      stack.position_encodings.encodings = model_source.position_table(m, p, side, rows)
    if m.norm == "pre":
      _norm(stack.layer_norm, p[side]["final_norm"])

  pieces = source.pieces()
  spec.register_source_vocabulary(pieces)
  spec.register_target_vocabulary(pieces)
  special = source.special_pieces()
  spec.config.unk_token = special["unk"]
  spec.config.eos_token = special["eos"]
  spec.config.bos_token = special["pad"]  # no BOS in this vocabulary; never added
  spec.config.decoder_start_token = special["pad"]  # targets are shifted right with PAD
  spec.config.add_source_bos = False
  spec.config.add_source_eos = True
  spec.config.layer_norm_epsilon = m.norm_epsilon  # every LayerNorm / RMSNorm, model/layers.py
  return spec


def _norm(spec, norm: dict) -> None:
  spec.gamma = norm["scale"]
  if hasattr(spec, "beta"):  # LayerNorm; RMSNorm has none
    spec.beta = norm["bias"] if "bias" in norm else np.zeros_like(norm["scale"])


def _self_attention(spec, attention: dict, norm: dict, stack: dict, m) -> None:
  # linear[0]: queries, keys and values fused, [(H + 2 G) * K, D]; linear[1]: the output.
  spec.linear[0].weight = np.concatenate(
      [model_source.heads_to_linear(attention[name]["kernel"])
       for name in ("query", "key", "value")])
  spec.linear[1].weight = model_source.linear_to_heads_out(attention["out"]["kernel"])
  _norm(spec.layer_norm, norm)
  position_schemes.get(m.positional).ctranslate2_self_attention(spec, attention, stack)


def _cross_attention(spec, attention: dict, norm: dict) -> None:
  # linear[0]: queries; linear[1]: keys and values fused, [2 * G * K, D]; linear[2]: output.
  spec.linear[0].weight = model_source.heads_to_linear(attention["query"]["kernel"])
  spec.linear[1].weight = np.concatenate(
      [model_source.heads_to_linear(attention[name]["kernel"]) for name in ("key", "value")])
  spec.linear[2].weight = model_source.linear_to_heads_out(attention["out"]["kernel"])
  _norm(spec.layer_norm, norm)


def _ffn(spec, ffn: dict, norm: dict) -> None:
  # linear_0: the activated input projection [F, D]; linear_0_noact: a gated network's linear
  # one; linear_1: the output [D, F].
  for spec_linear, name in ((spec.linear_0, "wi"), (spec.linear_1, "wo"),
                            (getattr(spec, "linear_0_noact", None), "wi_linear")):
    if spec_linear is None:
      continue
    spec_linear.weight = np.ascontiguousarray(ffn[name]["kernel"].T)
    if "bias" in ffn[name]:
      spec_linear.bias = ffn[name]["bias"]
  _norm(spec.layer_norm, norm)


def decoding_defaults(config) -> dict:
  """The workdir's decoding settings (`config.decode`), for `export.json`: the project's
  rule and the nearest CTranslate2 `translate_batch` options."""
  d = config.decode
  return {
      "beam_size": int(d.beam_size),
      "length_penalty_alpha": float(d.length_penalty),
      "length_penalty_formula": "((5 + |Y|) / 6) ** alpha, |Y| counting EOS (GNMT)",
      "max_extra_len": int(d.max_extra_len),
      "ctranslate2_options": {
          "beam_size": int(d.beam_size), "length_penalty": float(d.length_penalty),
          "min_decoding_length": 0, "max_decoding_length": "longest source + EOS + "
          f"{int(d.max_extra_len)}",
          "note": "CTranslate2 divides by |Y| ** length_penalty, |Y| without EOS; "
                  "transformer.export.ctranslate2_search reranks its finished hypotheses by "
                  "the project's GNMT penalty for the project's exact translations"},
  }


def export(source: Source, output: str | os.PathLike, quantization: str | None = None,
           *, workdir: str = "") -> pathlib.Path:
  """Writes the CTranslate2 model folder of `source` to `output` (a new or empty folder).

  Args:
    source: from `model_source.load`.
    output: the folder to write.
    quantization: CTranslate2's weight type (`QUANTIZATIONS`), or None for float32.
    workdir: recorded in `export.json`.

  Returns:
    The folder written. Nothing is written when the model or the options cannot be exported
    (a one-line `ConfigError`).
  """
  if quantization is not None and quantization not in QUANTIZATIONS:
    raise ConfigError(f"--quantization={quantization!r} is not one of "
                      f"{', '.join(QUANTIZATIONS)}")
  model_source.check_exportable(source.model, "ctranslate2")
  out = model_source.check_output(output)
  spec = build_spec(source)
  spec.validate()
  spec.optimize(quantization=quantization)
  with model_source.written_whole(out) as tmp:
    spec.save(str(tmp))
    record = {"format": "ctranslate2", "workdir": workdir, "checkpoint_steps": source.steps,
              "quantization": quantization or "float32",
              "vocabulary_sha256": source.tokenizer.sha256,
              "decoding": decoding_defaults(source.config)}
    (tmp / "export.json").write_text(json.dumps(record, indent=2) + "\n")
    shutil.copyfile(source.tokenizer.path, tmp / "sentencepiece.model")
  return out
