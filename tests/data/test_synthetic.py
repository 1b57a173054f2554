"""The synthetic language pair: determinism, grammar properties and the corpus writer.

Word alignments are found by substitution: replace one source word by another of the same
category and features, translate both, and see which target positions change.
"""

import json
import os
import re

import pytest

from transformer.data import synthetic
from transformer.data.synthetic import LEXICON, generate_pairs, translate, write_corpus

SAMPLE = generate_pairs(3000, seed=0)


def _cat(word):
  return LEXICON[word].category


def _words(category, **features):
  """Source words of a category whose entry has the given feature values."""
  return [w for w, e in sorted(LEXICON.items())
          if e.category == category and all(getattr(e, k) == v for k, v in features.items())]


def _swap(words, i, replacement):
  return words[:i] + [replacement] + words[i + 1:]


def _aligned(words, i):
  """Target positions of source word i: those that change when it is replaced."""
  e = LEXICON[words[i]]
  same = dict(noun=dict(gender=e.gender), det=dict(number=e.number, kind=e.kind)).get(
      e.category, {})
  other = next(w for w in _words(e.category, **same) if w != words[i])
  before = translate(" ".join(words)).split()
  after = translate(" ".join(_swap(words, i, other))).split()
  assert len(before) == len(after)
  return [k for k, (a, b) in enumerate(zip(before, after)) if a != b]


def _single_clauses(predicate):
  out = [s.split() for s, _ in SAMPLE
         if "conj" not in map(_cat, s.split()) and predicate([_cat(w) for w in s.split()])]
  assert len(out) >= 20, "too few sample sentences of the wanted shape"
  return out


def test_same_seed_same_pairs_other_seed_other_pairs():
  assert generate_pairs(300, seed=7) == generate_pairs(300, seed=7)
  assert generate_pairs(300, seed=7)[:100] == generate_pairs(100, seed=7)
  assert generate_pairs(300, seed=8) != generate_pairs(300, seed=7)


def test_lengths_cover_3_to_30_words_mostly_short():
  src = [len(s.split()) for s, _ in SAMPLE]
  tgt = [len(t.split()) for _, t in SAMPLE]
  for lengths in (src, tgt):
    assert synthetic.MIN_WORDS == 3 and synthetic.MAX_WORDS == 30
    assert min(lengths) >= 3 and max(lengths) <= 30
    assert min(lengths) <= 4 and max(lengths) >= 25  # the whole range is used
    assert 6 < sum(lengths) / len(lengths) < 16  # mostly short-to-medium


def test_lexicon_has_a_few_hundred_words_and_no_word_is_shared():
  assert 200 <= len(LEXICON) <= 600
  source_vocab = {w for s, _ in SAMPLE for w in s.split()}
  target_vocab = {w for _, t in SAMPLE for w in t.split()}
  assert len(source_vocab) > 0.9 * len(LEXICON)  # the sample uses almost every word
  assert not source_vocab & target_vocab  # never a copy task


def test_target_is_a_function_of_the_source():
  seen = {}
  for seed in range(3):  # short sources recur across seeds
    for source, target in generate_pairs(3000, seed=seed):
      assert seen.setdefault(source, target) == target
      assert translate(source) == target
  assert len(seen) < 9000  # some sources did recur, so the check compared something


def test_svo_becomes_sov():
  # Single clauses "det adj* noun verb det adj* noun" (no particle, adverb or phrase).
  shape = re.compile(r"det (adj )*noun verb_t det (adj )*noun$")
  checked = 0
  for words in _single_clauses(lambda c: shape.match(" ".join(c))):
    cats = [_cat(w) for w in words]
    s, v = cats.index("noun"), cats.index("verb_t")
    o = len(words) - 1
    ps, pv, po = _aligned(words, s), _aligned(words, v), _aligned(words, o)
    assert len(ps) == len(pv) == len(po) == 1
    assert ps[0] < po[0] < pv[0], words  # source order s < v < o
    checked += 1
  assert checked >= 20


def test_adjectives_follow_their_noun_in_the_target():
  for words in _single_clauses(lambda c: "adj" in c)[:50]:
    a = [_cat(w) for w in words].index("adj")
    n = a + [_cat(w) for w in words[a:]].index("noun")
    assert _aligned(words, n)[0] < _aligned(words, a)[0]


def test_verb_agrees_with_subject_person_and_number():
  for words in _single_clauses(lambda c: c[0] == "pron")[:20]:
    v = next(i for i, w in enumerate(words) if _cat(w).startswith("verb"))
    (pv,) = _aligned(words, v)
    forms = {}
    for pronoun in _words("pron"):
      e = LEXICON[pronoun]
      form = translate(" ".join(_swap(words, 0, pronoun))).split()[pv]
      forms.setdefault((e.person, e.number), set()).add(form)
    # The same source verb: one form per person/number, different across them.
    assert all(len(f) == 1 for f in forms.values())
    assert len(set.union(*forms.values())) == len(forms) == 6


def test_noun_form_depends_on_number_and_role():
  shape = re.compile(r"det (adj )*noun verb_t det (adj )*noun$")
  sentences = _single_clauses(lambda c: shape.match(" ".join(c)))
  # The indefinite singular has no target word, so its plural would shift positions.
  for words in [w for w in sentences if LEXICON[w[0]].kind != "indef"][:20]:
    cats = [_cat(w) for w in words]
    s, v = cats.index("noun"), cats.index("verb_t")
    (ps,) = _aligned(words, s)
    # Number: the same noun after a determiner of the other number.
    det = LEXICON[words[0]]
    other = _words("det", kind=det.kind, number={"sg": "pl", "pl": "sg"}[det.number])[0]
    target = translate(" ".join(words)).split()
    assert translate(" ".join(_swap(words, 0, other))).split()[ps] != target[ps]
    # Role: the subject's noun phrase copied into the object slot.
    as_object = words[:v + 1] + words[:s + 1]
    (po,) = _aligned(as_object, len(as_object) - 1)
    assert translate(" ".join(as_object)).split()[po] != target[ps]


def test_adjective_agrees_with_noun_gender():
  for words in _single_clauses(lambda c: "adj" in c)[:20]:
    a = [_cat(w) for w in words].index("adj")
    n = a + [_cat(w) for w in words[a:]].index("noun")
    (pa,) = _aligned(words, a)
    target = translate(" ".join(words)).split()
    for noun in _words("noun", gender="I")[:5] + _words("noun", gender="II")[:5]:
      form = translate(" ".join(_swap(words, n, noun))).split()[pa]
      same_gender = LEXICON[noun].gender == LEXICON[words[n]].gender
      assert (form == target[pa]) == same_gender


def test_docstring_example_is_a_real_translation():
  lines = synthetic.language.__doc__.splitlines()
  source = next(l for l in lines if l.strip().startswith("source:")).split(":", 1)[1].strip()
  target = next(l for l in lines if l.strip().startswith("target:")).split(":", 1)[1].strip()
  assert translate(source) == target


def test_bad_input_raises_one_clear_error():
  with pytest.raises(ValueError, match="'xyzzy'.*not a source word"):
    translate("wo xyzzy")
  verb = _words("verb_t")[0]
  with pytest.raises(ValueError, match="expected det"):
    translate(f"wo {verb}")  # a transitive verb without its object
  with pytest.raises(ValueError, match="seed"):
    generate_pairs(3, seed=-1)
  with pytest.raises(ValueError, match="num_train"):
    write_corpus("/nonexistent", num_train=0)


def _read(directory):
  return {f.name: f.read_text(encoding="utf-8").splitlines()
          for f in synthetic.corpus_files(directory)}


def test_write_corpus_aligned_disjoint_idempotent(tmp_path):
  sizes = dict(num_train=1500, num_valid=100, num_test=120)
  # Seed 2's stream repeats a source within its first 1,720 draws: the writer must skip it.
  drawn = [s for s, _ in generate_pairs(1720, seed=2)]
  assert len(set(drawn)) < len(drawn)
  write_corpus(tmp_path, seed=2, **sizes)
  files = _read(tmp_path)
  for split, n in (("train", 1500), ("valid", 100), ("test", 120)):
    assert len(files[f"{split}.src"]) == len(files[f"{split}.tgt"]) == n
    for s, t in zip(files[f"{split}.src"], files[f"{split}.tgt"]):
      assert translate(s) == t
  train = set(files["train.src"])
  assert len(train) == 1500  # no repeats inside a split either
  assert not train & set(files["valid.src"]) and not train & set(files["test.src"])
  assert not set(files["valid.src"]) & set(files["test.src"])
  expected = {f.name for f in synthetic.corpus_files(tmp_path)} | {synthetic.MANIFEST}
  assert set(os.listdir(tmp_path)) == expected  # no temp files left
  assert json.loads((tmp_path / synthetic.MANIFEST).read_text())["seed"] == 2

  stamps = {f: os.stat(tmp_path / f).st_mtime_ns for f in expected}
  write_corpus(tmp_path, seed=2, **sizes)  # same parameters: nothing is rewritten
  assert {f: os.stat(tmp_path / f).st_mtime_ns for f in expected} == stamps

  write_corpus(tmp_path, seed=3, **sizes)  # other parameters: regenerated
  assert _read(tmp_path)["train.src"] != files["train.src"]
  assert set(os.listdir(tmp_path)) == expected


def test_interrupted_write_leaves_no_partial_corpus(tmp_path, monkeypatch):
  sizes = dict(num_train=300, num_valid=20, num_test=20)
  write_corpus(tmp_path, seed=1, **sizes)
  real_replace, calls = os.replace, []

  def crash_on_third(src, dst):
    calls.append(dst)
    if len(calls) == 3:
      raise KeyboardInterrupt("simulated crash")
    real_replace(src, dst)

  monkeypatch.setattr(os, "replace", crash_on_third)
  with pytest.raises(KeyboardInterrupt):
    write_corpus(tmp_path, seed=2, **sizes)
  monkeypatch.undo()
  names = set(os.listdir(tmp_path))
  assert synthetic.MANIFEST not in names  # mixed files are never taken as complete
  assert not [n for n in names if n.endswith(".tmp")]
  write_corpus(tmp_path, seed=2, **sizes)
  fresh = tmp_path / "fresh"
  write_corpus(fresh, seed=2, **sizes)
  assert _read(tmp_path) == _read(fresh)


def test_describe_shows_grammar_lexicon_and_live_examples():
  text = synthetic.describe(num_examples=2, seed=5)
  assert f"{len(LEXICON)} source words" in text and "Grammar" in text
  for source, target in generate_pairs(2, seed=5):
    assert source in text and target in text
