"""A small Transformer on real German–English text, English→German, on a laptop CPU.

Reproduces nothing from the paper: it exercises the whole real-data path (aligned text files,
a shared 8k BPE vocabulary, length-bucketed token batches, checkpoints, dev loss, BLEU) on
the Tatoeba sentence pairs in ../shared/data/tatoeba-deu-eng (15.6k training pairs of short
everyday sentences; the project ships no corpus, the folder is read in place).
Model: 2+2 layers, d_model 256, 5.7M parameters. Batches of 3,072 token slots per side in
10 length-bucket shapes, ~74 steps per epoch; 400 steps are ~5 epochs. Expect a low BLEU: the
corpus is tiny (the README's "Data" section has a measured run).

  python train.py --config=configs/tatoeba_small.py --workdir=runs/tatoeba_small

Point it at another copy of the data with --config.data.files_dir=DIR (DIR holding
train.en/train.de, valid.*, test.*).
"""

import pathlib

from configs import base

# ../shared/data next to the checkout (the repository root is this file's parent's parent).
TATOEBA_DIR = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "tatoeba-deu-eng"


def get_config():
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
      files_dir=str(TATOEBA_DIR),
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
  config.bleu_every_steps = 0
  config.bleu_num_sentences = 200
  config.num_average = 1
  config.decode.batch_size = 128
  return config
