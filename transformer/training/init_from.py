"""Fine-tuning: a run's first parameters taken from another run's checkpoint.

`config.init_from='WORKDIR'` (its latest checkpoint; a model imported from OPUS-MT by
`transformer.export.from_marian` is such a workdir) or `'WORKDIR:STEP'` starts a fresh run
from that checkpoint's parameters instead of random ones; the optimiser's state and the step
start fresh, as for any new run. Each parameter of this run's model is taken from the source
when the source has it at the same shape; one the source lacks starts fresh (newly
initialised); one of another shape is refused in one line, unless
`config.init_from_partial=True` starts it fresh too. The vocabulary must be the source's. A
report of what was loaded, initialised and refused is logged. A run that resumes reads its own
checkpoints: the source is read only when the run starts from step 0.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from absl import logging

from transformer.errors import ConfigError
from transformer.run import averaging
from transformer.run import checkpoint


def source_params(spec: str, vocab: dict | None) -> tuple[Any, int]:
  """`(params, step)` of the checkpoint `spec` names, as host arrays; `vocab` (this run's
  vocabulary record, None without one) must be the source's.

  Raises:
    ConfigError: one line, when the workdir has no such checkpoint or another vocabulary.
  """
  workdir, step = averaging.parse_spec(spec)
  ckpt = checkpoint.Checkpointer(workdir, read_only=True)
  steps = ckpt.steps()
  if not steps:
    raise ConfigError(f"config.init_from={spec}: no checkpoint in {ckpt.directory}; name a "
                      "trained workdir (WORKDIR or WORKDIR:STEP)")
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise ConfigError(f"config.init_from={spec}: {ckpt.directory} has no checkpoint {step} "
                      f"(it has {steps})")
  theirs = (ckpt.latest_meta() or {}).get("vocab") or _configured_vocab(workdir)
  if vocab and theirs and theirs.get("sha256") != vocab.get("sha256"):
    raise ConfigError(f"config.init_from={spec} was trained with another vocabulary "
                      f"({theirs.get('path')}) than this run's ({vocab.get('path')}); "
                      f"fine-tune with the source's: --config.data.vocab_path={theirs.get('path')}")
  return ckpt.restore_params(step), step


def _configured_vocab(workdir: str) -> dict | None:
  """The vocabulary record of a workdir whose checkpoints hold none (a model imported by
  `transformer.export.from_marian`): its config's `data.vocab_path`, where it names one."""
  from transformer.data import tokenizer as tokenizer_lib
  from transformer.run import workdir as workdir_lib

  try:
    path = workdir_lib.load_config(workdir).data.vocab_path
  except ConfigError:
    return None
  return tokenizer_lib.open_vocabulary(path).record() if path else None


def load(params: Any, spec: str, partial: bool, vocab: dict | None) -> Any:
  """`params` (a fresh run's, on their devices) with each leaf the source `spec` holds at the
  same shape replaced by the source's, placed as the fresh leaf is; logs the report.

  Raises:
    ConfigError: one line, when a leaf has another shape in the source and not `partial`,
      or as `source_params`.
  """
  source, step = source_params(spec, vocab)
  theirs = {jax.tree_util.keystr(path): leaf
            for path, leaf in jax.tree_util.tree_leaves_with_path(source)}
  loaded, new, refused = [], [], []

  def take(path, leaf):
    key = jax.tree_util.keystr(path)
    if key not in theirs:
      new.append(key)
      return leaf
    if theirs[key].shape != leaf.shape:
      refused.append((key, f"{key} {tuple(theirs[key].shape)} -> {tuple(leaf.shape)}"))
      return leaf
    loaded.append(key)
    return jax.device_put(np.asarray(theirs[key], leaf.dtype), leaf.sharding)

  out = jax.tree_util.tree_map_with_path(take, params)
  if refused and not partial:
    raise ConfigError(f"config.init_from={spec}: {refused[0][1]} (shape there -> here"
                      f"{f', and {len(refused) - 1} more' if len(refused) > 1 else ''}): a "
                      "model of another shape; config.init_from_partial=True starts such "
                      "parameters fresh")
  unused = sorted(set(theirs) - set(loaded) - {key for key, _ in refused})
  logging.info("init_from %s (step %d): loaded %d parameters; newly initialised %d%s; "
               "refused for their shape %d%s; not used %d%s", spec, step, len(loaded),
               len(new), _named(new), len(refused), _named([r for _, r in refused]), len(unused),
               _named(unused))
  return out


def _named(keys: list[str]) -> str:
  return f" ({', '.join(keys[:5])}{', ...' if len(keys) > 5 else ''})" if keys else ""
