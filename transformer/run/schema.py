"""Every config key, declared once: its type (with its allowed values or range) and its role
for a trained workdir.

`config.model`'s keys are the fields of `ModelConfig` (transformer/model/config.py); the
classes below declare the others, one annotation per key, in the config's sections: `Config`
(the top level), `Data`, `Decode` and `Mesh`. A type is a `Literal` of the allowed values, a
type with a `Rule` (`PositiveInt`, `Rate`, ...), or a plain `int`, `float`, `bool`, `str` or
`tuple` (a float key also takes an int). The values themselves are set by configs/*.py
(configs/base.py is the paper's recipe).

Roles, as markers on the type: `IDENTITY` keys are what a trained model is besides its
`config.model` fields (its vocabulary: the data keys that name the vocabulary's cache file,
and `data.seed`, which samples its text), and a tool given a --config for a trained workdir
refuses differences there (`workdir.IDENTITY_KEYS`); `PATH_OR_SPEED` keys say where files
are, how fast data is read and how things are computed, and may change when a run resumes
(`workdir.check_resume_config`). A `config.model` field is an identity key unless it is
marked otherwise (see transformer/model/config.py).

`keys()` is the table the checks (`config_checks.validate`) and the workdir read.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, Literal

from transformer.errors import ConfigError
from transformer.model import config as model_config
from transformer.model.config import (IDENTITY, PATH_OR_SPEED, TRAINING_ONLY, AtLeastTwo,
                                      Dtype, NonNegativeInt, PositiveInt, Rate, Rule)

Path = Annotated[str, PATH_OR_SPEED]
NonNegative = Annotated[float, Rule(lambda v: model_config.is_number(v) and v >= 0,
                                    "must be a number >= 0")]
Fraction = Annotated[float, Rule(lambda v: model_config.is_number(v) and 0 < v <= 1,
                                 "must be in (0, 1]")]


class Data:
  """`config.data`: the corpus, its vocabulary and its batches (§5.1)."""

  dataset: Annotated[Literal["tfds", "files", "synthetic"], IDENTITY]
  tfds_name: Annotated[str, IDENTITY]
  tfds_data_dir: Path
  files_dir: Path
  train_files: Path
  valid_files: Path
  test_files: Path
  source_lang: Annotated[str, IDENTITY]
  target_lang: Annotated[str, IDENTITY]
  cache_dir: Path
  seed: Annotated[int, IDENTITY]  # samples the vocabulary's text and the synthetic corpus
  synthetic_train_pairs: Annotated[PositiveInt, IDENTITY]
  vocab_path: Path
  vocab_model_type: Annotated[Literal["bpe", "unigram", "char", "word"], IDENTITY]
  vocab_sample_sentences: Annotated[int, IDENTITY]
  vocab_character_coverage: Annotated[float, IDENTITY]
  max_source_len: AtLeastTwo  # counts EOS, so a pair needs at least two slots
  max_target_len: AtLeastTwo
  tokens_per_batch: AtLeastTwo
  bucket_boundaries: tuple
  packing: bool
  packed_length: int
  read_threads: Annotated[int, PATH_OR_SPEED]
  prefetch_batches: Annotated[int, PATH_OR_SPEED]
  # Resuming from a data position of another pipeline (another number of processes or
  # devices): go on in this run's order instead of refusing (transformer/data/train_iterator.py).
  allow_new_order_on_resume: Annotated[bool, PATH_OR_SPEED]
  eval_split: Annotated[str, PATH_OR_SPEED]
  test_split: Annotated[str, PATH_OR_SPEED]


class Decode:
  """`config.decode`: beam search (§6.1)."""

  beam_size: PositiveInt
  length_penalty: float
  max_extra_len: NonNegativeInt
  batch_size: PositiveInt


class Mesh:
  """`config.mesh`: the device mesh's axes and their sizes (-1: the rest)."""

  data: int
  fsdp: int
  tensor: int


class Wandb:
  """`config.wandb`: the Weights & Biases run that the training metrics also go to
  (`transformer.training.tracking`); project '' = none. Where metrics go, not what is
  trained: each may change when a run resumes."""

  project: Path
  entity: Path
  group: Path


class Config:
  """The top level: the run, optimisation, parallelism, checkpoints and evaluation."""

  seed: int  # the run's: initialisation, batch order, dropout (not the vocabulary: data.seed)
  init_from: Path  # fine-tuning's source, read when the run starts from step 0
  init_from_partial: Annotated[bool, PATH_OR_SPEED]
  model: model_config.ModelConfig  # its config fields (`model_config.config_fields`)
  dtype: Dtype
  # How decoding computes its top k, its normaliser and its cache reads
  # (`transformer.decoding.backend_ops.for_setting`).
  cpu_workarounds: Annotated[Literal["auto", "on", "off"], PATH_OR_SPEED]
  compilation_cache_dir: Annotated[str, PATH_OR_SPEED,
                                   Rule(lambda v: isinstance(v, str),
                                        "must be a folder path, or '' for no cache")]
  data: Data
  num_train_steps: PositiveInt
  warmup_steps: PositiveInt
  learning_rate_factor: float
  adam_b1: float
  adam_b2: float
  adam_eps: float
  # Departures from §5.3 (configs/modern.py names a row for each): 'adamw' decays weights
  # apart from the gradient's moments (Loshchilov & Hutter 2019), 'adafactor' factors the
  # second moment (Shazeer & Stern 2018).
  optimizer: Literal["adam", "adamw", "adafactor"]
  weight_decay: NonNegative  # AdamW's λ (optimizer='adamw' only)
  # Not 'inverse_sqrt' departs from eq. 3: the same warm-up to the same peak, then cosine
  # decay to 0 at num_train_steps (Loshchilov & Hutter 2017), or warmup-stable-decay: the
  # peak held, then a linear decay to 0 over the last `wsd_decay_fraction` of the steps (Hu et
  # al. 2024; Hägele et al. 2024).
  lr_schedule: Literal["inverse_sqrt", "cosine", "wsd"]
  wsd_decay_fraction: Fraction
  label_smoothing: Rate
  # The generator of dropout's random bits: JAX's default threefry, or the device's own
  # (rng_bit_generator), much cheaper on GPUs; other masks, the same distribution.
  dropout_rng_impl: Annotated[Literal["threefry2x32", "rbg", "unsafe_rbg"], PATH_OR_SPEED]
  # > 0 departs from §5.4's loss: plus z_loss · log(Z)^2 per token, Z the softmax's
  # normaliser (Chowdhery et al. 2022, PaLM: 1e-4).
  z_loss: NonNegative
  loss_chunk_tokens: Annotated[NonNegativeInt, PATH_OR_SPEED]
  grad_accum_steps: PositiveInt
  on_nonfinite: Literal["stop", "skip"]
  warn_loss_factor: float
  parallelism: Literal["jit", "pmap"]
  mesh: Mesh
  # A multi-process run: seconds without a sign of life after which a process is lost and the
  # others stop (`transformer.training.peer_watch`).
  heartbeat_timeout_seconds: Annotated[PositiveInt, PATH_OR_SPEED]
  # Seconds without a completed training step after which the run is stuck and stops
  # (`transformer.training.peer_watch`); 0 = never.
  step_timeout_seconds: Annotated[NonNegativeInt, PATH_OR_SPEED]
  checkpoint_every_steps: PositiveInt
  keep_checkpoints: PositiveInt
  # Of keep_checkpoints, those holding the whole train state; the rest hold parameters only.
  # May change when a run resumes (as may a workdir trained before the key existed).
  keep_full_checkpoints: Annotated[PositiveInt, PATH_OR_SPEED]
  log_every_steps: PositiveInt
  eval_every_steps: PositiveInt
  num_eval_batches: int
  bleu_every_steps: NonNegativeInt
  bleu_num_sentences: NonNegativeInt
  bleu_at_end: bool
  # The dev metric that picks the best checkpoint, kept in workdir/best/
  # (`transformer.training.selection`); '' = none. Both may change when a run resumes (as may
  # a workdir trained before the keys existed, which chose nothing): another metric starts
  # the choice afresh.
  select: Annotated[Literal["", "bleu", "chrf", "loss", "perplexity", "comet"], PATH_OR_SPEED]
  # Evaluations of `select` without a better score that stop a run; 0 = never.
  patience: Annotated[NonNegativeInt, PATH_OR_SPEED]
  # COMET at each dev-BLEU evaluation ('' = none; `transformer.evaluation.comet`): the model,
  # and the Python that has unbabel-comet ('' = this one). May change when a run resumes.
  comet_model: Annotated[str, PATH_OR_SPEED]
  comet_python: Annotated[str, PATH_OR_SPEED]
  num_samples_to_print: int
  wandb: Wandb
  decode: Decode
  num_average: PositiveInt


_PLAIN = {int: Rule(model_config.is_int, "must be an integer"),
          float: Rule(model_config.is_number, "must be a number"),
          bool: Rule(lambda v: isinstance(v, bool), "must be True or False"),
          str: Rule(lambda v: isinstance(v, str), "must be a string"),
          tuple: Rule(lambda v: isinstance(v, (tuple, list)), "must be a tuple")}


@dataclasses.dataclass(frozen=True)
class Key:
  """One declared config key."""

  name: str  # dotted, e.g. 'model.d_model'
  rule: Rule | None  # what its value must satisfy; None for a Literal key
  choices: tuple[Any, ...] | None  # a Literal key's allowed values
  identity: bool
  path_or_speed: bool

  def check(self, value) -> None:
    """Raises the one-line `ConfigError` for a value this key does not take."""
    if self.choices is not None:
      if value not in self.choices:
        raise model_config.not_one_of(self.name, value, self.choices)
    elif not self.rule.holds(value):
      raise ConfigError(f"config.{self.name}={value!r} {self.rule.says}")


def _key(name: str, hint, *, model_field: bool) -> Key:
  markers = getattr(hint, "__metadata__", ())
  bare = hint.__origin__ if typing.get_origin(hint) is Annotated else hint
  choices = model_config.choices(hint)
  rules = [m for m in markers if isinstance(m, Rule)]
  if choices is not None:
    rule = None
  else:
    rule = rules[0] if rules else _PLAIN[bare]
  if model_field:
    identity = not {TRAINING_ONLY, PATH_OR_SPEED} & set(markers)
  else:
    identity = IDENTITY in markers
  return Key(name, rule, choices, identity, PATH_OR_SPEED in markers)


def keys() -> dict[str, Key]:
  """Every declared key by dotted name, in declaration order."""
  table = {}
  for name, hint in typing.get_type_hints(Config, include_extras=True).items():
    if name == "model":
      hints = typing.get_type_hints(model_config.ModelConfig, include_extras=True)
      for field in model_config.config_fields():
        table[f"model.{field}"] = _key(f"model.{field}", hints[field], model_field=True)
    elif _is_section(hint):
      for leaf, leaf_hint in typing.get_type_hints(hint, include_extras=True).items():
        table[f"{name}.{leaf}"] = _key(f"{name}.{leaf}", leaf_hint, model_field=False)
    else:
      table[name] = _key(name, hint, model_field=False)
  return table


def _is_section(hint) -> bool:
  return isinstance(hint, type) and hint not in _PLAIN


# The config's sections, e.g. 'model' and 'data': the keys that hold keys.
SECTIONS = tuple(name for name, hint in typing.get_type_hints(Config).items()
                 if _is_section(hint))


def section_keys(section: str) -> tuple[str, ...]:
  """The leaf names declared under `section`, e.g. `section_keys('mesh')`."""
  return tuple(k.split(".", 1)[1] for k in keys() if k.startswith(section + "."))


def identity_keys() -> tuple[str, ...]:
  return tuple(k for k, key in keys().items() if key.identity)


def path_or_speed_keys() -> tuple[str, ...]:
  return tuple(k for k, key in keys().items() if key.path_or_speed)
