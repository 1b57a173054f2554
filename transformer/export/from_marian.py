"""A Hugging Face Marian folder (any OPUS-MT model) as a project workdir.

  python -m transformer.export.from_marian --config=configs/base.py --model=opus-mt-en-de \
      --workdir=runs/opus-en-de

`--model` is a local folder as `MarianMTModel.save_pretrained` (or a download of
`Helsinki-NLP/opus-mt-*`) leaves it: `config.json`, `model.safetensors` (or
`pytorch_model.bin`, read with PyTorch), `vocab.json`, `source.spm`, `target.spm` and
`tokenizer_config.json`. The workdir written holds `--config` (its data, decoding and training
settings: what evaluation and fine-tuning use) with `config.model` inferred from the folder,
the vocabulary (`transformer.data.marian_vocabulary`) and the parameters as checkpoint 0, a
parameter snapshot: `evaluate.py`, the exports and `config.init_from` (fine-tuning) read it
as a trained workdir's.

The map is `to_huggingface`'s, inverted: the same permutation of the model coordinates
(Marian's sinusoids put sines before cosines), `(out, in)` weights transposed to the
project's kernels, and the vocabulary renumbered so that `<pad>`, `</s>` and `<unk>` take
this project's ids 0, 1, 2 (OPUS-MT numbers `</s>` 0 and `<pad>` last); the embedding rows and
`final_logits_bias` follow the pieces. What Marian has beyond the paper is switched on:
`attention_biases`, `output_bias` and `norm_epsilon=1e-5`; its activation (OPUS-MT's is
Swish) is `model.activation`. What the project cannot express — encoder and decoder of
different depth or width, separate source and target vocabularies, an output layer apart from
the embedding, unscaled embeddings, a start symbol other than `<pad>` — is refused in one
line before anything is written.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import numpy as np

from transformer.errors import ConfigError
from transformer.export import model_source
from transformer.export.to_huggingface import marian_order

# transformers' activation names -> config.model.activation ('silu' is 'swish' under another
# name; both are x·σ(x)).
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
_SPECIAL = ("pad", "eos", "unk")


def _read_json(folder: pathlib.Path, name: str) -> Any:
  try:
    return json.loads((folder / name).read_text(encoding="utf-8"))
  except FileNotFoundError:
    raise ConfigError(f"--model={folder} has no {name}: give a Marian folder as "
                      "MarianMTModel.save_pretrained writes it") from None
  except ValueError as e:
    raise ConfigError(f"{folder / name}: not JSON ({e})") from None


def read_weights(folder: pathlib.Path) -> dict[str, np.ndarray]:
  """The folder's tensors as float32 NumPy arrays: `model.safetensors`, or
  `pytorch_model.bin` through PyTorch."""
  if (folder / "model.safetensors").exists():
    from safetensors.numpy import load_file

    return {k: np.asarray(v, np.float32) for k, v in
            load_file(str(folder / "model.safetensors")).items()}
  if not (folder / "pytorch_model.bin").exists():
    raise ConfigError(f"--model={folder} has neither model.safetensors nor pytorch_model.bin")
  try:
    import torch
  except ImportError:
    raise ConfigError(f"{folder / 'pytorch_model.bin'} is read with PyTorch, which is not "
                      "installed: pip install torch, or give a folder with model.safetensors"
                      ) from None
  state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
  return {k: v.float().numpy() for k, v in state.items()}


def _same(hf: dict, a: str, b: str, what: str) -> int:
  if hf.get(a) != hf.get(b):
    raise ConfigError(f"config.json has {a}={hf.get(a)} but {b}={hf.get(b)}: this project's "
                      f"encoder and decoder have the same {what}; this model cannot be imported")
  return int(hf[a])


def model_overrides(hf: dict, vocab_size: int, max_length: int | None = None) -> dict:
  """`config.model` of the Marian config `hf` (a config.json's content) and its
  generation_config's `max_length` (the start symbol counted; `max_len` is one less, as
  `to_huggingface` writes it); raises a one-line `ConfigError` for what the project cannot
  express."""
  if hf.get("model_type") != "marian":
    raise ConfigError(f"config.json has model_type={hf.get('model_type')!r}; only 'marian' "
                      "(MarianMTModel, OPUS-MT) is imported")
  for key, needed, says in (
      ("share_encoder_decoder_embeddings", True, "separate source and target vocabularies"),
      ("tie_word_embeddings", True, "an output layer apart from the embedding"),
      ("scale_embedding", True, "embeddings not multiplied by sqrt(d_model)")):
    if hf.get(key, True) != needed:
      raise ConfigError(f"config.json has {key}={hf.get(key)}: {says}, which this project's "
                        "Marian import does not express")
  if hf.get("decoder_start_token_id") != hf.get("pad_token_id"):
    raise ConfigError(f"config.json has decoder_start_token_id="
                      f"{hf.get('decoder_start_token_id')} but pad_token_id="
                      f"{hf.get('pad_token_id')}: this project's decoder starts from <pad>")
  activation = _ACTIVATIONS.get(hf.get("activation_function"))
  if activation is None:
    raise ConfigError(f"config.json has activation_function={hf.get('activation_function')!r}; "
                      f"the import takes {', '.join(map(repr, _ACTIVATIONS))}")
  d_model = int(hf["d_model"])
  heads = _same(hf, "encoder_attention_heads", "decoder_attention_heads", "number of heads")
  if d_model % heads:
    raise ConfigError(f"config.json has d_model={d_model} not divisible by {heads} heads")
  return dict(
      vocab_size=vocab_size, d_model=d_model, num_heads=heads, d_k=d_model // heads,
      d_v=d_model // heads, d_ff=_same(hf, "encoder_ffn_dim", "decoder_ffn_dim", "d_ff"),
      num_layers=_same(hf, "encoder_layers", "decoder_layers", "number of layers"),
      activation=activation,
      max_len=max_length - 1 if max_length else int(hf.get("max_position_embeddings", 512)),
      dropout_rate=float(hf.get("dropout", 0.1)),
      attention_dropout_rate=float(hf.get("attention_dropout", 0.0)),
      attention_biases=True, output_bias=True, norm_epsilon=1e-5)


def vocabulary(folder: pathlib.Path, hf: dict, tokenizer_config: dict
               ) -> tuple[list[str], np.ndarray]:
  """`(pieces, rows)`: the joint vocabulary in this project's id order, and for each of its
  ids the Marian id (the embedding row) it was."""
  vocab = _read_json(folder, "vocab.json")
  size = int(hf.get("vocab_size", len(vocab)))
  if tokenizer_config.get("separate_vocabs") or int(hf.get("decoder_vocab_size") or size) != size:
    raise ConfigError(f"{folder} has separate source and target vocabularies; this project's "
                      "model has one")
  by_id = {i: piece for piece, i in vocab.items()}
  if sorted(by_id) != list(range(size)):
    raise ConfigError(f"{folder / 'vocab.json'} does not number its pieces 0..{size - 1} "
                      f"(config.json's vocab_size={size})")
  names = {"pad": tokenizer_config.get("pad_token", "<pad>"),
           "eos": tokenizer_config.get("eos_token", "</s>"),
           "unk": tokenizer_config.get("unk_token", "<unk>")}
  missing = [piece for piece in names.values() if piece not in vocab]
  if missing:
    raise ConfigError(f"{folder / 'vocab.json'} lacks {missing[0]!r}")
  special = [vocab[names[name]] for name in _SPECIAL]
  rows = special + [i for i in range(size) if i not in special]
  return [by_id[i] for i in rows], np.asarray(rows)


def params_from(weights: dict[str, np.ndarray], m: dict, rows: np.ndarray) -> dict:
  """The project's parameter tree from Marian's tensors (`to_huggingface.marian_weights`
  inverted): model coordinates un-permuted, embedding rows and logit biases renumbered."""
  inverse = np.argsort(marian_order(m["d_model"]))
  names = ("model.shared.weight", "model.encoder.embed_tokens.weight",
           "model.decoder.embed_tokens.weight", "lm_head.weight")
  embedding = next((weights[n] for n in names if n in weights), None)
  if embedding is None:
    raise ConfigError("the model's tensors hold no embedding (model.shared.weight)")
  bias = weights.get("final_logits_bias", np.zeros((1, len(rows)), np.float32))
  params = {"shared_embedding": {"embedding": embedding[rows][:, inverse]},
            "encoder": {}, "decoder": {"output_bias": bias[0][rows]}}
  for i in range(m["num_layers"]):
    get = lambda name, i=i: weights[f"model.encoder.layers.{i}.{name}"]
    params["encoder"][f"layer_{i}"] = {
        "self_attention": _attention(get, "self_attn.", m, inverse),
        "attention_block": {"norm": _norm(get, "self_attn_layer_norm.", inverse)},
        "ffn": _ffn(get, inverse),
        "ffn_block": {"norm": _norm(get, "final_layer_norm.", inverse)}}
    get = lambda name, i=i: weights[f"model.decoder.layers.{i}.{name}"]
    params["decoder"][f"layer_{i}"] = {
        "self_attention": _attention(get, "self_attn.", m, inverse),
        "self_attention_block": {"norm": _norm(get, "self_attn_layer_norm.", inverse)},
        "cross_attention": _attention(get, "encoder_attn.", m, inverse),
        "cross_attention_block": {"norm": _norm(get, "encoder_attn_layer_norm.", inverse)},
        "ffn": _ffn(get, inverse),
        "ffn_block": {"norm": _norm(get, "final_layer_norm.", inverse)}}
  return params


def _attention(get, prefix: str, m: dict, inverse: np.ndarray) -> dict:
  d, h = m["d_model"], m["num_heads"]
  out = {}
  for name, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
    weight = get(f"{prefix}{theirs}.weight")[:, inverse]  # [H * K, D]
    out[name] = {"kernel": weight.T.reshape(d, h, -1),
                 "bias": get(f"{prefix}{theirs}.bias").reshape(h, -1)}
  weight = get(f"{prefix}out_proj.weight")[inverse, :]  # [D, H * K]
  out["out"] = {"kernel": weight.T.reshape(h, -1, d),
                "bias": get(f"{prefix}out_proj.bias")[inverse]}
  return out


def _ffn(get, inverse: np.ndarray) -> dict:
  return {"wi": {"kernel": get("fc1.weight")[:, inverse].T, "bias": get("fc1.bias")},
          "wo": {"kernel": get("fc2.weight")[inverse, :].T, "bias": get("fc2.bias")[inverse]}}


def _norm(get, prefix: str, inverse: np.ndarray) -> dict:
  return {"scale": get(f"{prefix}weight")[inverse], "bias": get(f"{prefix}bias")[inverse]}


def _checked(params: dict, config) -> dict:
  """`params` as contiguous float32 arrays, checked leaf by leaf against the model `config`
  builds (a tensor Marian's folder lacks, or of another shape, is one line)."""
  import jax

  from transformer.model import transformer as model_lib

  model = model_lib.build_model(config)
  wanted = jax.eval_shape(lambda: model_lib.init_params(model, jax.random.key(0)))
  got = jax.tree_util.tree_leaves_with_path(params)
  shapes = {jax.tree_util.keystr(p): leaf.shape for p, leaf in got}
  for path, leaf in jax.tree_util.tree_leaves_with_path(wanted):
    key = jax.tree_util.keystr(path)
    if shapes.get(key) != leaf.shape:
      raise ConfigError(f"the imported parameter {key} has shape {shapes.get(key)}, the model "
                        f"needs {leaf.shape}")
  return jax.tree.map(lambda x: np.ascontiguousarray(x, np.float32), params)


def import_model(model: str | os.PathLike, workdir: str | os.PathLike, config
                 ) -> pathlib.Path:
  """Writes the workdir of the Marian folder `model` to `workdir` (new or empty), its config
  `config` (copied) with the model's `config.model`; nothing is written when the model
  cannot be expressed (a one-line `ConfigError`)."""
  from transformer.data import marian_vocabulary
  from transformer.run import checkpoint
  from transformer.run import workdir as workdir_lib

  folder = pathlib.Path(model)
  hf = _read_json(folder, "config.json")
  tokenizer_config = _read_json(folder, "tokenizer_config.json")
  pieces, rows = vocabulary(folder, hf, tokenizer_config)
  generation = (_read_json(folder, "generation_config.json")
                if (folder / "generation_config.json").exists() else {})
  overrides = model_overrides(hf, len(pieces), generation.get("max_length"))
  out = model_source.check_output(workdir).resolve()
  params = params_from(read_weights(folder), overrides, rows)
  config = config.copy_and_resolve_references()
  config.model.update(overrides)
  config.data.update(source_lang=tokenizer_config.get("source_lang") or "src",
                     target_lang=tokenizer_config.get("target_lang") or "tgt",
                     vocab_path=str(out / "vocabulary" / "vocabulary.json"))
  config.num_average = 1
  params = _checked(params, config)
  with model_source.written_whole(out) as tmp:
    marian_vocabulary.write(tmp / "vocabulary", pieces, (folder / "source.spm").read_bytes(),
                            (folder / "target.spm").read_bytes())
    workdir_lib.save_config(tmp, config)
    ckpt = checkpoint.Checkpointer(str(tmp), keep=1, keep_full=1)
    ckpt.save_params(0, params)
    ckpt.close()
    (tmp / "import.json").write_text(json.dumps(
        {"format": "marian", "model": str(folder.resolve()), "marian_config": hf},
        indent=2) + "\n")
  return out


def main(argv):
  del argv
  from absl import flags

  out = import_model(flags.FLAGS.model, flags.FLAGS.workdir, flags.FLAGS.config)
  print(f"wrote {out} (from the Marian model {flags.FLAGS.model}; checkpoint 0)")


if __name__ == "__main__":
  from absl import flags
  from ml_collections import config_flags

  from transformer import cli

  config_flags.DEFINE_config_file("config", None, "The config whose data, decoding and "
                                  "training settings the workdir takes (configs/*.py).")
  flags.DEFINE_string("model", None, "A Hugging Face Marian folder (OPUS-MT).")
  flags.DEFINE_string("workdir", None, "The workdir to write (new, or empty).")
  flags.mark_flags_as_required(["config", "model", "workdir"])
  cli.run(main)
