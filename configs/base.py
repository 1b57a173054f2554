"""Transformer base, WMT 2014 English→German: the paper's Table 3 "base" row.

Reproduces: Vaswani et al. 2017, base model. Expected: newstest2013 PPL ≈ 4.92, BLEU ≈ 25.8
(Table 3, no averaging); newstest2014 BLEU 27.3 with the last 5 checkpoints averaged (Table 2,
tokenized with compound splitting; expect ≈ 0.7 lower in sacreBLEU).
Paper hardware: 8 P100 GPUs, 100k steps of ≈ 25k source + 25k target tokens, 12 hours. This
project has not timed base on an accelerator yet (docs/performance.md).

  python train.py --config=configs/base.py --workdir=runs/base
  python evaluate.py --workdir=runs/base --num_average=5

Every Table 3 row is a named variant of this config in configs/table3.py, e.g. row (A) with
one head: `python train.py --config=configs/table3.py:A1 --workdir=runs/table3/A1`.
"""

import ml_collections

from transformer.model import config as model_config


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0  # initialises the model, orders the batches, drives dropout
  # Fine-tuning: start from another run's parameters, 'WORKDIR' (its latest checkpoint) or
  # 'WORKDIR:STEP', instead of random ones ('' = random, as the paper trains). The optimiser
  # and the step start fresh; the vocabulary must be the source's (transformer/training/
  # init_from.py). True: parameters whose shape differs from the source's start fresh too.
  config.init_from = ""
  config.init_from_partial = False

  # Model hyperparameters, with the paper's names (§3), passed straight to ModelConfig: its
  # fields, each with its allowed values and a comment citing the paper, and their defaults,
  # the base model, are declared in transformer/model/config.py.
  config.model = ml_collections.ConfigDict(model_config.defaults())
  config.dtype = "float32"  # 'bfloat16': compute in bf16, params/optimizer/loss in f32
  # Compiled programs are kept here and reused by later runs (shared by all workdirs); '' = off.
  config.compilation_cache_dir = "~/.cache/transformer-xla"
  # Decoding ops tuned for XLA:CPU (transformer/decoding/backend_ops.py; same results), chosen
  # by the decoding code, not the model: 'auto' = on where JAX's default backend is the CPU,
  # 'on', or 'off' (the library ops everywhere).
  config.cpu_workarounds = "auto"

  # Data (§5.1): WMT 2014 English→German; newstest2013 is the dev set, newstest2014 the test.
  config.data = ml_collections.ConfigDict(dict(
      dataset="tfds",  # 'tfds' | 'files' | 'synthetic' (built-in generated pair, offline)
      tfds_name="wmt14_translate/de-en",  # prepared once with `tfds build`; never downloaded here
      tfds_data_dir="",  # '' = tfds default (~/tensorflow_datasets)
      # dataset='files': a folder of {train,valid,test}.{source_lang,target_lang}, aligned
      # UTF-8 text, one sentence per line; or explicit 'SOURCE_PATH,TARGET_PATH' per split.
      files_dir="",
      train_files="",
      valid_files="",
      test_files="",
      source_lang="en",  # explicit: TFDS lists wmt14 de-en's keys as (de, en)
      target_lang="de",
      cache_dir="",  # vocabulary, tokenized splits, synthetic corpus; '' = WORKDIR/data
      # Samples what the data cache holds: the vocabulary's training text and the synthetic
      # corpus. Apart from config.seed, so that runs of several seeds share one vocabulary.
      seed=0,
      # dataset='synthetic': training pairs generated (dev and test: 500 each). Fewer make a
      # quicker smoke run; the demo's figures are at 50,000.
      synthetic_train_pairs=50_000,
      vocab_path="",  # an existing SentencePiece .model; '' = train one into cache_dir
      vocab_model_type="bpe",  # 'unigram' departs from §5.1 (byte-pair encoding)
      vocab_sample_sentences=2_000_000,  # sentences (both sides) sampled from train, data.seed
      vocab_character_coverage=1.0,
      max_source_len=256,  # training pairs longer than this (tokens, EOS included) are dropped
      max_target_len=256,
      # Token slots (padded) per side, per step, across all processes (§5.1); the real tokens
      # are this × the padding efficiency that the pipeline logs.
      tokens_per_batch=25_000,
      bucket_boundaries=(),  # bucket lengths (longer side, EOS incl.); () = automatic (~×1.3)
      packing=False,  # departure if True: several pairs per row (the paper pads by length)
      packed_length=0,  # row length with packing; 0 = max(max_source_len, max_target_len)
      read_threads=2,  # grain threads assembling batches ahead of the training step
      prefetch_batches=8,  # batches read ahead
      # A run resumed on another number of processes or devices makes other batches than the
      # checkpoint's: refused, unless True (goes on in the new order; data/train_iterator.py).
      allow_new_order_on_resume=False,
      eval_split="validation",  # dev set for loss/BLEU during training ('' = none)
      test_split="test",
  ))

  # Optimisation (§5.3, §5.4).
  config.num_train_steps = 100_000
  config.warmup_steps = 4000
  config.learning_rate_factor = 1.0  # multiplies d_model^-0.5 · min(step^-0.5, step·warmup^-1.5)
  config.adam_b1 = 0.9
  config.adam_b2 = 0.98
  config.adam_eps = 1e-9
  # Departures after the paper, off here (each cited where transformer/run/schema.py declares
  # it; configs/modern.py names a row for each): 'adamw' | 'adafactor', their schedules.
  config.optimizer = "adam"
  config.weight_decay = 0.0  # AdamW's decoupled λ
  config.lr_schedule = "inverse_sqrt"  # 'cosine' | 'wsd': same warm-up and peak, other decay
  config.wsd_decay_fraction = 0.2  # 'wsd': the last 20% of the steps decay linearly to 0
  config.label_smoothing = 0.1  # ε_ls
  # Dropout's random bits: JAX's threefry by default; 'rbg' or 'unsafe_rbg' draw them with
  # the device's generator, cheaper on GPUs (other masks of the same distribution;
  # docs/performance.md).
  config.dropout_rng_impl = "threefry2x32"
  config.z_loss = 0.0  # PaLM's auxiliary log(Z)^2 weight (1e-4 there)
  # Implementation switch, the same loss: the output projection and the loss over chunks of
  # about this many target tokens, never holding the whole [B, T, V] logits; 0 = all at once.
  config.loss_chunk_tokens = 0
  config.grad_accum_steps = 1  # k micro-batches per update (same maths as one k× batch)
  # A NaN or infinite loss or gradient: 'stop' (naming the step; the last checkpoint is always
  # finite) or 'skip' (that update is dropped and counted in train/nonfinite_steps).
  config.on_nonfinite = "stop"
  config.warn_loss_factor = 2.0  # warn when a logged loss exceeds this × the first one

  # Parallelism: jit over a device mesh (default) or pmap.
  config.parallelism = "jit"
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))  # -1 = the rest
  # Multi-process runs: a process silent this long (killed, its host down or hung) is lost,
  # and the others stop with one line naming it (docs/multi-device.md).
  config.heartbeat_timeout_seconds = 100
  # No training step completed for this long (the first step, which compiles, evaluation and
  # decoding apart): every thread's stack is logged and the run stops with one line, every
  # process of it (docs/failures.md). 0: never.
  config.step_timeout_seconds = 1800

  # Checkpoints, logging, evaluation. The paper saved every 10 minutes (≈ 1500 steps at
  # 0.4 s/step) and averaged the last 5 (base) or 20 (big) (§6.1).
  config.checkpoint_every_steps = 1500
  config.keep_checkpoints = 20
  # Only the newest keep_full_checkpoints hold the whole train state (parameters, Adam moments,
  # data position) that resuming needs; the older ones, kept for averaging (§6.1), hold the
  # parameters alone: a third of the bytes (4 of 12 per parameter).
  config.keep_full_checkpoints = 2
  config.log_every_steps = 100
  config.eval_every_steps = 1500
  config.num_eval_batches = -1  # -1 = the whole dev set for loss/perplexity
  config.bleu_every_steps = 5000  # 0 = never during training
  # Dev BLEU on the whole dev set (0), which chooses the best checkpoint; N: its first N.
  config.bleu_num_sentences = 0
  config.bleu_at_end = True  # test-split BLEU and sample translations when training ends
  # The dev metric that picks the best checkpoint, kept beside the rolling ones in workdir/best/
  # ('bleu', 'chrf', 'comet', 'loss', 'perplexity'; '' = none), and the evaluations of it
  # without a better score that stop a run (0 = never). The paper trains a fixed number of steps and
  # averages the last checkpoints (§6.1): patience 0, and evaluate.py averages by default.
  config.select = "bleu"
  config.patience = 0
  # COMET at each dev-BLEU evaluation (and in the end-of-training test score), logged as
  # dev/comet and a `select` metric ('comet'): a model name on the hub, a folder or a
  # model.ckpt ('' = none), and the Python that has unbabel-comet ('' = this one;
  # docs/evaluation.md). Not in the paper, which reports BLEU alone (§6.1).
  config.comet_model = ""
  config.comet_python = ""
  config.num_samples_to_print = 3
  # Weights & Biases (pip install -e '.[wandb]'), beside TensorBoard and metrics.jsonl: the
  # project ('' = none), its entity, and the group ('' = the config's variant: a sweep's row).
  config.wandb = ml_collections.ConfigDict(dict(project="", entity="", group=""))

  # Inference (§6.1).
  config.decode = ml_collections.ConfigDict(dict(
      beam_size=4,
      length_penalty=0.6,  # α in ((5 + |Y|) / 6)^α
      max_extra_len=50,  # output length ≤ input length + 50
      batch_size=64,  # sentences per decoding batch
  ))
  config.num_average = 5  # checkpoints averaged by evaluate.py (§6.1; big: 20)
  return config
