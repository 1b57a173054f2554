"""A small Transformer on real German–English text, English→German, on a laptop CPU.

Reproduces nothing from the paper: it exercises the whole real-data path (aligned text files,
a shared 8k BPE vocabulary, length-bucketed token batches, checkpoints, dev loss, BLEU) on
the Tatoeba sentence pairs in ../shared/data/tatoeba-deu-eng (15.6k training pairs of short
everyday sentences; the project ships no corpus, the folder is read in place).
Model: 2+2 layers, d_model 256, 5.7M parameters. Batches of 3,072 token slots per side in
10 length-bucket shapes, ~74 steps per epoch; 400 steps are ~5 epochs. Expect a low BLEU: the
corpus is tiny (docs/data.md has a measured run).

  python train.py --config=configs/tatoeba_small.py --workdir=runs/tatoeba_small

The data folder is $TRANSFORMER_SHARED_DATA when set, else ../shared/data beside the checkout
(`shared_data_dir`, which the tests and benchmarks use too). Point this config at another copy
of the pairs with --config.data.files_dir=DIR (DIR holding train.en/train.de, valid.*,
test.*). Without either, `get_config` raises a one-line ConfigError saying where to get them.
"""

import os
import pathlib
import sys

from configs import base
from transformer.errors import ConfigError

SHARED_DATA_ENV = "TRANSFORMER_SHARED_DATA"
TATOEBA_FOLDER = "tatoeba-deu-eng"
TATOEBA_FILES = tuple(f"{split}.{lang}" for split in ("train", "valid", "test")
                      for lang in ("en", "de"))
# Flags that give the run a corpus of its own. config_flags applies `--config.K=V` only after
# get_config returns, so get_config reads them from the command line to know not to insist on
# the default folder.
_CORPUS_FLAGS = ("--config.data.files_dir", "--config.data.train_files", "--config.data.dataset")


def shared_data_dir() -> pathlib.Path:
  """The folder of real text (Tatoeba, newstest) read in place: $TRANSFORMER_SHARED_DATA when
  set, else ../shared/data beside the checkout (the repository root is this file's parent's
  parent). It may not exist; callers say what they need when it does not."""
  given = os.environ.get(SHARED_DATA_ENV, "").strip()
  if given:
    return pathlib.Path(given).expanduser().resolve()
  return pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"


def _corpus_on_command_line() -> bool:
  return any(arg.split("=", 1)[0] in _CORPUS_FLAGS for arg in sys.argv[1:])


def _check_corpus(folder: pathlib.Path) -> None:
  """Raises a one-line ConfigError when `folder` lacks one of `TATOEBA_FILES`."""
  missing = [name for name in TATOEBA_FILES if not (folder / name).is_file()]
  if not missing:
    return
  found = f"{folder} does not exist" if not folder.is_dir() else (
      f"{folder} lacks {', '.join(missing)}")
  raise ConfigError(
      f"configs/tatoeba_small.py reads the Tatoeba German-English pairs, but {found}: get the "
      "deu-eng pairs of the Tatoeba Translation Challenge (github.com/Helsinki-NLP/"
      "Tatoeba-Challenge, release v2021-08-07, CC-BY 2.0 FR) and split them into aligned "
      f"UTF-8 files, one sentence per line: {TATOEBA_FOLDER}/{{{','.join(TATOEBA_FILES)}}}; "
      f"then set {SHARED_DATA_ENV}=DIR (DIR holding {TATOEBA_FOLDER}/), or pass "
      "--config.data.files_dir=DIR (DIR holding the six files)")


def get_config():
  tatoeba = shared_data_dir() / TATOEBA_FOLDER
  if not _corpus_on_command_line():
    _check_corpus(tatoeba)
  config = base.get_config()
  config.model.update(
      vocab_size=8000,
      d_model=256,
      d_ff=1024,
      num_heads=4,
      d_k=64,
      d_v=64,
      num_layers=2,
      max_len=256,  # a few dev/test sentences exceed the 64-token training limit
  )
  config.data.update(
      dataset="files",
      files_dir=str(tatoeba),
      source_lang="en",
      target_lang="de",
      max_source_len=64,
      max_target_len=64,
      tokens_per_batch=3072,
  )
  config.num_train_steps = 400
  config.warmup_steps = 400
  config.log_every_steps = 50
  config.eval_every_steps = 200
  config.checkpoint_every_steps = 200
  config.keep_checkpoints = 3
  # Dev BLEU on the whole dev split (base's bleu_num_sentences=0: 1,000 sentences) every 400
  # steps and at the last chooses the best checkpoint (config.select); not every 200
  # (CHANGELOG.md, 2026-11-29). What it costs is measured by `python -m benchmarks
  # --suite=time_to_bleu --ttb_dev_bleu` (docs/training.md).
  config.bleu_every_steps = 400
  config.num_average = 1
  config.decode.batch_size = 128
  return config
