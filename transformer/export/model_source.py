"""What an export reads from a workdir, as NumPy, and what each format can express.

Glossary: D d_model, H heads, K d_k, F d_ff, V vocabulary (the model's rows), L layers.

`load` restores the latest (or the mean of the last k) checkpoints, the workdir's config and
its shared SentencePiece vocabulary; `check_exportable` refuses, before anything is written,
a model the target format cannot express, in one line naming the config key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import shutil
from typing import Any, Iterator

import numpy as np

from transformer.errors import ConfigError
from transformer.tokens import EOS_ID, PAD_ID, UNK_ID

FORMATS = ("ctranslate2", "huggingface")


@dataclasses.dataclass(frozen=True)
class Source:
  """A trained model ready to export."""

  config: Any  # the workdir's ml_collections config
  params: dict  # float32 NumPy arrays, as the flax model names them
  tokenizer: Any  # transformer.data.tokenizer.Tokenizer
  steps: list[int]  # the checkpoint steps whose parameters these are (averaged if several)

  @property
  def model(self):
    return self.config.model

  def pieces(self) -> list[str]:
    """The vocabulary as `V` strings, id order: the SentencePiece pieces (`<pad>` 0, `</s>` 1,
    `<unk>` 2), then `<unused_N>` for embedding rows the SentencePiece model does not use."""
    used = self.tokenizer.vocab_size
    pieces = [self.tokenizer.piece(i) for i in range(used)]
    return pieces + [f"<unused_{i}>" for i in range(used, self.model.vocab_size)]

  def special_pieces(self) -> dict[str, str]:
    """`{'pad': '<pad>', 'eos': '</s>', 'unk': '<unk>'}`, read from the vocabulary."""
    return {name: self.tokenizer.piece(i)
            for name, i in (("pad", PAD_ID), ("eos", EOS_ID), ("unk", UNK_ID))}


def load(workdir: str | os.PathLike, num_average: int) -> Source:
  """The workdir's config, its last `num_average` checkpoints averaged, and its vocabulary.

  Raises:
    ConfigError: one line, for a workdir without a config, checkpoints or vocabulary.
  """
  from transformer.data import tokenizer as tokenizer_lib
  from transformer.run import averaging
  from transformer.run import config_checks
  from transformer.run import workdir as workdir_lib

  config = workdir_lib.load_config(workdir)
  config_checks.validate(config)
  params, steps = averaging.average_params(str(workdir), num_average)
  tokenizer = tokenizer_lib.load_tokenizer(config, workdir)
  params = _as_numpy(params)
  return Source(config=config, params=params, tokenizer=tokenizer, steps=list(steps))


def _as_numpy(tree, copy: bool = False):
  if isinstance(tree, dict) or hasattr(tree, "items"):
    return {k: _as_numpy(v, copy) for k, v in tree.items()}
  return np.array(tree, np.float32, copy=True) if copy else np.asarray(tree, np.float32)


def copied_params(source: Source) -> dict:
  """A private copy of `source.params`: CTranslate2's quantization (`spec.optimize`) rewrites
  the arrays it is given in place."""
  return _as_numpy(source.params, copy=True)


def check_exportable(model_config, fmt: str) -> None:
  """Raises a one-line `ConfigError` naming the key when `fmt` cannot express the model.

  Both formats need `d_k = d_v = d_model / num_heads` (Table 3 rows A and B set them apart).
  CTranslate2 takes pre-LN (with final LayerNorms), any position table, learned ones
  included, and every departure of configs/modern.py but ALiBi, which its encoder lacks, and
  QK-norm: its RMS form it computes unreliably in an encoder-decoder (docs/export.md), its L2
  form with a learned scale it has not.
  Hugging Face's Marian is post-LN LayerNorm with sinusoids, one shared embedding, a
  non-gated feed-forward and full multi-head attention; it takes GELU and Swish, and zeros
  for absent biases. Marian's attention and output biases (`attention_biases`, `output_bias`,
  a model imported from OPUS-MT) go to Hugging Face only. Training-only keys (optimiser,
  schedule, z-loss) export as they are.
  """
  if fmt not in FORMATS:
    raise ConfigError(f"--format={fmt!r} is not one of {', '.join(map(repr, FORMATS))}")
  m = model_config
  if m.d_k != m.d_v:
    raise ConfigError(f"config.model.d_k={m.d_k} differs from config.model.d_v={m.d_v}: "
                      f"{fmt} has one head size for keys and values; this model cannot be "
                      "exported")
  if m.d_k * m.num_heads != m.d_model:
    raise ConfigError(f"config.model.d_k={m.d_k} × num_heads={m.num_heads} != "
                      f"d_model={m.d_model}: {fmt} needs d_k = d_model / num_heads (Table 3 "
                      "rows A/B depart from it); this model cannot be exported")
  from transformer.model import position_schemes

  position_schemes.get(m.positional).check_export(fmt)
  if m.qk_norm != "none":
    # CTranslate2 4.8.5 takes an RMS form's spec, but one exported model scored the same
    # sentence differently on every run (docs/export.md), and has no L2 form with a learned
    # scale; Marian has neither.
    raise ConfigError(f"config.model.qk_norm={m.qk_norm!r}: {fmt} has no query/key norm that "
                      "computes this model's; this model cannot be exported")
  if fmt == "huggingface":
    _check_marian(m)
  elif m.attention_biases or m.output_bias:
    key = "attention_biases" if m.attention_biases else "output_bias"
    raise ConfigError(f"config.model.{key}=True (Marian's biases): this export to CTranslate2 "
                      "does not map them; export with --format=huggingface and convert that "
                      "folder with CTranslate2's own ct2-transformers-converter")


# What Marian cannot express: the key, the paper's value (Marian's), and what Marian takes.
_MARIAN_FIXED = (("norm", "post", "post-LN only"),
                 ("norm_type", "layernorm", "LayerNorm only"),
                 ("num_kv_heads", 0, "one key/value head per query head only"),
                 ("tie_embeddings", "three_way", "one shared embedding only"))


def _check_marian(m) -> None:
  for key, paper, says in _MARIAN_FIXED:
    if m[key] != paper and not (key == "num_kv_heads" and m[key] == m.num_heads):
      raise ConfigError(f"config.model.{key}={m[key]!r}: Hugging Face's MarianMTModel takes "
                        f"{says}; export this model with --format=ctranslate2")
  if m.activation not in ("relu", "gelu", "swish"):
    raise ConfigError(f"config.model.activation={m.activation!r}: Hugging Face's MarianMTModel "
                      "takes no gated feed-forward; export this model with --format=ctranslate2")


def check_output(output: str | os.PathLike) -> pathlib.Path:
  """`output` as a path, or a one-line `ConfigError` when it exists and is not an empty
  folder (an export never overwrites)."""
  path = pathlib.Path(output)
  if path.exists() and (not path.is_dir() or any(path.iterdir())):
    raise ConfigError(f"--output={output} exists and is not an empty folder; name a new one "
                      "(an export never overwrites)")
  return path


@contextlib.contextmanager
def written_whole(out: pathlib.Path) -> Iterator[pathlib.Path]:
  """A temporary folder beside `out` (checked by `check_output`) to write the export into;
  renamed to `out` when the block ends, removed if it fails: `out` is written whole or not
  at all."""
  tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
  try:
    tmp.mkdir(parents=True)
    yield tmp
    if out.exists():
      out.rmdir()  # empty (check_output)
    os.replace(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def position_table(model_config, params: dict, side: str, rows: int) -> np.ndarray:
  """The `[rows, D]` position encodings the model adds to scaled embeddings on `side`
  ('encoder' or 'decoder'): the paper's interleaved sinusoids (§3.5), that side's learned
  table (its `max_len` rows; `rows` is then ignored), or zeros for the schemes whose
  positions enter self-attention instead."""
  from transformer.model import position_schemes

  scheme = position_schemes.get(model_config.positional)
  return scheme.position_table(model_config, params, side, rows)


def heads_to_linear(kernel: np.ndarray) -> np.ndarray:
  """A `[D, H, K]` projection kernel as the `[H * K, D]` (out, in) weight of a linear layer;
  head h takes output rows `h * K .. (h + 1) * K`."""
  d = kernel.shape[0]
  return np.ascontiguousarray(kernel.reshape(d, -1).T)


def linear_to_heads_out(kernel: np.ndarray) -> np.ndarray:
  """An output projection kernel `[H, K, D]` as the `[D, H * K]` (out, in) weight."""
  return np.ascontiguousarray(kernel.reshape(-1, kernel.shape[-1]).T)
