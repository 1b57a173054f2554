"""Transformer big, WMT 2014 English→French (paper Table 2, EN-FR).

Reproduces: Vaswani et al. 2017, big model on EN-FR: the big architecture with P_drop = 0.1
instead of 0.3 (§6.1), a shared vocabulary of 32,000 pieces (§5.1 uses word-pieces; this is
SentencePiece BPE, like every config here), 300k steps, the last 20 checkpoints averaged.
Expected: newstest2014 BLEU 41.8 (Table 2; the text of §6.1 says 41.0), tokenized. Paper
hardware: 8 P100 GPUs, 3.5 days. Not timed by this project. The training set has about 36M
pairs: prepare it once with `tfds build wmt14_translate/fr-en --data_dir=DIR`.

  python train.py --config=configs/big_enfr.py --workdir=runs/big_enfr \\
      --config.data.tfds_data_dir=DIR
  python evaluate.py --workdir=runs/big_enfr
"""

from configs import big


def get_config():
  config = big.get_config()
  config.model.vocab_size = 32000
  config.model.dropout_rate = 0.1  # EN-FR big uses P_drop = 0.1, not 0.3 (§6.1)
  config.data.tfds_name = "wmt14_translate/fr-en"
  config.data.source_lang = "en"  # explicit: TFDS lists the keys as (fr, en)
  config.data.target_lang = "fr"
  return config
