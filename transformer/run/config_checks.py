"""Every static check of a config, and the workdir check, run before anything is built.

`validate(config)` is the one place a config value is judged on its own (types, ranges,
choices, keys that must agree with each other). Each key's type, range and allowed values are
declared once, in `transformer.run.schema` (`config.model`'s in `ModelConfig`), and checked
from there; this module adds the checks between keys. Checks that need the devices or the
data (mesh size against the device count, rows per device, vocabulary against the corpus)
stay where those are known: `parallel.create` and `input_pipeline.create_datasets`.

Each failure is a `ConfigError` whose message is one line naming the key and what is allowed;
the CLIs print it and exit without a traceback.
"""

from __future__ import annotations

from transformer.errors import ConfigError
from transformer.model import config as model_config
from transformer.model import position_schemes
from transformer.run import schema
from transformer.run import writable

MESH_AXES = schema.section_keys("mesh")  # the device mesh's axis names (`parallel.create`)


def _get(config, dotted: str):
  node = config
  for part in dotted.split("."):
    try:
      node = node[part]
    except KeyError:
      raise ConfigError(f"config.{dotted} is missing") from None
  return node


def _check_declared(config) -> None:
  """Every key `schema` declares: present, of its type, in its range or among its values."""
  allowed = model_config.config_fields()
  unknown = sorted(set(config.model) - set(allowed))
  if unknown:
    raise ConfigError(f"unknown key config.model.{unknown[0]}; config.model takes "
                      f"{', '.join(sorted(allowed))}")
  for name, key in schema.keys().items():
    key.check(_get(config, name))


def _check_model(config) -> None:
  m = config.model
  # The scheme's own checks; a value declared elsewhere than the registry (and judged there
  # by `_check_declared`) has none.
  if m.positional in position_schemes.names():
    position_schemes.get(m.positional).check(m)
  if m.attention_impl != "reference" and m.attention_dropout_rate > 0:
    raise ConfigError(f"config.model.attention_dropout_rate={m.attention_dropout_rate} needs "
                      f"attention_impl='reference' (got {m.attention_impl!r})")
  if m.attention_impl != "reference" and m.d_k != m.d_v:
    # jax.nn.dot_product_attention takes one head size for queries, keys and values.
    raise ConfigError(f"config.model.attention_impl={m.attention_impl!r} needs d_k == d_v "
                      f"(got {m.d_k} and {m.d_v}); use 'reference' for Table 3 row (B)")


def _check_departures(config) -> None:
  """The switches of the departures after the paper (configs/modern.py) that need another key."""
  m = config.model
  if m.num_kv_heads and m.num_heads % m.num_kv_heads:
    raise ConfigError(f"config.model.num_kv_heads={m.num_kv_heads} must divide num_heads="
                      f"{m.num_heads} (each key/value head serves a group of query heads)")
  if m.ffn_match_params and m.activation not in model_config.GATED:
    raise ConfigError(f"config.model.ffn_match_params=True scales gated feed-forwards only "
                      f"(activation one of {', '.join(map(repr, model_config.GATED))}; got "
                      f"{m.activation!r})")
  if config.weight_decay and config.optimizer != "adamw":
    raise ConfigError(f"config.weight_decay={config.weight_decay} needs optimizer='adamw' "
                      f"(decoupled weight decay); got {config.optimizer!r}")


def _check_data(config) -> None:
  data, max_len = config.data, config.model.max_len
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
  if any(not model_config.is_int(b) or b < 1 for b in data.bucket_boundaries):
    raise ConfigError(f"config.data.bucket_boundaries={tuple(data.bucket_boundaries)}: "
                      "lengths must be positive integers")


def _check_parallelism(config) -> None:
  named = {a: config.mesh[a] for a in MESH_AXES}
  sizes = list(named.values())
  if any(s == 0 or s < -1 for s in sizes):
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
  for section in schema.SECTIONS:
    _get(config, section)
  _check_declared(config)
  _check_model(config)
  _check_departures(config)
  _check_data(config)
  _check_parallelism(config)
  if not config.warn_loss_factor > 1:
    raise ConfigError(f"config.warn_loss_factor={config.warn_loss_factor!r} must be > 1")
  if config.decode.length_penalty < 0:
    # Early stopping bounds a live hypothesis by its score at the longest length, which
    # needs a penalty that grows with length.
    raise ConfigError(f"config.decode.length_penalty={config.decode.length_penalty} must be "
                      ">= 0")
  b1, b2, eps = config.adam_b1, config.adam_b2, config.adam_eps
  if eps <= 0 or not (0 <= b1 < 1 and 0 <= b2 < 1):
    raise ConfigError(f"config.adam_b1/adam_b2 must be in [0, 1) and adam_eps > 0 (got "
                      f"{b1}, {b2}, {eps})")


def check_trainable(config) -> None:
  """Raises `ConfigError` for what may be evaluated with but not trained with."""
  if config.dtype == "float16":
    # Without loss scaling, gradients below float16's smallest value (6e-8) become zero and
    # the largest overflow past 65504: training silently learns less, or diverges.
    raise ConfigError("config.dtype='float16' is refused for training: there is no loss "
                      "scaling, so small gradients underflow to zero; use 'bfloat16' "
                      "(float32's range, as fast on recent GPUs and TPUs) or 'float32' "
                      "(float16 stays available to evaluate.py)")
  if config.select == "comet" and not config.comet_model:
    raise ConfigError("config.select='comet' needs COMET during training, and "
                      "config.comet_model='' names no model: set it (a hub name such as "
                      "Unbabel/wmt22-comet-da, a folder or a model.ckpt; docs/evaluation.md)")
  _check_patience(config)


def _check_patience(config) -> None:
  """`config.patience` needs `config.select`'s metric computed during training."""
  if not config.patience:
    return
  every = {"bleu": "bleu_every_steps", "chrf": "bleu_every_steps",
           "comet": "bleu_every_steps", "loss": "eval_every_steps",
           "perplexity": "eval_every_steps"}.get(config.select)
  if every is None:
    raise ConfigError(f"config.patience={config.patience} counts evaluations of "
                      "config.select's dev metric, and config.select='' names none: set "
                      "config.select='bleu', 'chrf', 'comet', 'loss' or 'perplexity', or "
                      "config.patience=0")
  if every == "bleu_every_steps" and not config.bleu_every_steps:
    raise ConfigError(f"config.patience={config.patience} with config.select="
                      f"{config.select!r} needs dev BLEU during training, and "
                      "config.bleu_every_steps=0 computes none: set it, or select 'perplexity'")


def check_workdir(workdir: str) -> None:
  """Creates `workdir` if needed and proves it writable, or raises `ConfigError`."""
  if not workdir:
    raise ConfigError("--workdir is required: the folder for checkpoints, logs and outputs")
  reason = writable.cannot_write(workdir)
  if reason is not None:
    raise ConfigError(f"workdir {workdir!r} cannot be written ({reason}); "
                      "choose a folder you can write to")
