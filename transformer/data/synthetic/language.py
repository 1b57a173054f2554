"""The two invented languages of the synthetic pair: lexicon, grammar, reference translation.

Two invented languages with a fixed lexicon of a few hundred words. The source is analytic
and SVO (English-like word order, no inflection: number, tense and negation are separate
words); the target is SOV and inflecting (Finnish-like): it reorders every clause and
builds each noun, adjective and verb form from the context. The target sentence is a
deterministic function of the source (`translate`), so BLEU 100 is reachable; `seed` only
chooses which sentences are drawn, the language itself never changes.

Grammar, source -> target (per clause; clauses keep their order):
  sentence = clause (conjunction clause)*             conjunctions translate word for word
  clause   = SUBJ [tense] [not] verb [adverb] [OBJ] (preposition NP)*
           -> SUBJ.nom (NP.case [postposition])* [OBJ.acc] [adverb] verb+tense+agreement [not]
  NP       = pronoun | determiner adjective* noun
           -> pronoun+case | [numeral/demonstrative] noun+number+case adjective+agreement*
              [definite article]
  - verb: stem + tense (present -, past -si, future -va) + person/number of the subject
    (-n, -t, -, -mme, -tte, -vat); transitive verbs always take an object.
  - noun: stem + number/case: nom -/-t, acc -m/-im, and a case per preposition (in -ssa,
    on -lla, to -lle, from -sta, with -kin; plural -i- before the case); the other
    prepositions become postpositions after a genitive (-n/-in). Number comes from the
    source determiner; a noun's gender (stem ending in a/ä or not) is lexical.
  - adjective: after the noun, agreeing in gender and number (-, -t, -ra, -rat).
  - determiners: the indefinite singular vanishes, the definite becomes an article after
    the noun phrase agreeing in gender and number (se, ne, sa, na), demonstratives and
    numerals stay in front.
  Every source word contains one of b d f g w z and no target word does, so no word is
  shared between the languages (the task is never a copy).

Example (the stream of `generate_pairs(seed=0)` holds it), glossed word by word:
  source: do durul sivibe wil mewam viwe zri bafa bund fe dugom
          the.SG ADJ NOUN FUT VERB ADV three NOUN under this NOUN
  target: mulmi rara se tämo vesan alla kolm tittäim sutta jisiva
          NOUN ADJ the.I.SG this NOUN-GEN under three NOUN-PL.ACC ADV VERB-FUT(-3SG)
"""

from __future__ import annotations

import dataclasses
import random
import types
from typing import Mapping

FORMAT_VERSION = 2  # bump whenever the language changes: cached corpora are regenerated
_LEXICON_SEED = 1706  # fixes the invented words; independent of the corpus seed
_NUM_CONTENT = {"noun": 100, "verb_t": 36, "verb_i": 20, "adj": 40, "adv": 20}

# Target affixes and function words.
_CASES = ("nom", "acc", "gen", "ine", "ade", "all", "ela", "com")
_NOUN_ENDINGS = {
    "sg": dict(nom="", acc="m", gen="n", ine="ssa", ade="lla", all="lle", ela="sta", com="kin"),
    "pl": dict(nom="t", acc="im", gen="in", ine="issa", ade="illa", all="ille", ela="ista",
               com="ikin"),
}
_ADJ_ENDINGS = {("I", "sg"): "", ("I", "pl"): "t", ("II", "sg"): "ra", ("II", "pl"): "rat"}
_ARTICLES = {("I", "sg"): "se", ("I", "pl"): "ne", ("II", "sg"): "sa", ("II", "pl"): "na"}
_TENSE_ENDINGS = {"pres": "", "past": "si", "fut": "va"}
_AGREEMENT = {(1, "sg"): "n", (2, "sg"): "t", (3, "sg"): "", (1, "pl"): "mme",
              (2, "pl"): "tte", (3, "pl"): "vat"}
_TARGET_NOT = "ei"


@dataclasses.dataclass(frozen=True)
class Entry:
  """One source word: its category, its target stem or word, and its grammatical features."""

  category: str  # noun verb_t verb_i adj adv det pron tense not conj prep
  target: str = ""  # stem (content words, pronouns) or word ('' = no target word)
  gender: str = ""  # nouns: 'I' | 'II'
  number: str = ""  # determiners and pronouns: 'sg' | 'pl'
  person: int = 3  # pronouns
  kind: str = ""  # determiners: indef | def | pre; tense: pres | past | fut
  case: str = ""  # prepositions: the target case (gen when followed by a postposition)
  postposition: str = ""  # prepositions rendered as genitive + postposition


_FUNCTION_WORDS = {
    # determiners: number, and how they surface in the target
    "ba": Entry("det", number="sg", kind="indef"),
    "bim": Entry("det", "eri", number="pl", kind="pre"),
    "do": Entry("det", number="sg", kind="def"),
    "dei": Entry("det", number="pl", kind="def"),
    "fe": Entry("det", "tämo", number="sg", kind="pre"),
    "fes": Entry("det", "nämo", number="pl", kind="pre"),
    "gu": Entry("det", "tuo", number="sg", kind="pre"),
    "gus": Entry("det", "nuo", number="pl", kind="pre"),
    "dwa": Entry("det", "kaks", number="pl", kind="pre"),
    "zri": Entry("det", "kolm", number="pl", kind="pre"),
    "fir": Entry("det", "nelj", number="pl", kind="pre"),
    # pronouns (target: stem + singular case ending)
    "wo": Entry("pron", "mi", number="sg", person=1),
    "du": Entry("pron", "si", number="sg", person=2),
    "zel": Entry("pron", "hän", number="sg", person=3),
    "zal": Entry("pron", "hon", number="sg", person=3),
    "wim": Entry("pron", "me", number="pl", person=1),
    "dun": Entry("pron", "te", number="pl", person=2),
    "zen": Entry("pron", "he", number="pl", person=3),
    "bed": Entry("tense", kind="past"),
    "wil": Entry("tense", kind="fut"),
    "nog": Entry("not", _TARGET_NOT),
    "zu": Entry("conj", "ja"),
    "bat": Entry("conj", "mut"),
    "fo": Entry("conj", "kosk"),
    "bin": Entry("prep", case="ine"),
    "dom": Entry("prep", case="ade"),
    "zum": Entry("prep", case="all"),
    "fram": Entry("prep", case="ela"),
    "wid": Entry("prep", case="com"),
    "bund": Entry("prep", case="gen", postposition="alla"),
    "beg": Entry("prep", case="gen", postposition="takan"),
    "fin": Entry("prep", case="gen", postposition="luon"),
    "gor": Entry("prep", case="gen", postposition="vart"),
}


def _forms(category: str, stem: str) -> list[str]:
  """Every target surface form of a content stem (used to keep forms unambiguous)."""
  if category == "noun":
    return [stem + e for endings in _NOUN_ENDINGS.values() for e in endings.values()]
  if category.startswith("verb"):
    return [stem + t + a for t in _TENSE_ENDINGS.values() for a in _AGREEMENT.values()]
  if category == "adj":
    return [stem + e for e in _ADJ_ENDINGS.values()]
  return [stem]


def _build_lexicon() -> dict[str, Entry]:
  """The fixed bilingual lexicon: function words above plus seeded invented content words."""
  rng = random.Random(_LEXICON_SEED)
  pick = lambda seq: seq[int(rng.random() * len(seq))]  # random() alone is stable across Pythons
  lexicon = dict(_FUNCTION_WORDS)
  taken = {e.target for e in lexicon.values()} | set(_ARTICLES.values())
  taken |= {e.postposition for e in lexicon.values()}
  for e in lexicon.values():
    if e.category == "pron":
      taken |= {e.target + end for end in _NOUN_ENDINGS["sg"].values()}
  clusters = ("nt", "lk", "st", "kk", "tt", "pp", "nn", "rt", "ht", "mp", "rk", "lm", "ns")
  for category, count in _NUM_CONTENT.items():
    for i in range(count):
      while True:  # source word: 2-3 CV syllables, maybe a final consonant, with b/d/f/g/w/z
        word = "".join(pick("bdfgklmnprstvwz") + pick("aeiou")
                       for _ in range(2 + (rng.random() < 0.3)))
        word += pick("lmnrs") if rng.random() < 0.5 else ""
        if set(word) & set("bdfgwz") and word not in lexicon:
          break
      gender = ("I", "II")[i % 2] if category == "noun" else ""
      while True:  # target stem: CV(C)CV; a noun's last vowel shows its gender
        middle = pick(clusters) if rng.random() < 0.4 else pick("hjklmnprstv")
        last = {"I": "eiouyö", "II": "aä"}.get(gender, "aeiouyäö")
        stem = pick("hjklmnprstv") + pick("aeiouyäö") + middle + pick(last)
        forms = _forms(category, stem)
        if not taken.intersection(forms):
          taken.update(forms)
          break
      lexicon[word] = Entry(category, stem, gender=gender)
  return lexicon


# Source word -> entry; read-only, as the language must not change under a cached corpus.
LEXICON: Mapping[str, Entry] = types.MappingProxyType(_build_lexicon())
# Source words of each category, sorted (what the sampler draws from).
BY_CATEGORY = {c: sorted(w for w, e in LEXICON.items() if e.category == c)
                for c in sorted({e.category for e in LEXICON.values()})}


@dataclasses.dataclass
class _NounPhrase:
  head: Entry  # noun or pronoun
  det: Entry | None = None
  adjectives: tuple[Entry, ...] = ()

  def render(self, case: str) -> list[str]:
    if self.head.category == "pron":
      return [self.head.target + _NOUN_ENDINGS["sg"][case]]
    number, gender = self.det.number, self.head.gender
    words = [self.head.target + _NOUN_ENDINGS[number][case]]
    words += [a.target + _ADJ_ENDINGS[gender, number] for a in self.adjectives]
    if self.det.kind == "pre":
      words.insert(0, self.det.target)
    elif self.det.kind == "def":
      words.append(_ARTICLES[gender, number])
    return words


class _Parser:
  """Recursive descent over the source grammar; one clear error on anything else."""

  def __init__(self, source: str):
    self.words = source.split()
    self.i = 0
    for w in self.words:
      if w not in LEXICON:
        raise ValueError(f"synthetic.translate: {w!r} in {source!r} is not a source word "
                         "(see synthetic.LEXICON)")
    self.source = source

  def peek(self, *categories: str) -> Entry | None:
    if self.i < len(self.words) and LEXICON[self.words[self.i]].category in categories:
      self.i += 1
      return LEXICON[self.words[self.i - 1]]
    return None

  def expect(self, *categories: str) -> Entry:
    entry = self.peek(*categories)
    if entry is None:
      found = self.words[self.i] if self.i < len(self.words) else "the end"
      raise ValueError(f"synthetic.translate: expected {'/'.join(categories)} at word "
                       f"{self.i + 1} of {self.source!r}, found {found!r}")
    return entry

  def noun_phrase(self) -> _NounPhrase:
    pronoun = self.peek("pron")
    if pronoun:
      return _NounPhrase(pronoun)
    det = self.expect("det")
    adjectives = []
    while (adj := self.peek("adj")):
      adjectives.append(adj)
    return _NounPhrase(self.expect("noun"), det, tuple(adjectives))

  def clause(self) -> list[str]:
    subject = self.noun_phrase()
    tense = self.peek("tense")
    negated = self.peek("not")
    verb = self.expect("verb_t", "verb_i")
    adverb = self.peek("adv")
    obj = self.noun_phrase() if verb.category == "verb_t" else None
    words = subject.render("nom")
    while (prep := self.peek("prep")):
      words += self.noun_phrase().render(prep.case)
      words += [prep.postposition] if prep.postposition else []
    words += obj.render("acc") if obj else []
    words += [adverb.target] if adverb else []
    person, number = ((subject.head.person, subject.head.number) if subject.det is None
                      else (3, subject.det.number))
    words.append(verb.target + _TENSE_ENDINGS[tense.kind if tense else "pres"]
                 + _AGREEMENT[person, number])
    words += [negated.target] if negated else []
    return words

  def sentence(self) -> list[str]:
    words = self.clause()
    while (conj := self.peek("conj")):
      words += [conj.target] + self.clause()
    if self.i != len(self.words):
      raise ValueError(f"synthetic.translate: unexpected {self.words[self.i]!r} at word "
                       f"{self.i + 1} of {self.source!r}")
    return words


def translate(source: str) -> str:
  """The target sentence of a source sentence: the language's reference translation.

  Args:
    source: words of the source language separated by spaces.

  Returns:
    The target sentence, words separated by single spaces.

  Raises:
    ValueError: on an unknown word or a sentence outside the grammar.
  """
  return " ".join(_Parser(source).sentence())
