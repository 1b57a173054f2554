"""Evaluation of a trained workdir: restore (or average) checkpoints, translate, score.

`evaluate.py` is a thin CLI over `evaluate_split` and `translate_file`; training-time
evaluation uses the same `translate.translate_texts` and `scoring.score`.
"""

from __future__ import annotations

import json
import os
import sys

import jax
from absl import logging

from transformer.run import checkpoint
from transformer.run import compilation
from transformer.run import config_checks
from transformer.evaluation import scoring
from transformer.data import textio
from transformer.model import transformer as model_lib
from transformer.decoding import translate
from transformer.errors import ConfigError


def _load(config, workdir: str, num_average: int):
  """The model, the (averaged) parameters, the vocabulary and the checkpoint steps used.

  The checkpoints are read first: a workdir without them is an error before anything else
  is read or written (the vocabulary of a synthetic corpus would otherwise be looked up by
  writing the corpus).
  """
  from transformer.data import tokenizer as tokenizer_lib

  config_checks.validate(config)
  compilation.use_persistent_cache(config.compilation_cache_dir)
  params, steps = checkpoint.average_params(workdir, num_average)
  tokenizer = tokenizer_lib.load_tokenizer(config, workdir)
  model = model_lib.build_model(config)
  return model, params, tokenizer, steps


def _tag(steps: list[int]) -> str:
  return f"step{steps[-1]}" + (f"_avg{len(steps)}" if len(steps) > 1 else "")


def evaluate_split(config, workdir: str, split: str, num_average: int) -> dict:
  """Translates `split` of the configured dataset and scores it against its references.

  Writes under `<workdir>/eval/`: `<split>_<tag>.txt` (detokenized hypotheses, one per line),
  `<split>_<tag>.json` (scores and signatures), and the compound-split tokenized hypotheses
  and references (`<split>_<tag>.hyp.tok.atat`, `.ref.tok.atat`) for multi-bleu.perl; and
  prints the scores.
  """
  from transformer.data import input_pipeline

  model, params, tokenizer, steps = _load(config, workdir, num_average)
  pairs = input_pipeline.load_split(config, workdir, split)
  sources = [s for s, _ in pairs]
  references = [r for _, r in pairs]
  hypotheses = translate.translate_texts(model, params, tokenizer, sources, config)
  scores = scoring.score(hypotheses, references, config.data.target_lang)
  result = {"split": split, "steps": steps, "num_sentences": len(pairs),
            "decode": config.decode.to_dict(), **scores}
  if jax.process_index() == 0:
    out_dir = os.path.join(workdir, "eval")
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"{split}_{_tag(steps)}")
    textio.write_lines(stem + ".txt", hypotheses)
    with open(stem + ".json", "w") as f:
      json.dump(result, f, indent=2)
    tokenized = scoring.write_tokenized(hypotheses, references, out_dir,
                                        config.data.target_lang,
                                        prefix=f"{split}_{_tag(steps)}.")
    print(f"{split} ({len(pairs)} sentences, checkpoint steps {steps}):")
    print(scoring.format_scores(scores))
    print(f"hypotheses: {stem}.txt\nscores:     {stem}.json\n"
          f"tokenized, compound-split (multi-bleu.perl): {tokenized[0]}, {tokenized[1]}")
  return result


def translate_file(config, workdir: str, input_path: str, output_path: str | None,
                   num_average: int) -> list[str]:
  """Translates `input_path` ('-' = stdin) line by line to `output_path` (None = stdout).

  Empty lines stay empty and in place, so the output aligns with the input. An output path
  that cannot be written is an error before anything is decoded.
  """
  if output_path:
    _check_writable(output_path)
  model, params, tokenizer, steps = _load(config, workdir, num_average)
  lines = textio.read_lines(input_path)
  logging.info("translating %d lines with checkpoint steps %s", len(lines), steps)
  hypotheses = translate.translate_texts(model, params, tokenizer, lines, config)
  if jax.process_index() == 0:
    if output_path:
      textio.write_lines(output_path, hypotheses)
    else:
      sys.stdout.write("".join(h + "\n" for h in hypotheses))
  return hypotheses


def _check_writable(path: str) -> None:
  folder = os.path.dirname(os.path.abspath(path))
  exists = os.path.exists(path)
  if not os.path.isdir(folder) or not os.access(path if exists else folder, os.W_OK):
    raise ConfigError(f"--output={path} cannot be written (no such folder, or no permission); "
                      "choose a writable path")
