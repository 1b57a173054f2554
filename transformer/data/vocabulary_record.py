"""What a SentencePiece `Tokenizer` and a `MarianVocabulary` share: the record a checkpoint
keeps of its vocabulary, the check on resume, and the ids that `decode` reads."""

from __future__ import annotations

from typing import Iterable

import numpy as np
from absl import logging

from transformer.errors import ConfigError
from transformer.tokens import EOS_ID, PAD_ID


class Recorded:
  """A vocabulary with `path`, `sha256` and `vocab_size`, which a checkpoint records, and the
  ids its `decode` reads."""

  path: str
  sha256: str
  vocab_size: int

  def record(self) -> dict:
    """What a checkpoint stores to check the vocabulary on resume."""
    return {"path": self.path, "sha256": self.sha256, "vocab_size": self.vocab_size}

  def text_ids(self, ids: Iterable[int]) -> list[int]:
    """`ids` up to the first EOS, without padding and ids outside the vocabulary."""
    out = []
    for i in np.asarray(ids).reshape(-1).tolist():
      if i == EOS_ID:
        break
      if i != PAD_ID and 0 <= i < self.vocab_size:
        out.append(i)
    return out

  def check_matches(self, recorded: dict) -> None:
    """Raises a one-line `ConfigError` when `recorded` (from a checkpoint) names another
    vocabulary."""
    if recorded.get("sha256") != self.sha256:
      raise ConfigError(
          f"vocabulary mismatch on resume: the checkpoint was trained with {recorded.get('path')} "
          f"(sha256 {str(recorded.get('sha256'))[:12]}…) but this run loads {self.path} "
          f"(sha256 {self.sha256[:12]}…); pass --config.data.vocab_path={recorded.get('path')} "
          "or use a fresh workdir")
    if recorded.get("path") != self.path:
      logging.info("vocabulary %s has the checksum recorded for %s", self.path,
                   recorded.get("path"))
