"""The project's ranking and length limit, as the exported-model searches apply them.

Glossary: |Y| a hypothesis' length in tokens, EOS counted.

`transformer.decoding.decode` ranks a finished hypothesis by its summed log-probability over
the GNMT penalty `((5 + |Y|) / 6)^α` and bounds |Y| for each sentence at its source tokens
(EOS counted) + `max_extra_len` (§6.1), capped by `config.model.max_len`. An external engine
has one length limit per call, so `by_limit` groups the sentences that share one.
"""

from __future__ import annotations

import collections
from typing import Sequence


def gnmt_penalty(length: int, alpha: float) -> float:
  """`((5 + |Y|) / 6)^α`, as `transformer.decoding.decode.length_penalty`."""
  return ((5.0 + length) / 6.0) ** alpha


def output_limit(num_source_ids: int, max_extra_len: int, max_len: int | None) -> int:
  """The largest |Y| the project's search allows for a source of `num_source_ids` tokens
  (EOS not counted)."""
  limit = num_source_ids + 1 + max_extra_len  # the source's tokens with EOS, + 50 (§6.1)
  return min(limit, max_len) if max_len else limit


def encode_nonblank(tokenizer, sentences: Sequence[str]) -> dict[int, list[int]]:
  """The token ids (no EOS) of each sentence that is not blank, by its index."""
  return {i: list(tokenizer.encode(text)) for i, text in enumerate(sentences) if text.strip()}


def by_limit(ids_of: dict[int, list[int]], max_extra_len: int, max_len: int | None,
             max_batch_size: int) -> list[tuple[int, list[int]]]:
  """`(limit, indices)` chunks of at most `max_batch_size` sentences sharing a limit."""
  groups = collections.defaultdict(list)
  for index, ids in ids_of.items():
    groups[output_limit(len(ids), max_extra_len, max_len)].append(index)
  return [(limit, indices[start:start + max_batch_size])
          for limit, indices in sorted(groups.items())
          for start in range(0, len(indices), max_batch_size)]


def best(candidates: Sequence[tuple[Sequence, float]], alpha: float):
  """The hypothesis (ending in EOS) with the best GNMT-normalised score among `(hypothesis,
  summed log-probability)` pairs; the earlier one on a tie."""
  ranked = [(raw / gnmt_penalty(len(hyp), alpha), -j, j) for j, (hyp, raw)
            in enumerate(candidates)]
  return candidates[max(ranked)[2]][0]
