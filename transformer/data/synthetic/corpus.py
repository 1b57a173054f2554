"""Sentence pairs of the synthetic language (`language.py`), and the demo corpus on disk.

`generate_pairs` draws source sentences from the grammar with a seeded sampler and pairs each
with its translation; `write_corpus` writes `{train,valid,test}.{src,tgt}` once per seed, the
files `dataset='synthetic'` trains on.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
from typing import Iterator

from transformer.data import textio
from transformer.data.synthetic import language
from transformer.data.synthetic.language import BY_CATEGORY, FORMAT_VERSION, LEXICON, translate

SPLITS = ("train", "valid", "test")
MANIFEST = "synthetic.json"
MIN_WORDS, MAX_WORDS = 3, 30  # on both sides

# Sentence shape: mostly one short clause, so a small model trains on many pairs per second.
_NUM_CLAUSES = {1: 0.72, 2: 0.22, 3: 0.06}
_TENSES = {"pres": 0.5, "past": 0.3, "fut": 0.2}
_NUM_PPS = {0: 0.6, 1: 0.32, 2: 0.08}
_NUM_ADJECTIVES = {0: 0.6, 1: 0.32, 2: 0.08}
_P_PRONOUN_SUBJECT, _P_PRONOUN_OBJECT = 0.3, 0.2
_P_NOT, _P_TRANSITIVE, _P_ADVERB = 0.15, 0.6, 0.25


class _Sampler:
  """Draws source sentences from the grammar; only `random.random()` is used, whose
  sequence for a given integer seed Python guarantees across versions."""

  def __init__(self, seed: int):
    self.rng = random.Random(seed)

  def word(self, category: str) -> str:
    words = BY_CATEGORY[category]
    return words[int(self.rng.random() * len(words))]

  def choose(self, weights: dict):
    x, total = self.rng.random() * sum(weights.values()), 0.0
    for key, w in weights.items():
      total += w
      if x < total:
        return key
    return key

  def chance(self, p: float) -> bool:
    return self.rng.random() < p

  def noun_phrase(self, p_pronoun: float) -> list[str]:
    if self.chance(p_pronoun):
      return [self.word("pron")]
    adjectives = [self.word("adj") for _ in range(self.choose(_NUM_ADJECTIVES))]
    return [self.word("det"), *adjectives, self.word("noun")]

  def clause(self) -> list[str]:
    words = self.noun_phrase(_P_PRONOUN_SUBJECT)
    tense = self.choose(_TENSES)
    words += [] if tense == "pres" else [next(w for w in BY_CATEGORY["tense"]
                                              if LEXICON[w].kind == tense)]
    words += [self.word("not")] if self.chance(_P_NOT) else []
    transitive = self.chance(_P_TRANSITIVE)
    words.append(self.word("verb_t" if transitive else "verb_i"))
    words += [self.word("adv")] if self.chance(_P_ADVERB) else []
    words += self.noun_phrase(_P_PRONOUN_OBJECT) if transitive else []
    for _ in range(self.choose(_NUM_PPS)):
      words += [self.word("prep"), *self.noun_phrase(_P_PRONOUN_OBJECT)]
    return words

  def sentence(self) -> str:
    words = self.clause()
    for _ in range(self.choose(_NUM_CLAUSES) - 1):
      words += [self.word("conj"), *self.clause()]
    return " ".join(words)


def _iter_pairs(seed: int) -> Iterator[tuple[str, str]]:
  if not isinstance(seed, int) or seed < 0:
    raise ValueError(f"synthetic: seed={seed!r} must be a non-negative integer")
  sampler = _Sampler(seed)
  while True:
    source = sampler.sentence()
    target = translate(source)
    if (MIN_WORDS <= len(source.split()) <= MAX_WORDS
        and MIN_WORDS <= len(target.split()) <= MAX_WORDS):
      yield source, target


def generate_pairs(num_pairs: int, *, seed: int) -> list[tuple[str, str]]:
  """`num_pairs` (source, target) pairs, as drawn (repeats possible); same seed, same pairs.

  Args:
    num_pairs: how many pairs.
    seed: a non-negative integer; chooses the sentences, not the language.

  Returns:
    A list of (source, target) sentence pairs, words separated by single spaces.
  """
  if not isinstance(num_pairs, int) or num_pairs < 0:
    raise ValueError(f"synthetic.generate_pairs: num_pairs={num_pairs!r} must be an int >= 0")
  pairs = _iter_pairs(seed)
  return [next(pairs) for _ in range(num_pairs)]


def _unique_pairs(seed: int, num_pairs: int) -> list[tuple[str, str]]:
  """The first `num_pairs` distinct sources of the seed's stream, with their targets."""
  seen, pairs = set(), []
  for attempt, (source, target) in enumerate(_iter_pairs(seed)):
    if len(pairs) == num_pairs:
      return pairs
    if attempt > 20 * num_pairs + 1000:  # the grammar holds billions of sentences
      raise ValueError(f"synthetic: could not draw {num_pairs} distinct sentences")
    if source not in seen:
      seen.add(source)
      pairs.append((source, target))
  raise AssertionError("unreachable")


def corpus_files(directory: str | os.PathLike) -> list[pathlib.Path]:
  """The six files `write_corpus` writes: `{train,valid,test}.{src,tgt}`."""
  return [pathlib.Path(directory) / f"{split}.{side}" for split in SPLITS
          for side in ("src", "tgt")]


def write_corpus(directory: str | os.PathLike, *, seed: int = 0, num_train: int = 50_000,
                 num_valid: int = 500, num_test: int = 500) -> None:
  """Writes `{train,valid,test}.{src,tgt}` (UTF-8, one sentence per line, aligned).

  Does nothing when all six files exist and the manifest (`synthetic.json`) records the
  same parameters and format version. Every source sentence occurs once in the whole
  corpus, so no valid or test sentence is in train. Each file is written to a temp file
  and renamed; the manifest is removed first and written last, so an interrupted run is
  redone by the next call.

  Args:
    directory: the output folder (created if missing).
    seed: a non-negative integer choosing the sentences.
    num_train: training pairs.
    num_valid: validation pairs.
    num_test: test pairs.
  """
  sizes = dict(train=num_train, valid=num_valid, test=num_test)
  for split, n in sizes.items():
    if not isinstance(n, int) or n < 1:
      raise ValueError(f"synthetic.write_corpus: num_{split}={n!r} must be a positive int")
  if not isinstance(seed, int) or seed < 0:
    raise ValueError(f"synthetic.write_corpus: seed={seed!r} must be a non-negative integer")
  directory = pathlib.Path(directory)
  manifest = directory / MANIFEST
  params = dict(format_version=FORMAT_VERSION, seed=seed, **{f"num_{k}": v
                                                            for k, v in sizes.items()})
  if manifest.is_file() and all(p.is_file() for p in corpus_files(directory)):
    try:
      if json.loads(manifest.read_text(encoding="utf-8")) == params:
        return
    except json.JSONDecodeError:
      pass  # a damaged manifest: regenerate
  directory.mkdir(parents=True, exist_ok=True)
  pairs = _unique_pairs(seed, num_test + num_valid + num_train)
  # Held-out splits first, so their sentences keep the grammar's distribution.
  bounds = dict(test=(0, num_test), valid=(num_test, num_test + num_valid),
                train=(num_test + num_valid, len(pairs)))
  manifest.unlink(missing_ok=True)
  for split in SPLITS:
    chunk = pairs[slice(*bounds[split])]
    for side, index in (("src", 0), ("tgt", 1)):
      textio.write_text_atomically(directory / f"{split}.{side}",
                                   "".join(p[index] + "\n" for p in chunk))
  textio.write_text_atomically(manifest, json.dumps(params, indent=2, sort_keys=True) + "\n")


def describe(num_examples: int = 3, seed: int = 0) -> str:
  """A short human-readable summary: grammar, lexicon sizes and a few example pairs."""
  sizes = ", ".join(f"{c} {len(w)}" for c, w in BY_CATEGORY.items())
  lines = [language.__doc__.strip(), "", f"Lexicon: {len(LEXICON)} source words ({sizes}).",
           f"Examples (seed={seed}):"]
  for source, target in generate_pairs(num_examples, seed=seed):
    lines += [f"  {source}", f"  -> {target}"]
  return "\n".join(lines)

