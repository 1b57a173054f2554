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
"""

from __future__ import annotations

from typing import Sequence

from transformer.export import search_rule

# A length penalty this small changes scores by a factor |Y|^1e-6 (< 1 + 1e-5) and is undone
# exactly; 0 would make CTranslate2 stop at the first finished hypothesis.
_TINY_PENALTY = 1e-6


def translate(translator, tokenizer, sentences: Sequence[str], *, beam_size: int = 4,
              alpha: float = 0.6, max_extra_len: int = 50, max_len: int | None = None,
              max_batch_size: int = 64) -> list[str]:
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

  Returns:
    One translation per sentence, in order.
  """
  return [tokenizer.decode(ids) for ids in translate_ids(
      translator, tokenizer, sentences, beam_size=beam_size, alpha=alpha,
      max_extra_len=max_extra_len, max_len=max_len, max_batch_size=max_batch_size)]


def translate_ids(translator, tokenizer, sentences: Sequence[str], *, beam_size: int,
                  alpha: float, max_extra_len: int, max_len: int | None,
                  max_batch_size: int) -> list[list[int]]:
  """As `translate`, the output token ids (EOS included; `[]` for a blank sentence)."""
  ids_of = search_rule.encode_nonblank(tokenizer, sentences)
  piece_id = {tokenizer.piece(i): i for i in range(tokenizer.vocab_size)}
  results = [[] for _ in sentences]
  for limit, chunk in search_rule.by_limit(ids_of, max_extra_len, max_len, max_batch_size):
    source = [[tokenizer.piece(i) for i in ids_of[index]] for index in chunk]
    for index, ids in zip(chunk, _search(translator, source, limit, beam_size, alpha)):
      results[index] = [_id(piece_id, p) for p in ids]
  return results


def _id(piece_id: dict[str, int], piece: str) -> int:
  """The id of an output piece; `<unused_N>` (an embedding row past the vocabulary) is N."""
  if piece in piece_id:
    return piece_id[piece]
  return int(piece.removeprefix("<unused_").removesuffix(">"))


def _search(translator, source: list[list[str]], limit: int, beam_size: int,
            alpha: float) -> list[list[str]]:
  """The best hypothesis (pieces, ending in `</s>`) of each source under the project's rule."""
  eos = "</s>"
  if limit <= 1:  # only EOS fits
    return [[eos] for _ in source]
  options = dict(beam_size=beam_size, min_decoding_length=0, max_decoding_length=limit - 1,
                 return_end_token=True)
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
                                    [out[i].hypotheses[j] for i, j in cut])
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

