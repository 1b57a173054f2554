"""Translating with an exported CTranslate2 model as this project's own search does.

Glossary: |Y| a hypothesis' length in tokens, EOS counted; beam the beam size.

CTranslate2's beam search is the project's (`transformer.decoding.decode`): each step ranks
the `2 * beam` best extensions by their summed log-probabilities, EOS extensions among the
best `beam` finish, the best `beam` others stay live, and a sentence ends when `beam`
hypotheses have finished. It differs in three places, which `translate` bridges:

1. The final ranking. CTranslate2 divides a finished score by `|Y|^length_penalty`; the
   project by the GNMT penalty `((5 + |Y|) / 6)^α`. `translate` asks for every finished
   hypothesis with its score under a negligible `length_penalty` (1e-6: zero would switch on
   CTranslate2's early exit, which stops at the first finished hypothesis), recovers the
   summed log-probability, and ranks by the GNMT penalty.
2. The length limit. The project bounds each sentence at its source tokens (EOS counted) +
   `max_extra_len`, where only EOS may follow; CTranslate2 has one `max_decoding_length` per
   call, and at its last step keeps the best `beam` candidates whether they end in EOS or not.
   `translate` calls CTranslate2 once per source length with one step fewer than the
   project's bound and finishes a hypothesis cut there with its EOS log-probability
   (`score_batch`). Greedy search is then exact; beam search may still differ for a sentence
   that reaches its limit, where the project also finishes the live beams ranked below the
   best `beam` candidates at the step before.
3. The first step. CTranslate2 forbids EOS before `min_decoding_length` (1 by default); the
   project allows an empty translation, so `translate` passes 0.

What remains are floating-point near-ties (CTranslate2's kernels are not XLA's), which the
tests count.

CTranslate2 at its best, for a fair comparison of speed (`transformer.export.speed`): its own
search (`translate_batch` over all the sentences, its `|Y|^α` ranking) under the fastest
setting of its documented throughput knobs (its "Performance tips" and "Multithreading and
parallelism" pages). `knob_grid` lists the settings: `inter_threads` workers x `intra_threads`
threads each, the product the cores given (more threads than cores it advises against), and
`max_batch_size` counting "examples" or "tokens" (the sentences are sorted by length, split into
sub-batches of that size, and the sub-batches run in parallel on the workers); `Translators`
times them and `fastest` picks the best of each compute type.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Sequence

from transformer.export import search_rule

# The sub-batch sizes `knob_grid` tries, in sentences and in tokens.
EXAMPLES = (16, 32, 64, 128)
TOKENS = (512, 1024, 2048, 4096)

# A length penalty this small changes scores by a factor |Y|^1e-6 (< 1 + 1e-5) and is undone
# exactly; 0 would make CTranslate2 stop at the first finished hypothesis.
_TINY_PENALTY = 1e-6


def translate(translator, tokenizer, sentences: Sequence[str], *, beam_size: int = 4,
              alpha: float = 0.6, max_extra_len: int = 50, max_len: int | None = None,
              max_batch_size: int = 64, sub_batch: tuple[int, str] = (0, "examples")
              ) -> list[str]:
  """Translations of `sentences` by a CTranslate2 `translator` of an exported model, ranked
  and bounded as `transformer.decoding.translate.translate_texts` ranks and bounds them.

  Args:
    translator: a `ctranslate2.Translator` of a folder written by `to_ctranslate2.export`.
    tokenizer: the model's vocabulary (`transformer.data.tokenizer.Tokenizer`, or anything
      with `encode`, `decode` and `piece`).
    sentences: source texts; blank ones translate to ''.
    beam_size, alpha, max_extra_len: `config.decode`'s beam size, length penalty and extra
      output length.
    max_len: `config.model.max_len`, the project's cap on output length (None: no cap).
    max_batch_size: sentences per CTranslate2 call.
    sub_batch: `(max_batch_size, batch_type)` of each CTranslate2 call: its sentences split
      into sub-batches of that many examples or tokens, which the translator's workers
      (`inter_threads`) translate in parallel; `(0, ...)`, one batch.

  Returns:
    One translation per sentence, in order.
  """
  return [tokenizer.decode(ids) for ids in translate_ids(
      translator, tokenizer, sentences, beam_size=beam_size, alpha=alpha,
      max_extra_len=max_extra_len, max_len=max_len, max_batch_size=max_batch_size,
      sub_batch=sub_batch)]


def translate_ids(translator, tokenizer, sentences: Sequence[str], *, beam_size: int,
                  alpha: float, max_extra_len: int, max_len: int | None,
                  max_batch_size: int, sub_batch: tuple[int, str] = (0, "examples")
                  ) -> list[list[int]]:
  """As `translate`, the output token ids (EOS included; `[]` for a blank sentence)."""
  ids_of = search_rule.encode_nonblank(tokenizer, sentences)
  piece_id = {tokenizer.piece(i): i for i in range(tokenizer.vocab_size)}
  results = [[] for _ in sentences]
  for limit, chunk in search_rule.by_limit(ids_of, max_extra_len, max_len, max_batch_size):
    source = [[tokenizer.piece(i) for i in ids_of[index]] for index in chunk]
    for index, ids in zip(chunk, _search(translator, source, limit, beam_size, alpha,
                                         sub_batch)):
      results[index] = [_id(piece_id, p) for p in ids]
  return results


def _id(piece_id: dict[str, int], piece: str) -> int:
  """The id of an output piece; `<unused_N>` (an embedding row past the vocabulary) is N."""
  if piece in piece_id:
    return piece_id[piece]
  return int(piece.removeprefix("<unused_").removesuffix(">"))


def _search(translator, source: list[list[str]], limit: int, beam_size: int, alpha: float,
            sub_batch: tuple[int, str]) -> list[list[str]]:
  """The best hypothesis (pieces, ending in `</s>`) of each source under the project's rule."""
  eos = "</s>"
  if limit <= 1:  # only EOS fits
    return [[eos] for _ in source]
  split = dict(max_batch_size=sub_batch[0], batch_type=sub_batch[1])
  options = dict(beam_size=beam_size, min_decoding_length=0, max_decoding_length=limit - 1,
                 return_end_token=True, **split)
  if beam_size == 1:
    out = translator.translate_batch(source, **options, length_penalty=0.0)
    return [_with_eos(r.hypotheses[0], eos) for r in out]
  out = translator.translate_batch(source, **options, num_hypotheses=beam_size,
                                   return_scores=True, length_penalty=_TINY_PENALTY)
  # Hypotheses cut at the limit lack EOS: score it where it stands (the project's last step).
  cut = [(i, j) for i, r in enumerate(out) for j, h in enumerate(r.hypotheses)
         if not h or h[-1] != eos]
  eos_log_prob = {}
  if cut:
    scored = translator.score_batch([source[i] for i, _ in cut],
                                    [out[i].hypotheses[j] for i, j in cut], **split)
    eos_log_prob = {key: s.log_probs[-1] for key, s in zip(cut, scored)}
  best = []
  for i, r in enumerate(out):
    candidates = []
    for j, (hyp, score) in enumerate(zip(r.hypotheses, r.scores)):
      raw = score * max(len(hyp), 1) ** _TINY_PENALTY  # the summed log-probability
      if (i, j) in eos_log_prob:
        hyp, raw = hyp + [eos], raw + eos_log_prob[i, j]
      candidates.append((hyp, raw))
    best.append(search_rule.best(candidates, alpha))
  return best


def _with_eos(hyp: list[str], eos: str) -> list[str]:
  return hyp if hyp and hyp[-1] == eos else hyp + [eos]



@dataclasses.dataclass(frozen=True)
class Knobs:
  """One setting of CTranslate2's throughput knobs."""

  compute_type: str
  inter_threads: int  # workers, each translating its own sub-batches
  intra_threads: int  # threads of each worker's operations
  max_batch_size: int
  batch_type: str  # "examples" or "tokens": what max_batch_size counts

  def __str__(self) -> str:
    return (f"{self.compute_type}, inter_threads={self.inter_threads} "
            f"intra_threads={self.intra_threads}, max_batch_size={self.max_batch_size} "
            f"{self.batch_type}")


def thread_splits(cores: int, device: str = "cpu") -> list[tuple[int, int]]:
  """`(inter_threads, intra_threads)` pairs whose product is `cores`; on a GPU, 1 or 2
  workers (CUDA streams)."""
  if cores < 1:
    raise ValueError(f"cores={cores} must be at least 1")
  if device != "cpu":
    return [(1, 1), (2, 1)]
  return [(inter, cores // inter) for inter in range(1, cores + 1) if cores % inter == 0]


def knob_grid(cores: int, compute_types: Sequence[str], examples: Sequence[int] = EXAMPLES,
              tokens: Sequence[int] = TOKENS, device: str = "cpu") -> list[Knobs]:
  """Every combination of the knobs, those of one translator (compute type, threads)
  together."""
  return [Knobs(compute_type, inter, intra, size, batch_type)
          for compute_type in compute_types for inter, intra in thread_splits(cores, device)
          for batch_type, sizes in (("examples", examples), ("tokens", tokens))
          for size in sizes]


def time_settings(settings: Sequence[Knobs], seconds_of: Callable[[Knobs], float],
                  num_sentences: int) -> list[dict]:
  """Each setting's `knobs`, `seconds` (by `seconds_of(knobs)`) and `sentences_per_second`,
  fastest first."""
  rows = []
  for knobs in settings:
    seconds = seconds_of(knobs)
    rows.append(dict(knobs=dataclasses.asdict(knobs), seconds=seconds,
                     sentences_per_second=num_sentences / seconds))
  return sorted(rows, key=lambda r: -r["sentences_per_second"])


def fastest(rows: list[dict], compute_type: str) -> Knobs | None:
  """The fastest setting of `compute_type` among the rows of `time_settings` (None: none)."""
  rows = [r for r in rows if r["knobs"]["compute_type"] == compute_type]
  if not rows:
    return None
  return Knobs(**max(rows, key=lambda r: r["sentences_per_second"])["knobs"])


class Translators:
  """CTranslate2's own search over fixed sentences under any `Knobs`: one translator per
  compute type and thread split, warmed by one untimed pass before its first timing.

  Args:
    folders: the exported model folder of each compute type (`to_ctranslate2.export`).
    tokenizer: the model's vocabulary.
    sentences: the source texts.
    alpha, max_extra_len, max_len: `config.decode`'s length penalty and extra output length,
      `config.model.max_len`; the length limit is the longest source's (CTranslate2 takes one
      `max_decoding_length` a call).
    device: "cpu" or "cuda".
  """

  def __init__(self, folders: dict, tokenizer, sentences: Sequence[str], *, alpha: float,
               max_extra_len: int, max_len: int | None, device: str = "cpu"):
    self.folders, self.tokenizer, self.device, self.alpha = folders, tokenizer, device, alpha
    self.pieces = [[tokenizer.piece(i) for i in tokenizer.encode(s)] for s in sentences]
    self.max_decoding_length = search_rule.output_limit(
        max(map(len, self.pieces), default=0), max_extra_len, max_len)
    self.piece_id = {tokenizer.piece(i): i for i in range(tokenizer.vocab_size)}
    self.translators, self.warm = {}, set()

  def translator(self, knobs: Knobs):
    """The translator of `knobs`' compute type and threads (built once)."""
    import ctranslate2

    key = (knobs.compute_type, knobs.inter_threads, knobs.intra_threads)
    if key not in self.translators:
      self.translators[key] = ctranslate2.Translator(
          str(self.folders[knobs.compute_type]), device=self.device,
          compute_type=knobs.compute_type, inter_threads=knobs.inter_threads,
          intra_threads=knobs.intra_threads)
    return self.translators[key]

  def translate(self, knobs: Knobs, beam_size: int) -> list[str]:
    """The sentences translated in one `translate_batch` call under `knobs`."""
    out = self.translator(knobs).translate_batch(
        self.pieces, max_batch_size=knobs.max_batch_size, batch_type=knobs.batch_type,
        beam_size=beam_size, length_penalty=self.alpha, min_decoding_length=0,
        max_decoding_length=self.max_decoding_length)
    return [self.tokenizer.decode([_id(self.piece_id, p) for p in r.hypotheses[0]])
            for r in out]

  def seconds(self, knobs: Knobs, beam_size: int, rounds: int = 1) -> float:
    """The median of `rounds` timed passes under `knobs`."""
    key = (knobs.compute_type, knobs.inter_threads, knobs.intra_threads, beam_size)
    if key not in self.warm:
      self.translate(knobs, beam_size)
      self.warm.add(key)
    times = []
    for _ in range(rounds):
      start = time.perf_counter()
      self.translate(knobs, beam_size)
      times.append(time.perf_counter() - start)
    return statistics.median(times)
