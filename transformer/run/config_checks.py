"""Every static check of a config, and the workdir check, run before anything is built.

`validate(config)` is the one place a config value is judged on its own (types, ranges,
choices, keys that must agree with each other). Checks that need the devices or the data
(mesh size against the device count, rows per device, vocabulary against the corpus) stay
where those are known: `parallel.create` and `input_pipeline.create_datasets`.

Each failure is a `ConfigError` whose message is one line naming the key and what is allowed;
the CLIs print it and exit without a traceback.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

from transformer.errors import ConfigError

POSITIONAL = ("sinusoidal", "learned")
NORMS = ("post", "pre")
ATTENTION_IMPLS = ("reference", "xla", "cudnn")
DTYPES = ("float32", "bfloat16", "float16")
PARALLELISM = ("jit", "pmap")
MESH_AXES = ("data", "fsdp", "tensor")
DATASETS = ("tfds", "files", "synthetic")
VOCAB_MODEL_TYPES = ("bpe", "unigram", "char", "word")


def _get(config, dotted: str):
  node = config
  for part in dotted.split("."):
    try:
      node = node[part]
    except KeyError:
      raise ConfigError(f"config.{dotted} is missing") from None
  return node


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _positive(config, *keys: str) -> None:
  for key in keys:
    value = _get(config, key)
    if not _is_int(value) or value <= 0:
      raise ConfigError(f"config.{key}={value!r} must be a positive integer")


def _non_negative(config, *keys: str) -> None:
  for key in keys:
    value = _get(config, key)
    if not _is_int(value) or value < 0:
      raise ConfigError(f"config.{key}={value!r} must be an integer >= 0")


def _rate(config, *keys: str) -> None:
  for key in keys:
    value = _get(config, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
      raise ConfigError(f"config.{key}={value!r} must be in [0, 1)")


def _choice(config, key: str, allowed) -> None:
  value = _get(config, key)
  if value not in allowed:
    raise ConfigError(f"config.{key}={value!r} is not one of {', '.join(map(repr, allowed))}")


def _check_model(config) -> None:
  from transformer.model.transformer import ModelConfig  # its fields are the allowed config.model keys

  allowed = {f.name for f in dataclasses.fields(ModelConfig)} - {"dtype", "cpu_workarounds"}
  unknown = sorted(set(config.model) - allowed)
  if unknown:
    raise ConfigError(f"unknown key config.model.{unknown[0]}; config.model takes "
                      f"{', '.join(sorted(allowed))}")
  m = config.model
  _positive(config, "model.vocab_size", "model.d_model", "model.d_ff", "model.num_heads",
            "model.d_k", "model.d_v", "model.num_layers", "model.max_len")
  _rate(config, "model.dropout_rate", "model.attention_dropout_rate")
  _choice(config, "model.positional", POSITIONAL)
  _choice(config, "model.norm", NORMS)
  _choice(config, "model.attention_impl", ATTENTION_IMPLS)
  if m.positional == "sinusoidal" and m.d_model % 2:
    raise ConfigError(f"config.model.d_model={m.d_model} must be even for sinusoidal positions "
                      "(sin and cos channels alternate, §3.5)")
  if m.attention_impl != "reference" and m.attention_dropout_rate > 0:
    raise ConfigError(f"config.model.attention_dropout_rate={m.attention_dropout_rate} needs "
                      f"attention_impl='reference' (got {m.attention_impl!r})")
  if m.attention_impl != "reference" and m.d_k != m.d_v:
    # jax.nn.dot_product_attention takes one head size for queries, keys and values.
    raise ConfigError(f"config.model.attention_impl={m.attention_impl!r} needs d_k == d_v "
                      f"(got {m.d_k} and {m.d_v}); use 'reference' for Table 3 row (B)")


def _check_data(config) -> None:
  data, max_len = config.data, config.model.max_len
  _choice(config, "data.dataset", DATASETS)
  _choice(config, "data.vocab_model_type", VOCAB_MODEL_TYPES)
  for key in ("max_source_len", "max_target_len", "tokens_per_batch"):
    if not _is_int(data[key]) or data[key] < 2:
      raise ConfigError(f"config.data.{key}={data[key]!r} must be an integer >= 2")
  longest = max(data.max_source_len, data.max_target_len)
  if longest > max_len:
    raise ConfigError(f"config.data.max_source_len/max_target_len={longest} exceeds "
                      f"config.model.max_len={max_len}, the positions the model encodes")
  if data.packing:
    width = data.packed_length or longest
    if width < longest:
      raise ConfigError(f"config.data.packed_length={width} is shorter than the longest "
                        f"allowed pair ({longest} = max(max_source_len, max_target_len))")
    if width > max_len:
      raise ConfigError(f"config.data.packed_length={width} exceeds config.model.max_len="
                        f"{max_len}")
  if any(not _is_int(b) or b < 1 for b in data.bucket_boundaries):
    raise ConfigError(f"config.data.bucket_boundaries={tuple(data.bucket_boundaries)}: "
                      "lengths must be positive integers")


def _check_parallelism(config) -> None:
  _choice(config, "parallelism", PARALLELISM)
  named = {a: config.mesh[a] for a in MESH_AXES}
  sizes = list(named.values())
  if any(not _is_int(s) or s == 0 or s < -1 for s in sizes):
    raise ConfigError(f"config.mesh={named}: sizes must be positive or -1 (the rest)")
  if sizes.count(-1) > 1:
    raise ConfigError(f"config.mesh={named}: at most one axis may be -1")
  if config.parallelism == "pmap" and (named["fsdp"] != 1 or named["tensor"] != 1):
    raise ConfigError(f"config.parallelism='pmap' replicates the state: config.mesh.fsdp="
                      f"{named['fsdp']} and config.mesh.tensor={named['tensor']} must be 1 "
                      "(use parallelism='jit' to shard the model)")


def validate(config) -> None:
  """Raises `ConfigError` on the first value that cannot work (or is missing), naming its
  key."""
  for key in ("model", "data", "decode", "mesh"):
    _get(config, key)
  _check_model(config)
  _check_data(config)
  _check_parallelism(config)
  _positive(config, "num_train_steps", "warmup_steps", "grad_accum_steps", "log_every_steps",
            "checkpoint_every_steps", "keep_checkpoints", "eval_every_steps",
            "decode.beam_size", "decode.batch_size", "num_average")
  _non_negative(config, "decode.max_extra_len", "bleu_every_steps", "bleu_num_sentences",
                "loss_chunk_tokens")
  if not isinstance(_get(config, "compilation_cache_dir"), str):
    raise ConfigError(f"config.compilation_cache_dir={config.compilation_cache_dir!r} must be "
                      "a folder path, or '' for no cache")
  _rate(config, "label_smoothing")
  _choice(config, "dtype", DTYPES)
  _choice(config, "on_nonfinite", ("stop", "skip"))
  from transformer.decoding import cpu_workarounds  # jax is loaded already (by _check_model)

  _choice(config, "cpu_workarounds", cpu_workarounds.SETTINGS)
  if not _get(config, "warn_loss_factor") > 1:
    raise ConfigError(f"config.warn_loss_factor={config.warn_loss_factor!r} must be > 1")
  if _get(config, "decode.length_penalty") < 0:
    # Early stopping bounds a live hypothesis by its score at the longest length, which
    # needs a penalty that grows with length.
    raise ConfigError(f"config.decode.length_penalty={config.decode.length_penalty} must be "
                      ">= 0")
  b1, b2, eps = (_get(config, k) for k in ("adam_b1", "adam_b2", "adam_eps"))
  if eps <= 0 or not (0 <= b1 < 1 and 0 <= b2 < 1):
    raise ConfigError(f"config.adam_b1/adam_b2 must be in [0, 1) and adam_eps > 0 (got "
                      f"{b1}, {b2}, {eps})")


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
