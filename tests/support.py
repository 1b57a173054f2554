"""Tiny configs and data shared by several test modules (not a test module itself)."""

from __future__ import annotations

import importlib.machinery
import json
import os
import pathlib
import random
import sys
import types

import ml_collections
import numpy as np

from configs import base, tatoeba_small

ROWS = 16  # global batch rows of `global_batch`
VOCAB = 64


def initial_params(model, seed: int = 0):
  """`init_params(model, jax.random.key(seed))`, run operation by operation rather than
  jitted (only the draws: `init_params` never runs the forward pass). A jitted init is one
  program per architecture, and compiling it takes 0.6-1.9 CPU seconds (most of it in the
  random draws, a threefry per parameter); run op by op, each operation's program is compiled
  once per shape in a process and serves every later architecture, which then takes 0.1-0.2 s.
  The values are at most 1 ulp from the jitted init's (measured; the test allows rtol 1e-6:
  XLA fuses the normal draws' arithmetic differently)."""
  import jax

  from transformer.model import transformer as model_lib

  return model_lib.init_params(model, jax.random.key(seed))


def tiny_config(parallelism: str = "jit", mesh=(-1, 1, 1)) -> ml_collections.ConfigDict:
  """A one-layer model of width 32 over a 64-token vocabulary, no dropout."""
  config = base.get_config()
  config.model.update(vocab_size=VOCAB, d_model=32, d_ff=64, num_heads=4, d_k=8, d_v=8,
                      num_layers=1, max_len=32, dropout_rate=0.0)
  config.data.max_source_len = config.data.max_target_len = 32
  config.warmup_steps = 10
  # Adam divides each gradient element by its own running scale: with the paper's eps = 1e-9,
  # an element whose gradient is pure rounding noise takes a learning-rate-sized step in a
  # random direction, so runs that differ only in summation order drift apart elementwise.
  # A larger eps keeps the comparisons about the parallelism, not about that noise.
  config.adam_eps = 1e-6
  config.parallelism = parallelism
  config.mesh.update(dict(zip(("data", "fsdp", "tensor"), mesh)))
  return config


def in_memory_config(steps: int, parallelism: str = "jit", mesh=(-1, 1, 1)):
  """`tiny_config` for `in_memory_data`, trained to `steps` with a checkpoint at the end and
  the loss of every step logged; no dev split, vocabulary or BLEU."""
  config = tiny_config(parallelism, mesh)
  config.num_train_steps = config.checkpoint_every_steps = steps
  config.log_every_steps = 1
  config.eval_every_steps = steps
  config.keep_checkpoints = 2
  config.bleu_every_steps = 0
  config.bleu_at_end = False
  config.data.update(eval_split="", test_split="")
  return config


def global_batch(step: int, rows: int = ROWS) -> dict[str, np.ndarray]:
  """The batch of global step `step`: random tokens with random padding, the same everywhere."""
  rng = np.random.default_rng(1000 + step)
  inputs = rng.integers(3, VOCAB, (rows, 12)).astype(np.int32)
  targets = rng.integers(3, VOCAB, (rows, 10)).astype(np.int32)
  inputs[np.arange(12) >= rng.integers(4, 13, (rows, 1))] = 0
  targets[np.arange(10) >= rng.integers(3, 11, (rows, 1))] = 0
  return {"inputs": inputs, "targets": targets}


class StepStream:
  """This process's rows of `global_batch(step)`, step after step; its position is saved in
  checkpoints like the input pipeline's iterator."""

  def __init__(self, rows: slice = slice(None)):
    self.rows, self.step = rows, 0

  def __next__(self):
    batch = {k: v[self.rows] for k, v in global_batch(self.step).items()}
    self.step += 1
    return batch

  def get_state(self) -> dict:
    return {"next_index": self.step}

  def set_state(self, state: dict) -> None:
    self.step = int(state["next_index"])


def in_memory_data(rows: slice = slice(None)):
  """What `train_lib.train_and_evaluate(data=...)` needs, from `StepStream`: no vocabulary,
  no dev split."""
  return types.SimpleNamespace(tokenizer=None, train=StepStream(rows), eval_batches=None,
                               splits={})


# What the tests that read real text need, and how a run points them at it.
SHARED_DATA_FILES = (*(f"tatoeba-deu-eng/{name}" for name in tatoeba_small.TATOEBA_FILES),
                     *(f"wmt-newstest-ende/newstest{year}.{lang}" for year in (2013, 2014)
                       for lang in ("en", "de")))
NEEDS_SHARED_DATA = "needs the real text of ../shared/data (Tatoeba deu-eng, newstest2013/14)"
POINT_AT_SHARED_DATA = f"set {tatoeba_small.SHARED_DATA_ENV}=/path/to/data to run it"
# Set by CI (.ci/run): there, tests that need the data fail instead of being skipped.
REQUIRE_SHARED_DATA_ENV = "TRANSFORMER_REQUIRE_SHARED_DATA"


def shared_data_or_skip() -> pathlib.Path:
  """`tatoeba_small.shared_data_dir()` when it holds every file of `SHARED_DATA_FILES`;
  otherwise skips the calling test with one line saying what it needs, or fails it when
  TRANSFORMER_REQUIRE_SHARED_DATA=1 (so CI cannot pass by skipping them)."""
  import pytest  # here: train.py subprocesses import this module (tests/tiny_config.py)

  folder = tatoeba_small.shared_data_dir()
  missing = [name for name in SHARED_DATA_FILES if not (folder / name).is_file()]
  if not missing:
    return folder
  message = f"{NEEDS_SHARED_DATA}: {folder / missing[0]} is missing; {POINT_AT_SHARED_DATA}"
  if os.environ.get(REQUIRE_SHARED_DATA_ENV, "") not in ("", "0"):
    pytest.fail(f"{message} ({REQUIRE_SHARED_DATA_ENV} is set: a failure, not a skip)",
                pytrace=False)
  pytest.skip(message)


class _PathFinderWithout(importlib.machinery.PathFinder):
  """The finder of the modules on `sys.path`, blind to the top-level packages `names`."""

  def __init__(self, *names: str):
    self.names = frozenset(names)

  def find_spec(self, fullname, path=None, target=None):
    if fullname.partition(".")[0] in self.names:
      return None
    return super().find_spec(fullname, path, target)


def make_unimportable(*names: str) -> None:
  """From now on in this process, the top-level packages `names` are not found, as in an
  install without them: `import` raises ModuleNotFoundError and `importlib.util.find_spec`
  returns None (as libraries probe for TensorFlow). Call it before anything imports them: a
  module already imported stays."""
  sys.meta_path[sys.meta_path.index(importlib.machinery.PathFinder)] = _PathFinderWithout(*names)


def _tiny(config: ml_collections.ConfigDict, steps: int) -> ml_collections.ConfigDict:
  """`config` shrunk so a few hundred steps take seconds on 2 cores."""
  config.model.update(vocab_size=1000, d_model=64, d_ff=128, num_heads=4, d_k=16, d_v=16,
                      num_layers=1)
  config.data.tokens_per_batch = 512
  config.data.max_source_len = config.data.max_target_len = 24
  config.data.bucket_boundaries = (12, 24)  # two compiled shapes
  config.data.vocab_sample_sentences = 4000
  config.num_train_steps = steps
  config.checkpoint_every_steps = steps
  config.eval_every_steps = steps
  config.num_eval_batches = 2
  config.log_every_steps = 25
  config.warmup_steps = 50
  config.bleu_at_end = False
  return config


def tatoeba_tiny(shared_data: pathlib.Path, steps: int) -> ml_collections.ConfigDict:
  """configs/tatoeba_small.py shrunk so a few hundred steps take seconds on 2 cores."""
  config = tatoeba_small.get_config()
  config.data.files_dir = str(shared_data / tatoeba_small.TATOEBA_FOLDER)
  return _tiny(config, steps)


def synthetic_tiny(steps: int) -> ml_collections.ConfigDict:
  """The model of `tatoeba_tiny` on the built-in synthetic pair (transformer/data/synthetic/),
  for tests about training mechanics that need no real text."""
  config = base.get_config()
  config.data.update(dataset="synthetic", source_lang="src", target_lang="tgt")
  # A tenth of the demo's pairs: drawing them is pure Python (8 CPU s for 50,000); the
  # vocabulary samples 4,000 sentences of the 10,000 either way.
  config.data.synthetic_train_pairs = 5_000
  config.model.max_len = 256  # as configs/tatoeba_small.py
  config.bleu_every_steps = 0
  config.num_average = 1
  config.decode.batch_size = 128
  return _tiny(config, steps)


def logged(workdir, key: str = "train/loss") -> list[tuple[int, float]]:
  """(step, value) of every line of `workdir/metrics.jsonl` that has `key`."""
  lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return [(r["step"], r[key]) for r in map(json.loads, lines) if key in r]


# A toy English/German corpus: random word sequences and their word-by-word reversal.
EN = ("the a one cat dog bird house tree car river runs sees eats likes big small red blue "
      "green old new over under with and near quickly slowly today yesterday").split()
DE = ("der die das eine Katze Hund Vogel Haus Baum Auto Fluss läuft sieht isst mag groß klein "
      "rot blau grün alt neu über unter mit und nahe schnell langsam heute gestern").split()


def write_pairs(folder, n=600, seed=0, prefix="train"):
  """Writes `n` aligned pairs to `folder/prefix.{en,de}`; returns them."""
  rng = random.Random(seed)
  src, tgt = [], []
  for _ in range(n):
    idx = [rng.randrange(len(EN)) for _ in range(rng.randint(1, 30))]
    src.append(" ".join(EN[j] for j in idx))
    tgt.append(" ".join(DE[j] for j in reversed(idx)))
  folder.mkdir(parents=True, exist_ok=True)
  (folder / f"{prefix}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
  (folder / f"{prefix}.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")
  return list(zip(src, tgt))


def files_config(folder, vocab_size=200) -> ml_collections.ConfigDict:
  """base.py reading `folder`'s train.en/train.de, no dev or test split."""
  config = base.get_config()
  config.model.vocab_size = vocab_size
  config.data.update(dataset="files", files_dir=str(folder), eval_split="", test_split="")
  return config
