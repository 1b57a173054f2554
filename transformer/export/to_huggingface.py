"""A trained model as a Hugging Face `MarianMTModel` folder, written from NumPy (no PyTorch).

Glossary: D d_model, H heads, K d_k, F d_ff, V vocabulary, L layers per stack.

Marian is the paper's post-LN Transformer: one embedding shared by the encoder, the decoder
and the output layer (`share_encoder_decoder_embeddings`, `tie_word_embeddings`), multiplied
by sqrt(D) (`scale_embedding`), sinusoidal positions, ReLU feed-forward, PAD (id 0) as the
decoder's start symbol. Where the layouts differ the map is exact:

- Positions. Marian's sinusoids put all D/2 sines before all D/2 cosines (same frequencies);
  the paper interleaves them. A permutation P of the D model coordinates (`marian_order`:
  0, 2, 4, …, 1, 3, 5, …) applied to every weight that reads or writes the model dimension
  (the embedding's columns, the inputs of the attention and first feed-forward projections,
  the outputs of the attention output and second feed-forward projections, LayerNorm scales
  and offsets, the second feed-forward bias) makes the same function: LayerNorm and the
  residual sums are indifferent to the order of coordinates, and P maps the project's
  position vectors onto Marian's.
- Biases. Marian's attention projections have biases; the paper's have none: zeros (a model
  with `model.attention_biases`, such as one imported from OPUS-MT, gives its own). The
  output layer's `final_logits_bias` is zeros (or `model.output_bias`), and so are the
  feed-forward and LayerNorm biases of a model without them (`model.biases=False`,
  configs/modern.py's `no_bias`).
- Activations. ReLU, GELU (exact) and Swish are Marian's `activation_function`s 'relu',
  'gelu' and 'swish'; the other departures of configs/modern.py are refused
  (`model_source.check_exportable`).

What cannot be mapped: Marian's LayerNorms are `torch.nn.LayerNorm` with ε = 1e-5 fixed; the
paper configs' ε is 1e-6 (`model.norm_epsilon`; docs/export.md gives the measured effect on
the logits). Marian's
generate() normalises beam scores by `|Y|^length_penalty`, not the GNMT penalty, and has a
fixed `max_length` rather than input length + 50; `generation_config.json` states beam 4 and
α = 0.6 in its terms.

The folder holds `config.json`, `generation_config.json`, `model.safetensors`, the
SentencePiece model as `source.spm` and `target.spm` (one shared vocabulary), `vocab.json`
(each piece to this project's id: `<pad>` 0, `</s>` 1, `<unk>` 2) and
`tokenizer_config.json`, for `MarianMTModel.from_pretrained` and `MarianTokenizer`.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import numpy as np

from transformer.export import model_source
from transformer.export.model_source import Source
from transformer.tokens import EOS_ID, PAD_ID


def marian_order(d_model: int) -> np.ndarray:
  """P: Marian's coordinate c holds the project's coordinate P[c] (sines, then cosines)."""
  return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def marian_config(source: Source) -> dict:
  """`config.json` of `MarianConfig` for `source`."""
  m = source.model
  return {
      "architectures": ["MarianMTModel"], "model_type": "marian",
      "vocab_size": m.vocab_size, "decoder_vocab_size": m.vocab_size, "d_model": m.d_model,
      "encoder_layers": m.num_layers, "decoder_layers": m.num_layers,
      "encoder_attention_heads": m.num_heads, "decoder_attention_heads": m.num_heads,
      # transformers' 'gelu' is the exact (erf) GELU and 'swish' x·σ(x), as the project's.
      "encoder_ffn_dim": m.d_ff, "decoder_ffn_dim": m.d_ff,
      "activation_function": {"relu": "relu", "gelu": "gelu", "swish": "swish"}[m.activation],
      "max_position_embeddings": max(1024, m.max_len), "scale_embedding": True,
      "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
      "dropout": m.dropout_rate, "attention_dropout": m.attention_dropout_rate,
      "activation_dropout": 0.0, "pad_token_id": PAD_ID, "eos_token_id": EOS_ID,
      "forced_eos_token_id": EOS_ID, "decoder_start_token_id": PAD_ID, "bos_token_id": None,
      "is_encoder_decoder": True, "use_cache": True, "torch_dtype": "float32",
  }


def generation_config(source: Source) -> dict:
  """`generation_config.json`: the workdir's beam size and α, in generate()'s terms (its
  length penalty is `|Y|^α`, not the GNMT penalty)."""
  d = source.config.decode
  # max_length counts the start symbol; at max_length - 1 only EOS may follow (forced), as in
  # the project's search at a sentence's limit. PAD is not forbidden: the project's search
  # does not forbid it either.
  return {"num_beams": int(d.beam_size), "length_penalty": float(d.length_penalty),
          "early_stopping": True, "max_length": int(source.model.max_len) + 1,
          "decoder_start_token_id": PAD_ID, "pad_token_id": PAD_ID, "eos_token_id": EOS_ID,
          "forced_eos_token_id": EOS_ID}


def marian_weights(source: Source) -> dict[str, np.ndarray]:
  """The safetensors tensors of `MarianMTModel`, `(out, in)` linear weights, permuted by P."""
  m, p = source.model, source.params
  order = marian_order(m.d_model)
  embedding = p["shared_embedding"]["embedding"][:, order]  # [V, D]
  # Stored once: the encoder's and decoder's embeddings and lm_head are tied to it.
  w = {"model.shared.weight": embedding,
       "final_logits_bias": _bias(p["decoder"], m.vocab_size, "output_bias")[None]}
  for i in range(m.num_layers):
    enc, dec = p["encoder"][f"layer_{i}"], p["decoder"][f"layer_{i}"]
    prefix = f"model.encoder.layers.{i}."
    w.update(_attention(prefix + "self_attn.", enc["self_attention"], order))
    w.update(_norm(prefix + "self_attn_layer_norm.", enc["attention_block"]["norm"], order))
    w.update(_ffn(prefix, enc["ffn"], order))
    w.update(_norm(prefix + "final_layer_norm.", enc["ffn_block"]["norm"], order))
    prefix = f"model.decoder.layers.{i}."
    w.update(_attention(prefix + "self_attn.", dec["self_attention"], order))
    w.update(_norm(prefix + "self_attn_layer_norm.", dec["self_attention_block"]["norm"],
                   order))
    w.update(_attention(prefix + "encoder_attn.", dec["cross_attention"], order))
    w.update(_norm(prefix + "encoder_attn_layer_norm.", dec["cross_attention_block"]["norm"],
                   order))
    w.update(_ffn(prefix, dec["ffn"], order))
    w.update(_norm(prefix + "final_layer_norm.", dec["ffn_block"]["norm"], order))
  return {k: np.ascontiguousarray(v, np.float32) for k, v in w.items()}


def _attention(prefix: str, attention: dict, order: np.ndarray) -> dict:
  out = {}
  for name, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
    weight = model_source.heads_to_linear(attention[name]["kernel"])  # [H * K, D]
    out[f"{prefix}{theirs}.weight"] = weight[:, order]
    out[f"{prefix}{theirs}.bias"] = _bias(attention[name], weight.shape[0]).reshape(-1)
  weight = model_source.linear_to_heads_out(attention["out"]["kernel"])  # [D, H * K]
  out[f"{prefix}out_proj.weight"] = weight[order, :]
  out[f"{prefix}out_proj.bias"] = _bias(attention["out"], weight.shape[0])[order]
  return out


def _bias(layer: dict, size: int, name: str = "bias") -> np.ndarray:
  """A layer's bias, or zeros for a model without it (`model.biases=False`, the paper's
  attention and output layer)."""
  return layer[name] if name in layer else np.zeros(size, np.float32)


def _ffn(prefix: str, ffn: dict, order: np.ndarray) -> dict:
  width, d_model = ffn["wi"]["kernel"].shape[1], ffn["wo"]["kernel"].shape[1]
  return {f"{prefix}fc1.weight": ffn["wi"]["kernel"].T[:, order],  # [F, D]
          f"{prefix}fc1.bias": _bias(ffn["wi"], width),
          f"{prefix}fc2.weight": ffn["wo"]["kernel"].T[order, :],  # [D, F]
          f"{prefix}fc2.bias": _bias(ffn["wo"], d_model)[order]}


def _norm(prefix: str, norm: dict, order: np.ndarray) -> dict:
  return {f"{prefix}weight": norm["scale"][order],
          f"{prefix}bias": _bias(norm, len(order))[order]}


def export(source: Source, output: str | os.PathLike, *, workdir: str = "") -> pathlib.Path:
  """Writes the Hugging Face Marian folder of `source` to `output` (a new or empty folder);
  nothing is written when the model cannot be expressed (a one-line `ConfigError`)."""
  from safetensors.numpy import save_file

  model_source.check_exportable(source.model, "huggingface")
  out = model_source.check_output(output)
  weights = marian_weights(source)
  vocab = {piece: i for i, piece in enumerate(source.pieces())}
  special = source.special_pieces()
  tokenizer_config = {
      "tokenizer_class": "MarianTokenizer", "source_lang": source.config.data.source_lang,
      "target_lang": source.config.data.target_lang, "unk_token": special["unk"],
      "eos_token": special["eos"], "pad_token": special["pad"],
      "model_max_length": int(source.model.max_len), "separate_vocabs": False}
  with model_source.written_whole(out) as tmp:
    save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name, content in (("config.json", marian_config(source)),
                          ("generation_config.json", generation_config(source)),
                          ("vocab.json", vocab), ("tokenizer_config.json", tokenizer_config),
                          ("export.json", {"format": "huggingface", "workdir": workdir,
                                           "checkpoint_steps": source.steps,
                                           "vocabulary_sha256": source.tokenizer.sha256})):
      (tmp / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n",
                              encoding="utf-8")
    for name, spm_path in zip(("source.spm", "target.spm"), source.tokenizer.spm_paths()):
      shutil.copyfile(spm_path, tmp / name)
  return out
