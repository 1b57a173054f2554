"""Fine-tuning: a trained or imported model trained further, on its own config's data or on
data given with overrides.

Reproduces: nothing from the paper (§6 trains every model from random parameters). The run is
the source workdir's own config — its model, vocabulary, decoding and training settings — with
`init_from` set to the source, so its first parameters are the source's latest checkpoint and
its optimiser state, learning-rate schedule and step start fresh (docs/training.md). The
source may be a workdir this project trained or one `transformer.export.from_marian` wrote
from an OPUS-MT model. Its vocabulary is kept: a model fine-tuned with another vocabulary
would read other ids.

  python train.py --config=configs/finetune.py:runs/opus-mt-en-de --workdir=runs/tuned \\
      --config.data.dataset=files --config.data.files_dir=/data/domain \\
      --config.num_train_steps=2000

Choose the steps (and the learning rate, `learning_rate_factor`, and its warm-up) for the new
data with `--config.<key>=value`; the source's are where a run from scratch would start.
"""

from transformer.data import tokenizer
from transformer.run import workdir


def get_config(source: str):
  config = workdir.load_config(source)
  config.data.vocab_path = tokenizer.load_tokenizer(config, source).path
  config.init_from = source
  return config
