"""Marian's vocabulary: one list of pieces for both sides, and a SentencePiece model per side.

An OPUS-MT model (Hugging Face's `MarianMTModel` folders) splits the source text with
`source.spm` and the target text with `target.spm`, and numbers the pieces of both by one
joint `vocab.json`, whose ids are not the SentencePiece models' own. `from_marian` writes that
vocabulary into a workdir as `vocabulary.json`:

  {"format": "marian", "pieces": [...], "source_spm": "source.spm", "target_spm": "target.spm"}

with the pieces renumbered to this project's fixed ids (`<pad>` 0, `</s>` 1, `<unk>` 2, then
Marian's order) and the two SentencePiece files beside it. `config.data.vocab_path` naming
that file loads a `MarianVocabulary`, which the pipeline, the decoder and the exports use as
they use a `Tokenizer`: `encode` splits source text, `encode_batch(..., side="target")`
target text, `decode` joins target pieces. A piece a side's SentencePiece model makes that the
list lacks is `<unk>`; a leading language token `>>xx<<` (multilingual OPUS-MT models) is one
piece, as transformers' `MarianTokenizer` reads it. That tokenizer also normalises punctuation
with sacremoses when that package is installed; this vocabulary does not.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Iterable, Sequence

import sentencepiece as spm

from transformer.data import vocabulary_record
from transformer.errors import ConfigError
from transformer.tokens import UNK_ID

FORMAT = "marian"
_WORD_START = "\u2581"  # SentencePiece's ▁


def write(folder: str | os.PathLike, pieces: Sequence[str], source_spm: bytes,
          target_spm: bytes) -> pathlib.Path:
  """Writes `vocabulary.json`, `source.spm` and `target.spm` into `folder`; returns the path
  of `vocabulary.json` (what `config.data.vocab_path` names)."""
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "source.spm").write_bytes(source_spm)
  (folder / "target.spm").write_bytes(target_spm)
  manifest = folder / "vocabulary.json"
  manifest.write_text(json.dumps({"format": FORMAT, "pieces": list(pieces),
                                  "source_spm": "source.spm", "target_spm": "target.spm"},
                                 ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
  return manifest


def is_manifest(path: str | os.PathLike) -> bool:
  """Whether `config.data.vocab_path` names a Marian vocabulary (a `.json` file)."""
  return str(path).endswith(".json")


def _processor(path: pathlib.Path, manifest: str) -> tuple[spm.SentencePieceProcessor, bytes]:
  try:
    proto = path.read_bytes()
  except OSError as e:
    raise ConfigError(f"vocabulary {manifest}: cannot read {path} ({e.strerror})") from None
  processor = spm.SentencePieceProcessor()
  try:
    processor.LoadFromSerializedProto(proto)
  except Exception:  # sentencepiece raises a bare RuntimeError with C++ text
    raise ConfigError(f"vocabulary {manifest}: {path} is not a SentencePiece model") from None
  return processor, proto


class MarianVocabulary(vocabulary_record.Recorded):
  """Marian's joint piece list and a SentencePiece model per side, used as a `Tokenizer`."""

  def __init__(self, path: str | os.PathLike):
    self.path = str(pathlib.Path(path).resolve())
    try:
      raw = pathlib.Path(self.path).read_bytes()
      manifest = json.loads(raw)
      pieces = manifest["pieces"]
      names = manifest["source_spm"], manifest["target_spm"]
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise ConfigError(f"vocabulary {path}: not a Marian vocabulary.json ({e}); write one "
                        "with python -m transformer.export.from_marian") from None
    folder = pathlib.Path(self.path).parent
    self._spm_paths = tuple(str(folder / name) for name in names)
    (self._source, source_proto), (self._target, target_proto) = (
        _processor(pathlib.Path(p), path) for p in self._spm_paths)
    self.sha256 = hashlib.sha256(raw + source_proto + target_proto).hexdigest()
    self._pieces = list(pieces)
    self._ids = {piece: i for i, piece in enumerate(self._pieces)}
    if len(self._pieces) < 3 or len(self._ids) != len(self._pieces):
      raise ConfigError(f"vocabulary {path}: its pieces must be distinct, <pad>, </s> and "
                        "<unk> first")

  @property
  def vocab_size(self) -> int:
    return len(self._pieces)

  def spm_paths(self) -> tuple[str, str]:
    return self._spm_paths

  def _to_ids(self, pieces: Iterable[str]) -> list[int]:
    return [self._ids.get(piece, UNK_ID) for piece in pieces]

  @staticmethod
  def _language_token(text: str) -> tuple[list[str], str]:
    """`([">>xx<<"], rest)` for a text led by a language token, else `([], text)`."""
    if text.startswith(">>") and (end := text.find("<<")) != -1:
      return [text[:end + 2]], text[end + 2:]
    return [], text

  def encode(self, text: str) -> list[int]:
    """Ids of source `text`, without EOS."""
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: Sequence[str], num_threads: int = -1,
                   side: str = "source") -> list[list[int]]:
    """Ids of each text of `side` ('source' or 'target'), without EOS (SentencePiece's own
    thread pool)."""
    processor = self._target if side == "target" else self._source
    codes, rests = zip(*map(self._language_token, texts)) if texts else ((), ())
    pieces = processor.encode(list(rests), out_type=str, num_threads=num_threads)
    return [self._to_ids(code + split) for code, split in zip(codes, pieces)]

  def decode(self, ids: Iterable[int]) -> str:
    """Target text of `ids` up to the first EOS; padding and ids outside the list dropped."""
    pieces = [self._pieces[i] for i in self.text_ids(ids)]
    # A piece the target model lacks stays as it is, its word-start mark then a space.
    return self._target.decode_pieces(pieces).replace(_WORD_START, " ").strip()

  def piece(self, i: int) -> str:
    return self._pieces[int(i)]
