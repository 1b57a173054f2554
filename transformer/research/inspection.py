"""Looking inside a trained model: attention heatmaps, positional encodings, sentence vectors.

  python -m transformer.research.inspection --workdir=runs/demo --sentence="the cat sees a bird ."

translates the sentence with the workdir's latest checkpoint (beam search, as evaluate.py),
then runs the model once over the sentence and its translation and writes, into
`WORKDIR/inspect/` (or `--output_dir`):
- `attention_encoder_self_layer<i>.png`, `attention_decoder_self_layer<i>.png`,
  `attention_decoder_cross_layer<i>.png`: one heatmap per head, rows the positions that
  attend, columns the positions attended to, each labelled with its subword token. Decoder
  rows are labelled with the token each position produces; the decoder reads the previous
  one (`<s>` is the start symbol).
- `positional_encoding.png`: the sinusoids added to the embeddings (§3.5), or the learned
  tables of the encoder and decoder (Table 3 row E), position by channel; none for the
  schemes whose positions enter self-attention (RoPE, T5, Shaw, ALiBi).

`sentence_embeddings(model, params, ids, pooling)` pools the encoder's output into one vector
per sentence (mean, max or first position, over real tokens only).

Glossary: B batch, S source length, T target length, D d_model, H heads.
"""

from __future__ import annotations

import functools
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from ml_collections import config_flags

from transformer.run import averaging
from transformer import cli
from transformer.model import position_schemes
from transformer.model import transformer as model_lib
from transformer.research import plots
from transformer.run import workdir as workdir_lib
from transformer.errors import ConfigError
from transformer.tokens import EOS_ID, PAD_ID

POOLINGS = ("mean", "max", "first")
STACKS = (("encoder", "self_attention", "encoder_self"),
          ("decoder", "self_attention", "decoder_self"),
          ("decoder", "cross_attention", "decoder_cross"))


@functools.partial(jax.jit, static_argnames="model")
def _encode(model, params, ids):
  return model.apply({"params": params}, ids, method="encode").astype(jnp.float32)


@functools.partial(jax.jit, static_argnames="model")
def _intermediates(model, params, inputs, targets):
  _, state = model.apply({"params": params}, inputs, targets, mutable=["intermediates"])
  return state["intermediates"]


def sentence_embeddings(
    model: model_lib.Transformer,
    params,
    ids: jax.Array,  # [B, S] source ids, PAD_ID = padding
    pooling: str = "mean",
) -> jax.Array:  # float32 [B, D]
  """One vector per sentence: the encoder's output pooled over its real (non-padding) tokens.

  Args:
    model: a `Transformer` from `build_model`.
    params: its parameters.
    ids: source ids, each row its tokens (EOS included, as the model was trained) then padding.
    pooling: 'mean' or 'max' over the real positions, or 'first' (the first token's vector).

  Returns:
    `[B, D]`; extra padding leaves every row unchanged.
  """
  if pooling not in POOLINGS:
    raise ConfigError(f"pooling={pooling!r} is not one of {', '.join(POOLINGS)}")
  ids = jnp.asarray(ids, jnp.int32)
  encoded = _encode(model, params, ids)  # [B, S, D]
  valid = (ids != PAD_ID)[..., None]  # [B, S, 1]
  if pooling == "first":
    return encoded[:, 0]
  if pooling == "max":
    return jnp.max(jnp.where(valid, encoded, -jnp.inf), axis=1)
  return jnp.sum(encoded * valid, axis=1) / jnp.maximum(jnp.sum(valid, axis=1), 1)


def attention_weights(model: model_lib.Transformer, params, source: list[int],
                      target: list[int]) -> dict[tuple[str, str, int], np.ndarray]:
  """The attention weights of one teacher-forced pass over a sentence pair.

  Args:
    model: a `Transformer`; its attention layers record their weights when the
      'intermediates' collection is mutable (attention_impl='reference').
    params: its parameters.
    source: source ids, EOS included.
    target: target ids, EOS included (the decoder reads them shifted right).

  Returns:
    `(stack, 'self_attention' | 'cross_attention', layer) -> [H, T, S]` weights.
  """
  sown_by = _intermediates(model, params, jnp.asarray([source], jnp.int32),
                           jnp.asarray([target], jnp.int32))
  found = {}
  for stack, kind, _ in STACKS:
    for layer in range(model.cfg.num_layers):
      sown = sown_by[stack][f"layer_{layer}"][kind]["attention_weights"]
      found[stack, kind, layer] = np.asarray(sown[0][0])  # the call's [B=1, H, T, S] -> [H, T, S]
  return found


def positional_encodings(model: model_lib.Transformer, params, length: int
                         ) -> dict[str, np.ndarray]:
  """name -> `[length, D]`: the sinusoids (§3.5), or each stack's learned table; nothing for
  the schemes whose positions enter self-attention instead of the embeddings."""
  cfg = model.cfg
  return position_schemes.get(cfg.positional).encodings(cfg, params, length)


def inspect_sentence(config, workdir: str | os.PathLike, sentence: str,
                     output_dir: str | os.PathLike | None = None) -> tuple[str, list[pathlib.Path]]:
  """Translates `sentence` with the latest checkpoint and draws what the model attends to.

  Returns:
    `(translation, paths of the PNGs written)`.

  Raises:
    ConfigError: an empty sentence, or a workdir without a checkpoint (nothing is written).
  """
  from transformer.data import tokenizer as tokenizer_lib
  from transformer.decoding import backend_ops
  from transformer.decoding import translate

  if not (sentence or "").strip():
    raise ConfigError("--sentence is empty: give a source sentence to translate and inspect")
  # The checkpoint first: without one this is an error before the data (a synthetic corpus
  # would be written to look its vocabulary up) is touched.
  params, steps = averaging.average_params(str(workdir), 1)
  tokenizer = tokenizer_lib.load_tokenizer(config, workdir)
  # The reference attention computes the weights explicitly; the other implementations
  # compute the same function without exposing them.
  config = config.copy_and_resolve_references()
  config.model.update(attention_impl="reference", remat=False)  # no backward pass here
  model = model_lib.build_model(config)

  source = tokenizer.encode(sentence) + [EOS_ID]
  ops = backend_ops.for_setting(config.cpu_workarounds)
  output = np.asarray(translate.translate_batch(model, params, np.asarray([source]),
                                                config.decode, ops=ops))[0].tolist()
  target = output[:output.index(EOS_ID) + 1] if EOS_ID in output else output
  translation = tokenizer.decode(target)

  out = pathlib.Path(output_dir or pathlib.Path(workdir) / "inspect")
  out.mkdir(parents=True, exist_ok=True)
  read = [tokenizer.piece(i) for i in source]
  produced = [tokenizer.piece(i) for i in target]
  labels = {"encoder_self": (read, read), "decoder_self": (produced, ["<s>"] + produced[:-1]),
            "decoder_cross": (produced, read)}
  written = []
  weights = attention_weights(model, params, source, target)
  for stack, kind, name in STACKS:
    for layer in range(config.model.num_layers):
      path = out / f"attention_{name}_layer{layer}.png"
      rows, cols = labels[name]
      plots.attention_heatmaps(
          weights[stack, kind, layer], rows, cols,
          f"{name.replace('_', ' ')}-attention, layer {layer} (checkpoint step {steps[-1]})",
          path)
      written.append(path)
  length = min(config.model.max_len, 128)
  for name, values in positional_encodings(model, params, length).items():
    suffix = "_" + name.split(", ")[1] if ", " in name else ""  # "learned, encoder"
    path = out / f"positional_encoding{suffix}.png"
    plots.matrix(values, f"positional encoding ({name}), first {length} positions", "channel",
                 "position", path)
    written.append(path)
  return translation, written


def _define_flags() -> None:
  """Flags, defined only when run as a program: the tools share names (--workdir, --config)
  and must import together into one process (tests, notebooks)."""
  flags.DEFINE_string("workdir", None, "A trained workdir.")
  flags.DEFINE_string("sentence", None, "The source sentence to translate and look at.")
  flags.DEFINE_string("output_dir", None, "Where the PNGs go (default WORKDIR/inspect).")
  config_flags.DEFINE_config_file(
      "config", None, "The config the workdir was trained with (default: "
      "WORKDIR/config.json).")
  flags.mark_flag_as_required("workdir")


def main(argv):
  del argv
  f = flags.FLAGS
  config = workdir_lib.config_for(f.workdir, f.config)
  translation, written = inspect_sentence(config, f.workdir, f.sentence, f.output_dir)
  print(f"source:      {f.sentence}\ntranslation: {translation}")
  print("wrote " + ", ".join(str(p) for p in written))


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
