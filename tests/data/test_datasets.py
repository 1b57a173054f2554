"""Corpus sources (aligned files, TFDS, synthetic) and the tokenized cache."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from configs import base
from tests.support import files_config, write_pairs
from transformer.data import datasets
from transformer.data import tokenizer


def test_files_are_read_line_by_line_in_order(tmp_path):
  # Only \n ends a line: U+2028 and a lone \r stay inside the sentence; \r\n loses its \r;
  # a leading byte-order mark is dropped; a missing final newline still ends the last line.
  (tmp_path / "train.en").write_bytes(
      "\ufeffone\r\ntwo\u2028halves\n\nfour\rstill four\nlast".encode())
  (tmp_path / "train.de").write_bytes("eins\nzwei\ndrei\nvier\nletzte\n".encode())
  config = files_config(tmp_path)
  source = datasets.split_sources(config, tmp_path / "cache", ("train",))["train"]
  assert source.check() == 5
  assert list(source.pairs()) == [("one", "eins"), ("two\u2028halves", "zwei"), ("", "drei"),
                                  ("four\rstill four", "vier"), ("last", "letzte")]


def test_explicit_paths_and_split_names(tmp_path):
  write_pairs(tmp_path / "a", n=5, prefix="train")
  write_pairs(tmp_path / "b", n=7, seed=1, prefix="newstest2013")
  config = files_config(tmp_path / "a")
  config.data.eval_split = "validation"
  config.data.valid_files = f"{tmp_path}/b/newstest2013.en,{tmp_path}/b/newstest2013.de"
  sources = datasets.split_sources(config, tmp_path / "cache", ("train", "validation"))
  assert sources["validation"].check() == 7
  assert sources["train"].paths[0] == (tmp_path / "a" / "train.en").resolve()
  config.data.valid_files = f"{tmp_path}/b/newstest2013.en"
  with pytest.raises(ValueError, match="valid_files=.*expected 'SOURCE_PATH,TARGET_PATH'"):
    datasets.split_sources(config, tmp_path / "cache", ("validation",))


def test_direction_comes_from_the_config(tmp_path):
  write_pairs(tmp_path, n=3)
  config = files_config(tmp_path)
  config.data.update(source_lang="de", target_lang="en")
  (pair,) = list(datasets.split_sources(config, tmp_path, ("train",))["train"].pairs())[:1]
  assert pair == (open(tmp_path / "train.de").readline().rstrip("\n"),
                  open(tmp_path / "train.en").readline().rstrip("\n"))


def test_different_line_counts_name_both_files(tmp_path):
  write_pairs(tmp_path, n=10)
  lines = (tmp_path / "train.de").read_text().splitlines()
  (tmp_path / "train.de").write_text("\n".join(lines[:-1]) + "\n")
  with pytest.raises(ValueError, match=r"train\.en has 10 lines but .*train\.de has 9"):
    datasets.split_sources(files_config(tmp_path), tmp_path / "cache", ("train",))
  assert not (tmp_path / "cache").exists()


def test_empty_files_are_named(tmp_path):
  for lang in ("en", "de"):
    (tmp_path / f"train.{lang}").write_text("")
  with pytest.raises(ValueError, match=r"train\.en and .*train\.de are empty: the train split"):
    datasets.split_sources(files_config(tmp_path), tmp_path / "cache", ("train",))


def test_identity_follows_content_not_path_or_time(tmp_path):
  """A copied or moved corpus (or workdir) keeps its vocabulary and token caches."""
  write_pairs(tmp_path / "a", n=20)
  copy = tmp_path / "b"
  copy.mkdir()
  for lang in ("en", "de"):  # a copy with new modification times
    (copy / f"train.{lang}").write_bytes((tmp_path / "a" / f"train.{lang}").read_bytes())
  identity = lambda folder: datasets.split_sources(
      files_config(folder), tmp_path / "cache", ("train",))["train"].identity
  assert identity(tmp_path / "a") == identity(copy)
  with open(copy / "train.de", "a", encoding="utf-8") as f:
    f.write("noch ein Satz\n")
  with open(copy / "train.en", "a", encoding="utf-8") as f:
    f.write("one more sentence\n")
  assert identity(tmp_path / "a") != identity(copy)


def test_invalid_utf8_names_file_and_line(tmp_path):
  write_pairs(tmp_path, n=10)
  lines = (tmp_path / "train.de").read_bytes().split(b"\n")
  lines[6] = b"gr\xfc\xdfe aus K\xf6ln"  # Latin-1, not UTF-8
  (tmp_path / "train.de").write_bytes(b"\n".join(lines))
  with pytest.raises(ValueError, match=r"train\.de:7: invalid UTF-8 \(byte 0xfc at column 3"):
    datasets.split_sources(files_config(tmp_path), tmp_path / "cache", ("train",))


def test_missing_files_are_named(tmp_path):
  write_pairs(tmp_path, n=3)
  with pytest.raises(ValueError, match=r"files_dir=.*valid\.en does not exist"):
    datasets.split_sources(files_config(tmp_path), tmp_path, ("train", "validation"))
  config = files_config(tmp_path)
  config.data.files_dir = ""
  with pytest.raises(ValueError, match="needs config.data.files_dir"):
    datasets.split_sources(config, tmp_path, ("train",))


def test_an_unknown_dataset_is_refused_not_read_as_files(tmp_path):
  write_pairs(tmp_path, n=3)
  config = files_config(tmp_path)
  config.data.dataset = "file"
  with pytest.raises(ValueError, match="config.data.dataset='file' is not 'tfds', 'files' or"):
    datasets.split_sources(config, tmp_path, ("train",))


def test_tfds_not_prepared_fails_fast_without_downloading(tmp_path, monkeypatch):
  tfds = pytest.importorskip("tensorflow_datasets", reason="the tfds extra is not installed")

  def no_download(*args, **kwargs):
    raise AssertionError("download_and_prepare must not be called")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", no_download)
  config = base.get_config()
  config.data.tfds_data_dir = str(tmp_path / "tfds")
  with pytest.raises(ValueError) as e:
    datasets.split_sources(config, tmp_path, ("train",))
  message = str(e.value)
  assert "\n" not in message
  assert "wmt14_translate/de-en is not prepared" in message
  assert f"tfds build wmt14_translate/de-en --data_dir={tmp_path / 'tfds'}" in message
  assert "--config.data.dataset=files" in message
  config.data.tfds_name = "no_such_dataset_xyz"
  with pytest.raises(ValueError, match="tfds_name='no_such_dataset_xyz'"):
    datasets.split_sources(config, tmp_path, ("train",))


@pytest.mark.parametrize("missing", ["tensorflow", "tensorflow_datasets"])
def test_tfds_without_its_extra_is_one_line_naming_the_extra(tmp_path, monkeypatch, missing):
  monkeypatch.setitem(sys.modules, missing, None)  # as if not installed
  with pytest.raises(ValueError, match=r"^config.data.dataset='tfds' .*pip install -e '\.\[tfds\]'"):
    datasets.split_sources(base.get_config(), tmp_path, ("train",))


def test_tfds_pairs_follow_source_and_target_lang(tmp_path, monkeypatch):
  tfds = pytest.importorskip("tensorflow_datasets", reason="the tfds extra is not installed")

  config = base.get_config()  # wmt14_translate/de-en, en→de; TFDS lists the keys as (de, en)
  config.data.tfds_data_dir = str(tmp_path / "tfds")
  with tfds.testing.mock_data(num_examples=6):
    monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda self: True)
    sources = datasets.split_sources(config, tmp_path, ("train", "validation"))
    builder = tfds.builder("wmt14_translate/de-en", data_dir=config.data.tfds_data_dir)
    reference = [(ex["en"].decode(), ex["de"].decode()) for ex in
                 tfds.as_numpy(builder.as_dataset(split="train", shuffle_files=False))]
    assert list(sources["train"].pairs()) == reference and len(reference) == 6
    assert sources["train"].identity["langs"] == ["en", "de"]
    config.data.target_lang = "fr"
    with pytest.raises(ValueError, match="target_lang='fr' is not a language of"):
      datasets.split_sources(config, tmp_path, ("train",))


def test_tokenized_cache_is_written_once_and_matches_the_tokenizer(tmp_path, monkeypatch):
  pairs = write_pairs(tmp_path / "corpus", n=50)
  config = files_config(tmp_path / "corpus")
  source = datasets.split_sources(config, tmp_path / "cache", ("train",))["train"]
  tok = tokenizer.get_or_train(config, tmp_path / "cache", source)
  split = datasets.tokenize(source, tok, tmp_path / "cache")
  assert len(split) == 50
  for i, (s, t) in enumerate(pairs):
    assert split.ids(i) == (tok.encode(s), tok.encode(t))
  assert isinstance(split.src_tokens, np.memmap)
  folder = datasets.tokenized_cache_path(source, tok, tmp_path / "cache")
  meta = json.loads((folder / "meta.json").read_text())
  assert meta["pairs"] == 50 and meta["vocab_sha256"] == tok.sha256

  def no_encoding(*args, **kwargs):
    raise AssertionError("the cache should have been reused")

  monkeypatch.setattr(tokenizer.Tokenizer, "encode_batch", no_encoding)
  again = datasets.tokenize(source, tok, tmp_path / "cache")
  assert np.array_equal(again.tgt_lens, split.tgt_lens)
  # A changed corpus is a new cache, not a stale one.
  for path, line in zip(source.paths, ("one more", "noch einer")):
    with open(path, "a", encoding="utf-8") as f:
      f.write(line + "\n")
  changed = datasets.split_sources(config, tmp_path / "cache", ("train",))["train"]
  assert datasets.tokenized_cache_path(changed, tok, tmp_path / "cache") != folder


def test_interrupted_tokenization_leaves_nothing(tmp_path, monkeypatch):
  write_pairs(tmp_path / "corpus", n=2500)
  config = files_config(tmp_path / "corpus")
  source = datasets.split_sources(config, tmp_path / "cache", ("train",))["train"]
  tok = tokenizer.get_or_train(config, tmp_path / "cache", source)
  monkeypatch.setattr(datasets, "_CHUNK_PAIRS", 1000)
  calls = []
  encode = tokenizer.Tokenizer.encode_batch

  def fail_later(self, texts, num_threads=-1, side="source"):
    calls.append(len(texts))
    if len(calls) == 3:
      raise KeyboardInterrupt
    return encode(self, texts, num_threads, side)

  monkeypatch.setattr(tokenizer.Tokenizer, "encode_batch", fail_later)
  with pytest.raises(KeyboardInterrupt):
    datasets.tokenize(source, tok, tmp_path / "cache")
  left = sorted(p.name for p in (tmp_path / "cache").iterdir() if p.suffix != ".lock")
  assert left == [os.path.basename(tok.path)]  # and the entries' (empty) lock files


def test_synthetic_corpus_is_read_like_files(tmp_path):
  config = base.get_config()
  config.data.dataset = "synthetic"
  config.seed, config.data.seed = 5, 2  # the corpus is the data seed's, not the run's
  config.data.synthetic_train_pairs = 300
  sources = datasets.split_sources(config, tmp_path, ("train", "validation", "test"))
  folder = tmp_path / "synthetic-seed2-300"
  assert len(list(sources["train"].pairs())) == 300
  assert len(list(sources["test"].pairs())) == 500
  assert sources["train"].paths == ((folder / "train.src").resolve(),
                                    (folder / "train.tgt").resolve())
  assert sources["test"].paths[1] == (folder / "test.tgt").resolve()
  first = next(sources["validation"].pairs())
  assert first[0] == (folder / "valid.src").read_text(encoding="utf-8").split("\n")[0]


_SHARED_CACHE_RUN = """
import sys
import time
from absl import logging
from tests.support import files_config
from transformer.data import datasets, tokenizer
logging.set_verbosity(logging.INFO)
# Slow builds, so that both processes look for each entry while the other builds it.
for module, name in ((tokenizer, "train_vocabulary"), (datasets, "_tokenize_into")):
  def slow(*args, _build=getattr(module, name), **kwargs):
    time.sleep(2)
    return _build(*args, **kwargs)
  setattr(module, name, slow)
config = files_config(sys.argv[1])
source = datasets.split_sources(config, sys.argv[2], ("train",))["train"]
tok = tokenizer.get_or_train(config, sys.argv[2], source)
split = datasets.tokenize(source, tok, sys.argv[2])
print(tok.sha256, len(split.src_lens))
"""


def test_processes_sharing_a_cache_build_each_entry_once(tmp_path):
  """Two processes started together on one cache folder: one trains the vocabulary and
  tokenizes, the other waits and reads the same entries."""
  write_pairs(tmp_path / "corpus", n=2500)
  repo = pathlib.Path(__file__).resolve().parents[2]
  runs = [subprocess.Popen([sys.executable, "-c", _SHARED_CACHE_RUN, str(tmp_path / "corpus"),
                            str(tmp_path / "cache")], cwd=repo, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
          for _ in range(2)]
  outs = [run.communicate(timeout=120) for run in runs]
  assert all(run.returncode == 0 for run in runs), [err[-2000:] for _, err in outs]
  assert outs[0][0] == outs[1][0]  # the same vocabulary
  logs = "".join(err for _, err in outs)
  assert logs.count("training a bpe vocabulary") == 1
  assert logs.count("train: tokenized 2500 pairs") == 1

