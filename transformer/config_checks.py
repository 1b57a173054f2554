"""Checks of a config and a workdir, run before anything is built or compiled.

Each failure is a `ConfigError` whose message is one line naming the key (or path) and what
is allowed; the CLIs print it and exit without a traceback.
"""

from __future__ import annotations

import os
import tempfile

from transformer import attention

POSITIONAL = ("sinusoidal", "learned")
NORMS = ("post", "pre")
DTYPES = ("float32", "bfloat16", "float16")
PARALLELISM = ("jit", "pmap")


class ConfigError(ValueError):
  """A config value or path that cannot be used; the message says which and why."""


def _positive(config, *keys: str) -> None:
  for key in keys:
    value = _get(config, key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      raise ConfigError(f"config.{key}={value!r} must be a positive integer")


def _non_negative(config, *keys: str) -> None:
  for key in keys:
    value = _get(config, key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
      raise ConfigError(f"config.{key}={value!r} must be an integer >= 0")


def _rate(config, *keys: str) -> None:
  for key in keys:
    value = _get(config, key)
    if not 0.0 <= value < 1.0:
      raise ConfigError(f"config.{key}={value!r} must be in [0, 1)")


def _choice(config, key: str, allowed) -> None:
  value = _get(config, key)
  if value not in allowed:
    raise ConfigError(f"config.{key}={value!r} is not one of {', '.join(map(repr, allowed))}")


def _get(config, dotted: str):
  node = config
  for part in dotted.split("."):
    node = node[part]
  return node


def validate(config) -> None:
  """Raises `ConfigError` on the first value that cannot work."""
  m = config.model
  _positive(config, "model.vocab_size", "model.d_model", "model.d_ff", "model.num_heads",
            "model.d_k", "model.d_v", "model.num_layers", "model.max_len",
            "num_train_steps", "warmup_steps", "grad_accum_steps", "log_every_steps",
            "checkpoint_every_steps", "keep_checkpoints", "eval_every_steps",
            "data.tokens_per_batch", "data.max_source_len", "data.max_target_len",
            "decode.beam_size", "decode.batch_size", "num_average")
  _non_negative(config, "decode.max_extra_len", "bleu_every_steps", "bleu_num_sentences")
  _rate(config, "model.dropout_rate", "model.attention_dropout_rate", "label_smoothing")
  _choice(config, "model.positional", POSITIONAL)
  _choice(config, "model.norm", NORMS)
  _choice(config, "model.attention_impl", attention.ATTENTION_IMPLS)
  _choice(config, "dtype", DTYPES)
  _choice(config, "parallelism", PARALLELISM)
  _choice(config, "cpu_workarounds", ("auto", "on", "off"))
  if m.positional == "sinusoidal" and m.d_model % 2:
    raise ConfigError(f"config.model.d_model={m.d_model} must be even for sinusoidal positions "
                      "(sin and cos channels alternate, §3.5)")
  if m.attention_impl != "reference" and m.attention_dropout_rate > 0:
    raise ConfigError(f"config.model.attention_dropout_rate={m.attention_dropout_rate} needs "
                      f"attention_impl='reference' (got {m.attention_impl!r})")
  if m.attention_impl != "reference" and m.d_k != m.d_v:
    raise ConfigError(f"config.model.attention_impl={m.attention_impl!r} needs d_k == d_v "
                      f"(got {m.d_k} and {m.d_v}); use 'reference' for Table 3 row (B)")
  if config.adam_eps <= 0 or not (0 <= config.adam_b1 < 1 and 0 <= config.adam_b2 < 1):
    raise ConfigError(f"config.adam_b1/adam_b2 must be in [0, 1) and adam_eps > 0 (got "
                      f"{config.adam_b1}, {config.adam_b2}, {config.adam_eps})")


def check_workdir(workdir: str) -> None:
  """Creates `workdir` if needed and proves it writable, or raises `ConfigError`."""
  if not workdir:
    raise ConfigError("--workdir is required: the folder for checkpoints, logs and outputs")
  try:
    os.makedirs(workdir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=workdir, prefix=".write_test"):
      pass
  except OSError as e:
    raise ConfigError(f"workdir {workdir!r} cannot be written ({e.strerror or e}); "
                      "choose a folder you can write to") from None
