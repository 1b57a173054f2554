"""Translating with an exported `MarianMTModel` as this project's own search does.

Glossary: |Y| a hypothesis' length in tokens, EOS counted; beam the beam size.

transformers' beam search (`generate(num_beams=beam)`) is the project's
(`transformer.decoding.decode`) when told so: each step ranks the `2 * beam` best extensions by
their summed log-probabilities, EOS extensions among the best `beam` finish, the best `beam`
others stay live; with `early_stopping=True` a sentence ends when `beam` hypotheses have
finished. It differs in three places, which `translate` bridges:

1. The final ranking. generate() divides a finished score by `|Y|^length_penalty`; the
   project by the GNMT penalty `((5 + |Y|) / 6)^α`. `translate` runs generate() with
   `length_penalty=0` (scores are then the summed log-probabilities), asks for all `beam`
   finished hypotheses with their scores, and ranks them by the GNMT penalty.
2. The length limit. generate() has one `max_length` per call (the start symbol counted);
   `translate` calls it once per source length, as `search_rule.by_limit` groups them.
3. The last step. At a sentence's limit only EOS may follow, with its own log-probability;
   the exported `forced_eos_token_id` leaves only EOS too but scores it 0, which ranks a
   hypothesis cut at the limit above where the project puts it. `translate` replaces it
   with a logits processor that keeps EOS's log-probability.

What remains: when more than `beam` hypotheses have finished by a sentence's last step,
generate() keeps the `beam` best by summed log-probability and the project the `beam` best by
normalised score, so a long hypothesis the project would rank first can be dropped; and
floating-point near-ties (PyTorch's kernels are not XLA's). The tests count both.
"""

from __future__ import annotations

from typing import Sequence

from transformer.export import search_rule


def translate(model, tokenizer, sentences: Sequence[str], *, beam_size: int = 4,
              alpha: float = 0.6, max_extra_len: int = 50, max_len: int | None = None,
              max_batch_size: int = 32) -> list[str]:
  """Translations of `sentences` by a `transformers.MarianMTModel` of an exported model,
  ranked and bounded as `transformer.decoding.translate.translate_texts` ranks and bounds them.

  Args:
    model: `MarianMTModel.from_pretrained(folder)` of a folder written by
      `to_huggingface.export` (or any Marian model: its start, EOS and padding ids are read
      from its config), in eval mode.
    tokenizer: the model's vocabulary (`transformer.data.tokenizer.Tokenizer`, or anything
      with `encode` giving ids without EOS and `decode`), in the model's ids.
    sentences: source texts; blank ones translate to ''.
    beam_size, alpha, max_extra_len: `config.decode`'s beam size, length penalty and extra
      output length.
    max_len: `config.model.max_len`, the project's cap on output length (None: no cap).
    max_batch_size: sentences per generate() call.

  Returns:
    One translation per sentence, in order.
  """
  return [tokenizer.decode(ids) for ids in translate_ids(
      model, tokenizer, sentences, beam_size=beam_size, alpha=alpha,
      max_extra_len=max_extra_len, max_len=max_len, max_batch_size=max_batch_size)]


def translate_ids(model, tokenizer, sentences: Sequence[str], *, beam_size: int, alpha: float,
                  max_extra_len: int, max_len: int | None,
                  max_batch_size: int) -> list[list[int]]:
  """As `translate`, the output token ids (EOS included; `[]` for a blank sentence)."""
  ids_of = search_rule.encode_nonblank(tokenizer, sentences)
  results = [[] for _ in sentences]
  for limit, chunk in search_rule.by_limit(ids_of, max_extra_len, max_len, max_batch_size):
    found = _search(model, [ids_of[index] + [model.config.eos_token_id] for index in chunk],
                    limit, beam_size, alpha)
    for index, ids in zip(chunk, found):
      results[index] = ids
  return results


def _search(model, sources: list[list[int]], limit: int, beam_size: int,
            alpha: float) -> list[list[int]]:
  """The best hypothesis (ids ending in EOS) of each source under the project's rule."""
  import torch
  from transformers import LogitsProcessorList

  # The project's exports: start 0 (PAD), EOS 1, PAD 0; an OPUS-MT model: its own.
  c = model.config
  start, eos, pad = c.decoder_start_token_id, c.eos_token_id, c.pad_token_id
  width = max(map(len, sources))
  input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids in sources])
  options = dict(max_length=limit + 1, min_length=0, do_sample=False, num_beams=beam_size,
                 decoder_start_token_id=start, eos_token_id=eos, pad_token_id=pad)
  if beam_size > 1:
    options.update(num_return_sequences=beam_size, early_stopping=True, length_penalty=0.0,
                   output_scores=True, return_dict_in_generate=True)
  # The exported forced_eos_token_id would score EOS 0 at the limit, and generate() fills an
  # option given as None from the model's generation config: it is lifted for the call, and
  # `_eos_only_at(limit)` keeps EOS's own log-probability there, as the project does.
  forced, model.generation_config.forced_eos_token_id = (
      model.generation_config.forced_eos_token_id, None)
  try:
    with torch.no_grad():
      out = model.generate(input_ids=input_ids, attention_mask=(input_ids != pad).long(),
                           logits_processor=LogitsProcessorList([_eos_only_at(limit, eos)]),
                           **options)
  finally:
    model.generation_config.forced_eos_token_id = forced
  if beam_size == 1:
    return [_hypothesis(row, eos) for row in out.tolist()]
  rows, scores = out.sequences.tolist(), out.sequences_scores.tolist()
  best = []
  for first in range(0, len(rows), beam_size):
    candidates = [(_hypothesis(rows[k], eos), scores[k]) for k in range(first, first + beam_size)]
    best.append(search_rule.best(candidates, alpha))
  return best


def _eos_only_at(limit: int, eos: int):
  """A logits processor leaving only EOS, with its own log-probability, as output token
  `limit` (the project's last step); transformers' `ForcedEOSTokenLogitsProcessor` gives it
  log-probability 0 instead."""
  import torch
  from transformers import LogitsProcessor

  class EosOnlyAtLimit(LogitsProcessor):

    def __call__(self, input_ids, scores):
      if input_ids.shape[-1] != limit:  # the start symbol and limit - 1 output tokens
        return scores
      kept = torch.full_like(scores, -float("inf"))
      kept[:, eos] = scores[:, eos]
      return kept

  return EosOnlyAtLimit()


def _hypothesis(row: list[int], eos: int) -> list[int]:
  """The output ids of a generate() row: after the start symbol, up to and including EOS."""
  ids = row[1:]
  return ids[:ids.index(eos) + 1] if eos in ids else ids + [eos]
