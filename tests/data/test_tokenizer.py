"""The shared SentencePiece vocabulary: ids, caching, determinism, clear errors."""

import hashlib
import pathlib

import pytest
import sentencepiece as spm

from tests.support import files_config, write_pairs
from transformer.data import datasets
from transformer.data import tokenizer
from transformer.errors import ConfigError
from transformer.tokens import EOS_ID, PAD_ID, UNK_ID

@pytest.fixture
def corpus(tmp_path):
  pairs = write_pairs(tmp_path / "corpus")
  return tmp_path / "corpus", pairs


def test_trains_with_project_ids_and_round_trips(corpus, tmp_path):
  folder, pairs = corpus
  config = files_config(folder)
  train = datasets.split_sources(config, tmp_path / "cache", ("train",))["train"]
  tok = tokenizer.get_or_train(config, tmp_path / "cache", train)
  assert tok.vocab_size == 200
  sp = spm.SentencePieceProcessor(model_file=tok.path)  # an independent load of the file
  assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (PAD_ID, EOS_ID, UNK_ID, -1)
  assert tok.sha256 == hashlib.sha256(open(tok.path, "rb").read()).hexdigest()
  for src, tgt in pairs[:20]:
    ids = tok.encode(tgt)
    assert ids == sp.encode(tgt) and EOS_ID not in ids and PAD_ID not in ids
    assert tok.decode(ids) == tgt
    # Decoding stops at the first EOS and drops padding, wherever it is.
    assert tok.decode([PAD_ID] + ids + [EOS_ID] + tok.encode(src) + [PAD_ID]) == tgt
  assert tok.decode([EOS_ID, 5, 6]) == ""


def test_vocabulary_is_cached_reused_and_deterministic(corpus, tmp_path, monkeypatch):
  folder, _ = corpus
  config = files_config(folder)
  first = tokenizer.get_or_train(
      config, tmp_path / "a", datasets.split_sources(config, tmp_path / "a", ("train",))["train"])
  # The same text and settings give the same file, byte for byte, in another cache folder.
  again = tokenizer.get_or_train(
      config, tmp_path / "b", datasets.split_sources(config, tmp_path / "b", ("train",))["train"])
  assert again.sha256 == first.sha256 and again.path != first.path

  def no_training(*args, **kwargs):
    raise AssertionError("the cached vocabulary should have been reused")

  monkeypatch.setattr(tokenizer, "train_vocabulary", no_training)
  # Reading a built vocabulary takes no lock (the cache folder may be read-only).
  monkeypatch.setattr(tokenizer.cache_lock, "building", no_training)
  cached = tokenizer.get_or_train(
      config, tmp_path / "a", datasets.split_sources(config, tmp_path / "a", ("train",))["train"])
  assert cached.path == first.path
  # evaluate.py's entry point finds the same file from the config alone.
  config.data.cache_dir = str(tmp_path / "a")
  assert tokenizer.load_tokenizer(config, tmp_path / "unused").path == first.path
  # A different size is a different vocabulary, not the cached one.
  config.model.vocab_size = 150
  with pytest.raises(ConfigError, match="no vocabulary at .*spm-bpe150"):
    tokenizer.load_tokenizer(config, tmp_path / "unused")


def test_given_vocab_path_is_used(corpus, tmp_path):
  folder, _ = corpus
  config = files_config(folder)
  trained = tokenizer.get_or_train(
      config, tmp_path / "a", datasets.split_sources(config, tmp_path / "a", ("train",))["train"])
  config.data.vocab_path = trained.path
  config.model.vocab_size = 999  # not used to train: the file is given
  tok = tokenizer.get_or_train(config, tmp_path / "b", None)
  assert tok.sha256 == trained.sha256 and not (tmp_path / "b").exists()


def test_check_matches(corpus, tmp_path):
  folder, _ = corpus
  config = files_config(folder)
  source = datasets.split_sources(config, tmp_path, ("train",))["train"]
  tok = tokenizer.get_or_train(config, tmp_path, source)
  tok.check_matches(tok.record())
  tok.check_matches({"path": "/elsewhere/spm.model", "sha256": tok.sha256})  # moved: fine
  config.model.vocab_size = 150
  other = tokenizer.get_or_train(config, tmp_path, source)
  with pytest.raises(ConfigError, match="vocabulary mismatch on resume.*vocab_path="):
    tok.check_matches(other.record())


def test_vocab_size_too_large_names_the_limit(corpus, tmp_path):
  folder, _ = corpus
  config = files_config(folder, vocab_size=5000)
  source = datasets.split_sources(config, tmp_path, ("train",))["train"]
  with pytest.raises(ConfigError, match=r"vocab_size=5000 is too large .* at most \d+ "
                     r"pieces.*all of its text was used"):
    tokenizer.get_or_train(config, tmp_path, source)
  assert not list(tmp_path.glob("*.model")) and not list(tmp_path.glob(".*tmp*"))


def test_unloadable_or_misconfigured_vocab_files(corpus, tmp_path):
  bad = tmp_path / "bad.model"
  bad.write_bytes(b"this is not a protobuf")
  with pytest.raises(ConfigError, match=f"{bad}: not a SentencePiece model"):
    tokenizer.Tokenizer(bad)
  with pytest.raises(ConfigError, match="missing.model: cannot read it"):
    tokenizer.Tokenizer(tmp_path / "missing.model")
  # A model with SentencePiece's default ids (unk=0, bos=1, eos=2) is refused.
  folder, _ = corpus
  spm.SentencePieceTrainer.train(input=str(folder / "train.en"), vocab_size=50,
                                 model_prefix=str(tmp_path / "default_ids"), minloglevel=2)
  with pytest.raises(ConfigError, match="needs pad_id=0, eos_id=1, unk_id=2"):
    tokenizer.Tokenizer(tmp_path / "default_ids.model")


def test_load_tokenizer_without_vocabulary_says_what_to_do(corpus, tmp_path):
  folder, _ = corpus
  with pytest.raises(ConfigError, match=r"no vocabulary at .*train first.*vocab_path .*\.model$"):
    tokenizer.load_tokenizer(files_config(folder), tmp_path / "run")
  # A run whose data folder is gone (a sweep root moved elsewhere): the override is named.
  config = files_config(folder)
  config.data.cache_dir = str(tmp_path / "moved" / "data")
  with pytest.raises(ConfigError, match=r"vocab_path .*; config.data.cache_dir=.*moved/data "
                                        r"does not exist: .* set --config.data.cache_dir"):
    tokenizer.load_tokenizer(config, tmp_path / "run")


def test_sample_pairs_is_a_seeded_uniform_subset_in_order():
  pairs = [(f"s{i}", f"t{i}") for i in range(100_000)]
  sample = tokenizer.sample_pairs(iter(pairs), 1000, seed=3)
  assert len(sample) == 1000 and len(set(sample)) == 1000
  index = [int(s[1:]) for s, _ in sample]
  assert index == sorted(index) and all(pairs[i] == p for i, p in zip(index, sample))
  assert sample == tokenizer.sample_pairs(iter(pairs), 1000, seed=3)
  assert sample != tokenizer.sample_pairs(iter(pairs), 1000, seed=4)
  # Uniform: each tenth of the corpus gets about a tenth of the sample (±5 sd of a binomial).
  per_tenth = [sum(1 for i in index if i // 10_000 == d) for d in range(10)]
  assert all(abs(c - 100) < 5 * 9.5 for c in per_tenth), per_tenth
  assert tokenizer.sample_pairs(iter(pairs[:10]), 1000, seed=0) == pairs[:10]


def test_runs_of_other_seeds_share_the_vocabulary_and_data_seed_makes_another(corpus, tmp_path):
  folder, _ = corpus
  config = files_config(folder)
  config.data.vocab_sample_sentences = 40  # a sample of the pairs: the seed picks which
  train = datasets.split_sources(config, tmp_path, ("train",))["train"]
  first = tokenizer.get_or_train(config, tmp_path, train)
  config.seed = 7  # the run's seed: another initialisation and batch order, same vocabulary
  assert tokenizer.vocab_cache_path(config, tmp_path, train.identity) == pathlib.Path(first.path)
  config.data.seed = 7
  other = tokenizer.get_or_train(config, tmp_path, train)
  assert other.path != first.path and other.sha256 != first.sha256
