"""The modifications researchers test in an encoder-decoder today, one named row each, beside
Table 3 (configs/table3.py).

Each row is the paper's base model and recipe (configs/base.py) with one change: a function
below whose docstring says the change, cites the paper it comes from and what that paper
reported, where it reported a comparable figure; `combined` puts several together. Every switch is a config key
declared once (transformer/model/config.py for `config.model`, transformer/run/schema.py for
the rest) with the paper's value as its default, and each is checked against an independent
reference in tests/ (NumPy formulas, PyTorch, the full forward pass for cached decoding,
exhaustive search for beam search). Narang et al. (2021) found that most such modifications
did not carry over from the codebase that proposed them to another: these rows put each on
the same recipe, seeds and significance test as Table 3.

  python train.py --config=configs/modern.py:rope --workdir=runs/modern/rope
  python -m transformer.research.sweep --config=configs/modern.py --variants=all --workdir=runs/modern
  python -m transformer.research.params --config=configs/modern.py:swiglu

At a CPU-sized shape: configs/modern_tatoeba.py (the same rows on configs/tatoeba_small.py;
docs/research.md has a measured sweep). Hardware and time: as configs/base.py; no row has
been trained at the base model's size here.

`config.variant` is the row's name and `config.paper` its metadata (`table` 'modern', `row`,
`change`: the docstring's first line), as the report reads them for Table 3. To add a row,
write a function under `@_row`, in the order it should appear, whose docstring's first line
says the change and whose body makes it.
"""

from __future__ import annotations

import inspect
from typing import Callable

import ml_collections

from configs import base as base_config
from transformer.errors import ConfigError

ROWS: list[Callable[[ml_collections.ConfigDict], None]] = []


def _row(change: Callable[[ml_collections.ConfigDict], None]):
  ROWS.append(change)
  return change


@_row
def base(config):
  """The paper's base model and recipe.

  Vaswani et al. 2017: the row every other row is compared with.
  """


# Normalisation.

@_row
def rmsnorm(config):
  """RMSNorm instead of LayerNorm.

  Zhang & Sennrich 2019, "Root Mean Square Layer Normalization": no mean subtraction, no
  bias. They report quality on par with LayerNorm, Transformer translation included, at
  7%-64% less running time across their models.
  """
  config.model.norm_type = "rmsnorm"


@_row
def pre_ln(config):
  """Pre-LN sublayers, x + Drop(f(LN(x))), and final norms.

  Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture": they report
  that pre-LN trains without the learning-rate warm-up (kept here, as the rest of the recipe).
  """
  config.model.norm = "pre"


# Feed-forward.

@_row
def gelu(config):
  """GELU instead of ReLU.

  Hendrycks & Gimpel 2016: x Φ(x). Shazeer (2020) reports perplexity close to ReLU's in T5,
  the gated variants below ahead of both.
  """
  config.model.activation = "gelu"


@_row
def swish(config):
  """Swish (SiLU) instead of ReLU.

  Ramachandran et al. 2017, "Searching for Activation Functions": x σ(x). They report it
  matching or beating ReLU across their tasks, the Transformer on WMT 2014 En→De among them.
  """
  config.model.activation = "swish"


@_row
def reglu(config):
  """ReGLU feed-forward at 2/3 of d_ff (the same parameters).

  Shazeer 2020, "GLU Variants Improve Transformer": (ReLU(xW) ⊙ xV) W2, without biases as
  his formulas (the norms keep theirs); lower perplexity than the ReLU network in T5.
  """
  config.model.update(activation="reglu", ffn_match_params=True)


@_row
def geglu(config):
  """GeGLU feed-forward at 2/3 of d_ff (the same parameters).

  Shazeer 2020: (GELU(xW) ⊙ xV) W2, without biases; with SwiGLU, the lowest perplexity of the
  variants he compares in T5.
  """
  config.model.update(activation="geglu", ffn_match_params=True)


@_row
def swiglu(config):
  """SwiGLU feed-forward at 2/3 of d_ff (the same parameters).

  Shazeer 2020: (Swish(xW) ⊙ xV) W2, without biases; with GeGLU, the lowest perplexity of the
  variants he compares in T5.
  """
  config.model.update(activation="swiglu", ffn_match_params=True)


# Positions.

@_row
def rope(config):
  """Rotary position embeddings (RoPE) in self-attention instead of sinusoids.

  Su et al. 2021, "RoFormer": they report 27.5 BLEU against the Transformer base's 27.3 on
  WMT 2014 En→De.
  """
  config.model.positional = "rope"


@_row
def t5(config):
  """T5's relative attention bias instead of sinusoids.

  Raffel et al. 2020: 32 log-spaced buckets up to distance 128, one table per stack. Used
  throughout T5, with no separate comparison for translation.
  """
  config.model.positional = "t5"


@_row
def shaw(config):
  """Relative position representations in keys and values (k = 16) instead of sinusoids.

  Shaw et al. 2018, "Self-Attention with Relative Position Representations": they report +1.3
  BLEU on WMT 2014 En→De and +0.3 on En→Fr over sinusoids, and little change with k beyond 2.
  """
  config.model.positional = "shaw"


@_row
def alibi(config):
  """ALiBi linear distance penalties in self-attention instead of sinusoids.

  Press et al. 2022, "Train Short, Test Long": reported for language models, whose perplexity
  it keeps on inputs longer than those trained on; no translation result. Symmetric in the
  encoder here.
  """
  config.model.positional = "alibi"


# Attention.

@_row
def mqa(config):
  """Multi-query attention: one key/value head.

  Shazeer 2019, "Fast Transformer Decoding": he reports slightly worse perplexity and BLEU
  than multi-head attention on WMT 2014 En→De, and much faster incremental decoding.
  """
  config.model.num_kv_heads = 1


@_row
def gqa(config):
  """Grouped-query attention: two key/value heads.

  Ainslie et al. 2023, "GQA": they report quality close to multi-head attention at a decoding
  speed close to multi-query attention's.
  """
  config.model.num_kv_heads = 2


@_row
def qk_norm(config):
  """Queries and keys RMS-normalised per head.

  The RMSNorm form of Dehghani et al. 2023's QK normalisation ("Scaling Vision Transformers
  to 22 Billion Parameters", whose norm is LayerNorm): each head's queries and keys
  normalised, a learned scale per channel, the paper's 1/sqrt(d_k) kept. They introduce it to
  keep the attention logits from growing until training diverges, at 8B parameters and up;
  no translation result.
  """
  config.model.qk_norm = "rms"


@_row
def qk_norm_l2(config):
  """QKNorm: queries and keys at unit length, one learned scale g for 1/sqrt(d_k).

  Henry et al. 2020, "Query-Key Normalization for Transformers": the logits are g times the
  cosine of each query and key, g one per layer initialised to log2(L^2 - L), L the 97.5th
  percentile of the training sentences' lengths (`model.qk_norm_length`). They report +0.928
  BLEU on average over five low-resource pairs.
  """
  config.model.qk_norm = "l2"


# Embeddings and biases.

@_row
def two_way_tying(config):
  """Source embedding apart; target embedding tied to the output projection.

  Press & Wolf 2017, "Using the Output Embedding to Improve Language Models": they report
  that tying halves a translation model's size without harming its quality.
  """
  config.model.tie_embeddings = "two_way"


@_row
def untied(config):
  """Source embedding, target embedding and output projection each their own.

  The untied baseline of Press & Wolf 2017.
  """
  config.model.tie_embeddings = "none"


@_row
def no_bias(config):
  """No bias in the feed-forward layers or the norms.

  Chowdhery et al. 2022, PaLM: they report it increases training stability for large models.
  """
  config.model.biases = False


# Loss and optimisation.

@_row
def z_loss(config):
  """Plus 1e-4 · log(Z)^2 per token in the loss.

  Chowdhery et al. 2022, PaLM: they report it increases training stability.
  """
  config.z_loss = 1e-4


@_row
def adamw(config):
  """AdamW, weight decay 0.1 on matrices and embeddings.

  Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization": they report better
  generalisation than L2 regularisation in Adam (image classification).
  """
  config.update(optimizer="adamw", weight_decay=0.1)


@_row
def adafactor(config):
  """Adafactor, the paper's schedule as its step size.

  Shazeer & Stern 2018: second moments factored into a row and a column per weight matrix
  (the attention kernels as [D, H·K] and [H·V, D] matrices, as Mesh TensorFlow stores them),
  no first moment, updates clipped to RMS 1. They report BLEU on WMT 2014 En→De comparable
  to Adam's, with sublinear optimiser memory: for this model 0.23M numbers of state against
  Adam's 126.1M (docs/training.md).
  """
  config.optimizer = "adafactor"


@_row
def cosine(config):
  """Cosine decay to 0 after the paper's warm-up.

  Loshchilov & Hutter 2017, "SGDR": the rate follows half a cosine from the paper's peak to
  0 at the last step.
  """
  config.lr_schedule = "cosine"


@_row
def wsd(config):
  """Warmup-stable-decay: the peak held, then linear to 0 over the last 20% of steps.

  Hu et al. 2024 (MiniCPM); Hägele et al. 2024 report it matching cosine decay.
  """
  config.lr_schedule = "wsd"


@_row
def combined(config):
  """Pre-LN RMSNorm, SwiGLU at 2/3 of d_ff, RoPE, no biases.

  The combination of LLaMA (Touvron et al. 2023), in an encoder-decoder.
  """
  config.model.update(norm="pre", norm_type="rmsnorm", activation="swiglu",
                      ffn_match_params=True, positional="rope", biases=False)


NAMES = tuple(row.__name__ for row in ROWS)


def change(name: str) -> str:
  """A row's change from the base model: its docstring's first line."""
  return inspect.getdoc(ROWS[NAMES.index(name)]).splitlines()[0].rstrip(".")


def get_config(variant: str = "base",
               start: Callable[[], ml_collections.ConfigDict] = base_config.get_config
               ) -> ml_collections.ConfigDict:
  """The config of row `variant`, applied to `start()` (configs/base.py's)."""
  if variant not in NAMES:
    raise ConfigError(f"unknown row {variant!r} of configs/modern.py; the rows are "
                      f"{', '.join(NAMES)}")
  config = start()
  ROWS[NAMES.index(variant)](config)
  config.variant = variant
  config.paper = ml_collections.ConfigDict(dict(
      table="modern", row=NAMES.index(variant) + 1, change=change(variant), ppl_dev=None,
      bleu_dev=None, params_m=None))
  return config
