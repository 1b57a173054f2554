"""Where the sentence pairs come from, and their tokenized cache on disk.

Three kinds of corpus give the same thing downstream, a `Source` per split that yields
`(source text, target text)` pairs in corpus order:
  * `dataset='tfds'`: a prepared TFDS translation dataset (`wmt14_translate/de-en`, …), with
    the direction chosen by `source_lang`/`target_lang`, never inherited from TFDS' key order
    (TensorFlow and TFDS come with the `tfds` extra and are imported only here);
  * `dataset='files'`: aligned UTF-8 text files, one sentence per line — `train.en`/`train.de`,
    `valid.*`, `test.*` in `files_dir`, or explicit `train_files`/`valid_files`/`test_files`;
  * `dataset='synthetic'`: `transformer.data.synthetic` writes such files into the cache folder.

Each split is tokenized once and cached under the cache folder as flat token arrays (the
`.bin` files, memory-mapped) with per-pair lengths, so later epochs and re-runs read ids
straight from disk and each process touches only the pages of its own pairs. Caches are
written to a temporary folder and renamed, so an interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import itertools
import json
import os
import pathlib
import shutil
from typing import Iterator

import numpy as np
from absl import logging

from transformer.data import textio
from transformer.data import cache_lock
from transformer.errors import ConfigError

# File prefixes of the splits in a `files_dir`, and the config key of explicit paths.
_FILE_PREFIX = {"train": "train", "validation": "valid", "test": "test"}
_CHUNK_PAIRS = 20_000  # pairs tokenized per SentencePiece call
_CACHE_VERSION = 1


def cache_dir(config, workdir: str | os.PathLike) -> pathlib.Path:
  """`config.data.cache_dir`, or `WORKDIR/data`: vocabulary, token caches, synthetic corpus."""
  return pathlib.Path(config.data.cache_dir or pathlib.Path(workdir) / "data").resolve()


def _sha256(path: pathlib.Path) -> str:
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


class FileSource:
  """One split as two aligned text files."""

  def __init__(self, split: str, source_path: str | os.PathLike, target_path: str | os.PathLike,
               key: str):
    self.split = split
    self.paths = (pathlib.Path(source_path).resolve(), pathlib.Path(target_path).resolve())
    for p in self.paths:
      if not p.is_file():
        raise ConfigError(f"{key}: {p} does not exist")
    self.description = f"{self.paths[0]} + {self.paths[1]}"
    # The files' contents, not their paths or times: a changed file gets a new cache, and a
    # workdir or corpus that is copied or moved keeps its vocabulary and token caches.
    self.identity = {"kind": "files", "sha256": [_sha256(p) for p in self.paths]}

  def check(self) -> int:
    """Validates UTF-8 and alignment before anything is written; returns the pair count."""
    counts = [textio.check_lines(p) for p in self.paths]
    if not any(counts):
      raise ConfigError(f"{self.paths[0]} and {self.paths[1]} are empty: the {self.split} "
                        "split needs sentence pairs")
    if counts[0] != counts[1]:
      raise ConfigError(f"{self.paths[0]} has {counts[0]} lines but {self.paths[1]} has "
                       f"{counts[1]}: the files of a split must be aligned line by line")
    return counts[0]

  def pairs(self) -> Iterator[tuple[str, str]]:
    # newline="\n": lines end only at \n, never at U+2028 or a stray \r inside a sentence.
    # utf-8-sig drops a byte-order mark at the start of a file, nowhere else.
    with open(self.paths[0], encoding="utf-8-sig", newline="\n") as fs, \
         open(self.paths[1], encoding="utf-8-sig", newline="\n") as ft:
      for s, t in zip(fs, ft):
        yield textio.strip_newline(s), textio.strip_newline(t)


class TfdsSource:
  """One split of a prepared TFDS translation dataset, in the configured direction."""

  def __init__(self, builder, split: str, source_lang: str, target_lang: str):
    self.builder, self.split, self.langs = builder, split, (source_lang, target_lang)
    self.description = f"TFDS {builder.info.full_name} [{split}] {source_lang}→{target_lang}"
    self.identity = {"kind": "tfds", "name": builder.info.full_name, "split": split,
                     "langs": [source_lang, target_lang]}  # full_name holds the version

  def check(self) -> int:
    splits = self.builder.info.splits
    if splits and self.split not in splits:
      raise ConfigError(f"TFDS {self.builder.info.full_name} has no split {self.split!r} "
                       f"(it has {', '.join(splits)}); set config.data.eval_split/test_split")
    return splits[self.split].num_examples if splits else -1

  def pairs(self) -> Iterator[tuple[str, str]]:
    tfds = _import_tfds()
    ds = self.builder.as_dataset(split=self.split, shuffle_files=False)
    src, tgt = self.langs
    for ex in tfds.as_numpy(ds):
      yield ex[src].decode("utf-8"), ex[tgt].decode("utf-8")


def _import_tfds():
  """tensorflow_datasets, or a one-line error naming the extra that installs it."""
  if importlib.util.find_spec("tensorflow") is None:
    raise ConfigError("config.data.dataset='tfds' needs TensorFlow and TensorFlow Datasets, "
                      "which this install lacks: pip install -e '.[tfds]'; or train on local "
                      "aligned text files with --config.data.dataset=files")
  try:
    import tensorflow_datasets as tfds
  except ImportError as e:
    raise ConfigError(f"config.data.dataset='tfds' cannot import tensorflow_datasets ({e}): "
                      "pip install -e '.[tfds]'") from None
  return tfds


def _tfds_builder(config):
  """The TFDS builder; fails fast (no download attempt) when the dataset is not prepared."""
  tfds = _import_tfds()
  data = config.data
  try:
    builder = tfds.builder(data.tfds_name, data_dir=data.tfds_data_dir or None)
  except Exception as e:  # DatasetNotFoundError, a bad config name, …
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ConfigError(f"config.data.tfds_name={data.tfds_name!r}: {first}") from None
  if not builder.is_prepared():
    root = data.tfds_data_dir or str(builder.data_dir_root)
    raise ConfigError(
        f"TFDS dataset {data.tfds_name} is not prepared in {root} and this run downloads "
        f"nothing. Prepare it once (needs network and disk): `tfds build {data.tfds_name} "
        f"--data_dir={root}`, then pass --config.data.tfds_data_dir={root}; or train on local "
        "aligned files: --config.data.dataset=files --config.data.files_dir=DIR holding "
        f"train.{data.source_lang}/train.{data.target_lang}, valid.*, test.*")
  languages = tuple(getattr(builder.info.features, "languages", ()) or ())
  for key in ("source_lang", "target_lang"):
    if languages and data[key] not in languages:
      raise ConfigError(f"config.data.{key}={data[key]!r} is not a language of "
                       f"{data.tfds_name} (it has {', '.join(languages)})")
  return builder


def split_sources(config, cache: str | os.PathLike, splits=("train", "validation", "test"), *,
                  check: bool = True) -> dict[str, FileSource | TfdsSource]:
  """A `Source` for each split name in `splits` ('train' and `config.data.*_split` names).

  Args:
    config: the experiment config (`config.data` is read).
    cache: the data cache folder (the synthetic corpus is written there).
    splits: split names; '' entries are skipped.
    check: validate the files (UTF-8, equal line counts) / TFDS splits now.

  Returns:
    split name -> source.
  """
  data = config.data
  splits = [s for s in splits if s]
  match data.dataset:
    case "tfds":
      builder = _tfds_builder(config)
      sources = {s: TfdsSource(builder, s, data.source_lang, data.target_lang) for s in splits}
    case "files" | "synthetic":
      sources = dict(zip(splits, _file_sources(config, cache, splits)))
    case _:
      raise ConfigError(f"config.data.dataset={data.dataset!r} is not 'tfds', 'files' or "
                        "'synthetic'")
  if check:
    for source in sources.values():
      source.check()
  return sources


def _file_sources(config, cache: str | os.PathLike, splits: list[str]) -> list[FileSource]:
  """The `FileSource` of each split of `config.data.dataset` 'files' or 'synthetic' (written
  into `cache` first)."""
  data = config.data
  if data.dataset == "synthetic":
    from transformer.data import synthetic

    folder = pathlib.Path(cache) / f"synthetic-seed{data.seed}-{data.synthetic_train_pairs}"
    write = functools.partial(synthetic.write_corpus, folder, seed=data.seed,
                              num_train=data.synthetic_train_pairs)
    if (folder / synthetic.MANIFEST).exists():  # written: read without a lock
      write()  # checks the manifest, writes nothing
    else:
      with cache_lock.building(folder):  # once for the processes sharing the cache
        write()
    folder_key, langs = f"synthetic corpus {folder}", ("src", "tgt")
  else:
    folder = pathlib.Path(data.files_dir) if data.files_dir else None
    folder_key, langs = f"config.data.files_dir={data.files_dir}", (data.source_lang,
                                                                    data.target_lang)
  sources = []
  for s in splits:
    prefix = _FILE_PREFIX.get(s, s)
    explicit = data.get(f"{prefix}_files", "") if data.dataset == "files" else ""
    if explicit:
      paths = [p.strip() for p in explicit.split(",")]
      if len(paths) != 2:
        raise ConfigError(f"config.data.{prefix}_files={explicit!r}: expected "
                          "'SOURCE_PATH,TARGET_PATH'")
      sources.append(FileSource(s, *paths, key=f"config.data.{prefix}_files"))
    elif folder is None:
      raise ConfigError(f"dataset='files' needs config.data.files_dir (a folder with "
                        f"{prefix}.{langs[0]} and {prefix}.{langs[1]}) or "
                        f"config.data.{prefix}_files")
    else:
      sources.append(FileSource(s, folder / f"{prefix}.{langs[0]}",
                                folder / f"{prefix}.{langs[1]}", key=folder_key))
  return sources


@dataclasses.dataclass(frozen=True)
class TokenizedSplit:
  """A tokenized split: ids of pair i, side x, are `x_tokens[x_starts[i]:][:x_lens[i]]`.

  Lengths exclude the EOS that batches append. Token arrays are memory-mapped.
  """

  src_tokens: np.ndarray  # [sum of src_lens], uint16 or int32
  src_starts: np.ndarray  # [N] int64
  src_lens: np.ndarray  # [N] int32
  tgt_tokens: np.ndarray
  tgt_starts: np.ndarray
  tgt_lens: np.ndarray

  def __len__(self) -> int:
    return len(self.src_lens)

  def ids(self, i: int) -> tuple[list[int], list[int]]:
    """The (source, target) ids of pair `i`, without EOS."""
    s, t = self.src_starts[i], self.tgt_starts[i]
    return (self.src_tokens[s:s + self.src_lens[i]].tolist(),
            self.tgt_tokens[t:t + self.tgt_lens[i]].tolist())


def _load_side(folder: pathlib.Path, side: str, dtype: str):
  lens = np.load(folder / f"{side}_lens.npy")
  starts = np.zeros(len(lens), np.int64)
  np.cumsum(lens[:-1], out=starts[1:])
  path = folder / f"{side}.bin"
  tokens = (np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size
            else np.zeros(0, dtype))
  return tokens, starts, lens


def load_tokenized(folder: str | os.PathLike) -> TokenizedSplit:
  folder = pathlib.Path(folder)
  meta = json.loads((folder / "meta.json").read_text())
  return TokenizedSplit(*_load_side(folder, "src", meta["dtype"]),
                        *_load_side(folder, "tgt", meta["dtype"]))


def tokenized_cache_path(source, tokenizer, cache: str | os.PathLike) -> pathlib.Path:
  key = dict(identity=source.identity, vocab=tokenizer.sha256, version=_CACHE_VERSION)
  tag = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
  return pathlib.Path(cache) / f"tokens-{source.split}-{tag}"


def tokenize(source, tokenizer, cache: str | os.PathLike, *, build: bool = True
             ) -> TokenizedSplit:
  """The tokenized split from the cache, tokenizing (once) when `build` and it is missing."""
  folder = tokenized_cache_path(source, tokenizer, cache)
  if (folder / "meta.json").exists():
    logging.info("%s: tokenized cache %s", source.split, folder)
    return load_tokenized(folder)
  if not build:
    raise ConfigError(f"tokenized cache {folder} is missing on this process: the cache folder "
                     "(config.data.cache_dir, default WORKDIR/data) must be shared by all "
                     "processes")
  with cache_lock.building(folder):  # processes sharing the cache tokenize it once
    if (folder / "meta.json").exists():
      logging.info("%s: tokenized cache %s (built by another process)", source.split, folder)
      return load_tokenized(folder)
    return _tokenize_into(folder, source, tokenizer)


def _tokenize_into(folder: pathlib.Path, source, tokenizer) -> TokenizedSplit:
  """Tokenizes `source` into the cache entry `folder` (under a temporary name, then renamed)."""
  dtype = "uint16" if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else "int32"
  tmp = folder.with_name(f".{folder.name}.tmp{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir(parents=True)
  lens = {"src": [], "tgt": []}
  try:
    with open(tmp / "src.bin", "wb") as fs, open(tmp / "tgt.bin", "wb") as ft:
      pairs = source.pairs()
      while chunk := list(itertools.islice(pairs, _CHUNK_PAIRS)):
        for side, f, texts in (("src", fs, [p[0] for p in chunk]),
                               ("tgt", ft, [p[1] for p in chunk])):
          ids = tokenizer.encode_batch(texts, side="target" if side == "tgt" else "source")
          n = np.fromiter(map(len, ids), np.int32, count=len(ids))
          f.write(np.fromiter(itertools.chain.from_iterable(ids), dtype,
                              count=int(n.sum())).tobytes())
          lens[side].append(n)
    for side in lens:
      np.save(tmp / f"{side}_lens.npy", np.concatenate(lens[side] or [np.zeros(0, np.int32)]))
    num = sum(len(x) for x in lens["src"])
    (tmp / "meta.json").write_text(json.dumps(dict(
        dtype=dtype, pairs=num, identity=source.identity, vocab=tokenizer.path,
        vocab_sha256=tokenizer.sha256, version=_CACHE_VERSION), indent=1))
    for path in tmp.iterdir():  # on disk before the rename: never an entry cut short
      with open(path, "rb") as f:
        os.fsync(f.fileno())
    try:
      os.replace(tmp, folder)
    except OSError:  # another process finished the same cache first; it is identical
      shutil.rmtree(tmp, ignore_errors=True)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  logging.info("%s: tokenized %d pairs of %s into %s", source.split, num, source.description,
               folder)
  return load_tokenized(folder)
