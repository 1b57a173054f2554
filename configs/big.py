"""Transformer big, WMT 2014 English→German: the paper's Table 3 "big" row.

Reproduces: Vaswani et al. 2017, big model, EN-DE: P_drop = 0.3 (§6.1), 300k steps.
Expected: newstest2013 PPL ≈ 4.33, BLEU ≈ 26.4 (Table 3); newstest2014 BLEU 28.4 with the
last 20 checkpoints averaged (Table 2, tokenized with compound splitting; expect ≈ 0.7 lower
in sacreBLEU). Paper hardware: 8 P100 GPUs, 300k steps at ≈ 1.0 s/step, 3.5 days. This
project has not timed big on an accelerator yet (docs/performance.md). EN-FR: big_enfr.py.

  python train.py --config=configs/big.py --workdir=runs/big
  python evaluate.py --workdir=runs/big --num_average=20
"""

from configs import base


def get_config():
  config = base.get_config()
  config.model.d_model = 1024
  config.model.d_ff = 4096
  config.model.num_heads = 16
  config.model.d_k = 64
  config.model.d_v = 64
  config.model.dropout_rate = 0.3  # EN-DE big uses P_drop = 0.3 (§6.1)
  config.num_train_steps = 300_000
  config.num_average = 20
  return config
