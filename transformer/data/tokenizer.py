"""One shared SentencePiece vocabulary for source and target (paper §5.1).

The vocabulary is trained once from a sample of the training text drawn with `config.data.seed`
(not the run's `config.seed`: runs of several seeds share it) and cached under the
data cache folder (`config.data.cache_dir`, by default `WORKDIR/data`), under a name that
records what it was trained from, so training, a resumed run and `evaluate.py` all load the
same file. `config.data.vocab_path` names an existing `.model` instead (or the
`vocabulary.json` of a model imported from Marian, `marian_vocabulary`).

Ids are fixed by `transformer.tokens`: `pad_id=0, eos_id=1, unk_id=2`, no BOS. `encode` adds
no EOS (the pipeline appends it); `decode` stops at the first EOS and drops padding.

Its size is `config.model.vocab_size`, the one source of truth: when the sampled text cannot
make that many pieces, training fails with the largest size it supports rather than silently
making a smaller vocabulary than the model's embedding (set `vocab_size` to that, or sample
more text with `vocab_sample_sentences`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import re
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm
from absl import logging

from transformer.data import cache_lock, marian_vocabulary, textio, vocabulary_record
from transformer.tokens import EOS_ID, PAD_ID, UNK_ID
from transformer import errors
from transformer.errors import ConfigError

# Fixed, not os.cpu_count(): SentencePiece's result depends on its thread count, and the same
# text must give the same vocabulary (and checksum) on every machine.
_TRAIN_THREADS = 8


class Tokenizer(vocabulary_record.Recorded):
  """A loaded SentencePiece model with its file path and SHA-256 checksum."""

  def __init__(self, path: str | os.PathLike):
    self.path = str(pathlib.Path(path).resolve())
    try:
      proto = pathlib.Path(self.path).read_bytes()
    except OSError as e:
      raise ConfigError(f"vocabulary {path}: cannot read it ({e.strerror})") from None
    self.sha256 = hashlib.sha256(proto).hexdigest()
    self._sp = spm.SentencePieceProcessor()
    try:
      self._sp.LoadFromSerializedProto(proto)
    except Exception:  # sentencepiece raises a bare RuntimeError/OSError with C++ text
      raise ConfigError(f"vocabulary {path}: not a SentencePiece model (it does not load); "
                       "give a .model file from spm_train or leave config.data.vocab_path "
                       "empty to train one") from None
    ids = dict(pad_id=self._sp.pad_id(), eos_id=self._sp.eos_id(), unk_id=self._sp.unk_id())
    if ids != dict(pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID):
      raise ConfigError(f"vocabulary {path} has {ids}; this project needs pad_id={PAD_ID}, "
                       f"eos_id={EOS_ID}, unk_id={UNK_ID} (spm_train --pad_id=0 --eos_id=1 "
                       "--unk_id=2 --bos_id=-1)")

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without EOS."""
    return self._sp.encode(text)

  def encode_batch(self, texts: Sequence[str], num_threads: int = -1,
                   side: str = "source") -> list[list[int]]:
    """Token ids of each text, without EOS (SentencePiece's own thread pool); one model for
    either `side`."""
    del side
    return self._sp.encode(list(texts), num_threads=num_threads)

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids` up to the first EOS; padding and ids outside the vocabulary are dropped."""
    return self._sp.decode(self.text_ids(ids))

  def piece(self, i: int) -> str:
    """The subword piece of id `i` (`▁` marks a word start; `</s>` is EOS)."""
    return self._sp.id_to_piece(int(i))

  def spm_paths(self) -> tuple[str, str]:
    """The SentencePiece models of the source and the target side: this one, twice."""
    return self.path, self.path


def vocab_cache_path(config, cache_dir: str | os.PathLike, train_identity: dict) -> pathlib.Path:
  """Where the vocabulary trained for `config` from the train split `train_identity` lives."""
  data = config.data
  key = dict(identity=train_identity, source=data.source_lang, target=data.target_lang,
             vocab_size=config.model.vocab_size, model_type=data.vocab_model_type,
             sample=data.vocab_sample_sentences, coverage=data.vocab_character_coverage,
             seed=data.seed, threads=_TRAIN_THREADS)
  tag = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
  name = f"spm-{data.vocab_model_type}{config.model.vocab_size}-{tag}.model"
  return pathlib.Path(cache_dir) / name


def sample_pairs(pairs: Iterable[tuple[str, str]], k: int, seed: int) -> list[tuple[str, str]]:
  """A uniform sample of `k` pairs (all if fewer), in corpus order, without knowing the count.

  Bottom-k sampling: every pair gets a seeded random key and the `k` smallest keys win, so the
  sample is a pure function of the corpus and the seed, in one pass.
  """
  rng = np.random.default_rng([seed, 0x5EED])
  keys = np.empty(0)
  kept: list[tuple[int, tuple[str, str]]] = []
  chunk: list[tuple[str, str]] = []
  offset = 0

  def flush():
    nonlocal keys, kept, offset
    new = rng.random(len(chunk))
    all_keys = np.concatenate([keys, new])
    items = kept + [(offset + i, p) for i, p in enumerate(chunk)]
    offset += len(chunk)
    chunk.clear()
    if len(items) > k:
      top = np.argpartition(all_keys, k - 1)[:k]
      keys, kept = all_keys[top], [items[i] for i in top]
    else:
      keys, kept = all_keys, items

  for pair in pairs:
    chunk.append(pair)
    if len(chunk) >= max(k, 65536):
      flush()
  flush()
  return [p for _, p in sorted(kept, key=lambda x: x[0])]


def train_vocabulary(sentences: Sequence[str], path: str | os.PathLike, *, vocab_size: int,
                     model_type: str = "bpe", character_coverage: float = 1.0,
                     description: str = "the training text", sampled: bool = False) -> None:
  """Trains a SentencePiece model on `sentences` and writes it to `path` atomically.

  `sampled` says that `sentences` are a sample of a larger text (for the error message).
  """
  writer = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=writer, vocab_size=vocab_size,
        model_type=model_type, character_coverage=character_coverage, pad_id=PAD_ID,
        eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1, num_threads=_TRAIN_THREADS,
        minloglevel=2)
  except RuntimeError as e:
    message = str(e)
    most = re.search(r"value <= (\d+)", message)
    if most:
      more = (", or sample more text (config.data.vocab_sample_sentences)" if sampled
              else " (all of its text was used)")
      raise ConfigError(
          f"config.model.vocab_size={vocab_size} is too large for {description}: SentencePiece "
          f"can make at most {most.group(1)} pieces from its {len(sentences)} sentences; set "
          f"--config.model.vocab_size={most.group(1)} or less{more}") from None
    need = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message)
    if need:
      raise ConfigError(
          f"config.model.vocab_size={vocab_size} is smaller than the {need.group(2)} characters "
          f"of {description}; raise it or lower config.data.vocab_character_coverage") from None
    raise ConfigError(f"training the vocabulary on {description} failed: {message}") from None
  path = pathlib.Path(path)
  # Whole or not at all: a part-written vocabulary takes room and serves nobody.
  with errors.writing("the vocabulary", path):
    path.parent.mkdir(parents=True, exist_ok=True)
    textio.write_bytes_atomically(path, writer.getvalue())


def load_tokenizer(config, workdir: str | os.PathLike) -> Tokenizer:
  """The vocabulary `config` trains with: `config.data.vocab_path`, else the cached one.

  For `evaluate.py` and tools: it never trains; a missing vocabulary is an error that says
  how to make it.
  """
  from transformer.data import datasets  # the cache name depends on the training split's identity

  if config.data.vocab_path:
    return _fitting(open_vocabulary(config.data.vocab_path), config)
  cache_dir = datasets.cache_dir(config, workdir)
  train = datasets.split_sources(config, cache_dir, splits=("train",), check=False)["train"]
  path = vocab_cache_path(config, cache_dir, train.identity)
  if not path.exists():
    given = config.data.cache_dir
    moved = (f"; config.data.cache_dir={given} does not exist: for a run moved from where it "
             "trained (a sweep's runs share ROOT/data), set --config.data.cache_dir to the "
             "data folder it trained with" if given and not os.path.isdir(given) else "")
    raise ConfigError(f"no vocabulary at {path}: train first (train.py --workdir={workdir}), "
                      "or set --config.data.vocab_path to an existing SentencePiece .model"
                      f"{moved}")
  return _fitting(Tokenizer(path), config)


def open_vocabulary(path: str | os.PathLike) -> Tokenizer:
  """The vocabulary `config.data.vocab_path` names: a SentencePiece `.model`, or the
  `vocabulary.json` of a model imported from Marian (`marian_vocabulary`)."""
  if marian_vocabulary.is_manifest(path):
    return marian_vocabulary.MarianVocabulary(path)
  return Tokenizer(path)


def _fitting(tok: Tokenizer, config) -> Tokenizer:
  """`tok`, or a `ConfigError` if it has more pieces than the model's embedding has rows."""
  if tok.vocab_size > config.model.vocab_size:
    raise ConfigError(f"the vocabulary {tok.path} has {tok.vocab_size} pieces but "
                      f"config.model.vocab_size={config.model.vocab_size}; make them equal "
                      "(or use the vocabulary the model was trained with)")
  return tok


def get_or_train(config, cache_dir: str | os.PathLike, train_source) -> Tokenizer:
  """The configured or cached vocabulary, trained from `train_source` when missing."""
  if config.data.vocab_path:
    tok = open_vocabulary(config.data.vocab_path)
    logging.info("vocabulary: %s (given; %d pieces, sha256 %s)", tok.path, tok.vocab_size,
                 tok.sha256[:12])
    return _fitting(tok, config)
  path = vocab_cache_path(config, cache_dir, train_source.identity)
  if not path.exists():  # a cached one is read without a lock (the cache may be read-only)
    with cache_lock.building(path):  # processes sharing the cache train it once
      if not path.exists():
        return _train_into(path, config, train_source)
  tok = Tokenizer(path)
  logging.info("vocabulary: %s (cached; %d pieces, sha256 %s)", tok.path, tok.vocab_size,
               tok.sha256[:12])
  return _fitting(tok, config)


def _train_into(path: pathlib.Path, config, train_source) -> Tokenizer:
  """Trains the vocabulary `config` describes from a sample of `train_source` into `path`."""
  num_pairs = -(-config.data.vocab_sample_sentences // 2)  # both sides of each pair
  pairs = sample_pairs(train_source.pairs(), num_pairs, config.data.seed)
  sentences = [s for pair in pairs for s in pair if s.strip()]
  logging.info("training a %s vocabulary of %d pieces on %d sentences of %s",
               config.data.vocab_model_type, config.model.vocab_size, len(sentences),
               train_source.description)
  train_vocabulary(sentences, path, vocab_size=config.model.vocab_size,
                   model_type=config.data.vocab_model_type,
                   character_coverage=config.data.vocab_character_coverage,
                   description=train_source.description, sampled=len(pairs) == num_pairs)
  tok = Tokenizer(path)
  logging.info("vocabulary: %s (trained; sha256 %s)", tok.path, tok.sha256[:12])
  return tok
