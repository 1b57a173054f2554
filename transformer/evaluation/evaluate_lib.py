"""Evaluation of a trained workdir: restore (or average) checkpoints, translate, score.

`evaluate.py` is a thin CLI over `evaluate_split` and `translate_file`; training-time BLEU
uses the same `translate_and_score`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Sequence

import jax
from absl import logging

from transformer.run import averaging
from transformer.run import checkpoint
from transformer.run import compilation
from transformer.run import config_checks
from transformer.run import writable
from transformer.evaluation import comet as comet_lib
from transformer.evaluation import scoring
from transformer.evaluation import stream
from transformer.data import textio
from transformer.model import transformer as model_lib
from transformer.decoding import sampling as sampling_lib
from transformer.decoding import translate
from transformer import errors
from transformer.errors import ConfigError


def _load(config, workdir: str, num_average: int, ensemble: Sequence[str] = (),
          best: bool = False):
  """The model, the (averaged) parameters, the vocabulary and the checkpoint steps used;
  with `best`, the parameters of the best checkpoint on the dev set (`transformer.run.best`)
  instead, averaged with the `num_average - 1` checkpoints before it; with `ensemble` (more
  workdirs, `WORKDIR` or `WORKDIR:STEP`), a tuple of the models and a tuple of their
  parameters, `workdir`'s first.

  The checkpoints are read first: a workdir without them is an error before anything else
  is read or written (the vocabulary of a synthetic corpus would otherwise be looked up by
  writing the corpus).
  """
  from transformer.data import tokenizer as tokenizer_lib

  config_checks.validate(config)
  if best:
    params, steps = averaging.averaged_to_best(workdir, num_average)
  else:
    params, steps = averaging.average_params(workdir, num_average)
  tokenizer = tokenizer_lib.load_tokenizer(config, workdir)
  model = model_lib.build_model(config)
  if not ensemble:
    return model, params, tokenizer, steps
  members = [_member(spec, num_average, tokenizer, workdir) for spec in ensemble]
  return ((model, *(m for m, _ in members)), (params, *(p for _, p in members)), tokenizer,
          steps)


def _member(spec: str, num_average: int, tokenizer, workdir: str):
  """`(model, params)` of an ensemble's member `WORKDIR` (its last `num_average` checkpoints
  averaged) or `WORKDIR:STEP` (that checkpoint), which must share `tokenizer`."""
  from transformer.data import tokenizer as tokenizer_lib
  from transformer.run import workdir as workdir_lib

  path, step = averaging.parse_spec(spec)
  config = workdir_lib.load_config(path)
  if step is None:
    params, _ = averaging.average_params(path, num_average)
  else:
    ckpt = checkpoint.Checkpointer(path, read_only=True)
    if step not in ckpt.steps():
      raise ConfigError(f"--ensemble={spec}: {ckpt.directory} has no checkpoint {step} (it "
                        f"has {ckpt.steps()})")
    params = ckpt.restore_params(step)
  theirs = tokenizer_lib.load_tokenizer(config, path)
  if theirs.sha256 != tokenizer.sha256:
    raise ConfigError(f"--ensemble={spec} was trained with another vocabulary ({theirs.path}) "
                      f"than {workdir} ({tokenizer.path}): an ensemble's models share one")
  return model_lib.build_model(config), params


def translate_and_score(model, params, tokenizer, pairs, config, *,
                        progress: bool = True) -> tuple[list[str], dict]:
  """Translates the sources of `pairs` (`(source, reference)` texts) and scores the
  translations against the references (`scoring.score`): `(hypotheses, scores)`."""
  hypotheses = translate.translate_texts(model, params, tokenizer, [s for s, _ in pairs], config,
                                         progress=progress)
  return hypotheses, scoring.score(hypotheses, [r for _, r in pairs], config.data.target_lang)


def decoding_tag(decode) -> str:
  """How hypotheses were decoded, for file names: `beam4_alpha0.6`, or `greedy` (beam size 1,
  where the length penalty plays no part)."""
  if int(decode["beam_size"]) == 1:
    return "greedy"
  return f"beam{int(decode['beam_size'])}_alpha{float(decode['length_penalty']):g}"


def output_stem(split: str, steps: list[int], decode, models: int = 1,
                best: bool = False) -> str:
  """The name shared by one evaluation's files: the split, the checkpoint step (and how many
  were averaged), `best` for the best checkpoint on dev, the ensemble's size and the
  decoding, e.g. `test_step500_avg5_beam4_alpha0.6`, `test_step300_best_greedy` or
  `test_step500_ens3_greedy`, so evaluations with other settings sit beside each other
  instead of replacing each other."""
  averaged = f"_avg{len(steps)}" if len(steps) > 1 else ""
  chosen = "_best" if best else ""
  ensemble = f"_ens{models}" if models > 1 else ""
  return f"{split}_step{steps[-1]}{averaged}{chosen}{ensemble}_{decoding_tag(decode)}"


def evaluate_split(config, workdir: str, split: str, num_average: int,
                   ensemble: Sequence[str] = (), best: bool = False,
                   comet: comet_lib.Comet | None = None) -> dict:
  """Translates `split` of the configured dataset and scores it against its references;
  with `ensemble` (more workdirs, `WORKDIR` or `WORKDIR:STEP`), `workdir`'s model and theirs
  translate as one (`transformer.decoding.ensemble`); with `best`, the best checkpoint on the
  dev set translates (`_load`); with `comet`, process 0 scores the translations with COMET too
  (`scores['comet']`, each sentence's score in its `segments`).

  Writes the files of `write_outputs` under `<workdir>/eval/` and prints the scores. A disk
  or quota that fills while they are written is one line (`errors.DiskFull`).
  """
  from transformer.data import input_pipeline

  with compilation.persistent_cache(config.compilation_cache_dir):
    model, params, tokenizer, steps = _load(config, workdir, num_average, ensemble, best)
    pairs = input_pipeline.load_split(config, workdir, split)
    hypotheses, scores = translate_and_score(model, params, tokenizer, pairs, config)
  if comet is not None and jax.process_index() == 0:
    scores["comet"] = comet.score_pairs(pairs, hypotheses)
  result, stem = write_outputs(workdir, split, steps, config, pairs, hypotheses, scores,
                               models=1 + len(ensemble), best=best)
  if jax.process_index() == 0:
    print(f"{split} ({len(pairs)} sentences, checkpoint steps {steps}):")
    print(scoring.format_scores(scores))
    print(f"hypotheses: {stem}.txt\nscores:     {stem}.json\n"
          f"tokenized, compound-split (multi-bleu.perl): {stem}.hyp.tok.atat, "
          f"{stem}.ref.tok.atat")
  return result


def write_outputs(workdir: str, split: str, steps: list[int], config, pairs, hypotheses,
                  scores: dict, models: int = 1, best: bool = False) -> tuple[dict, str]:
  """Writes one evaluation of `split` (by the checkpoints of `steps`, averaged when several)
  under `<workdir>/eval/`, named by `output_stem`: `<stem>.txt` (detokenized hypotheses, one
  per line), `<stem>.json` (scores, signatures and the decoding settings) and the
  compound-split tokenized hypotheses and references (`<stem>.hyp.tok.atat`, `.ref.tok.atat`)
  for multi-bleu.perl. Process 0 writes; every process returns `(result, stem)`: what
  `<stem>.json` holds and the path less its suffix. Training's end-of-run test score writes
  the same files, so a sweep's report has its test translations without evaluate.py.
  """
  result = {"split": split, "steps": list(steps), "num_sentences": len(pairs),
            "decode": config.decode.to_dict(), "models": models,
            "checkpoint": "best" if best else "latest", **scores}
  out_dir = os.path.join(workdir, "eval")
  name = output_stem(split, steps, config.decode, models, best)
  stem = os.path.join(out_dir, name)
  if jax.process_index() == 0:
    with errors.writing("the evaluation outputs", stem + ".*"):
      os.makedirs(out_dir, exist_ok=True)
      textio.write_lines(stem + ".txt", hypotheses)
      textio.write_text_atomically(stem + ".json", json.dumps(result, indent=2))
      scoring.write_tokenized(hypotheses, [r for _, r in pairs], out_dir,
                              config.data.target_lang, prefix=f"{name}.")
  return result, stem


def translate_file(config, workdir: str, input_path: str, output_path: str | None,
                   num_average: int, *, nbest: int = 1,
                   sampling: sampling_lib.Sampling | None = None,
                   ensemble: Sequence[str] = (), best: bool = False) -> list[str]:
  """Translates `input_path` ('-' = stdin) line by line to `output_path` (None = stdout).

  Empty lines stay empty and in place, so the output aligns with the input. With `nbest > 1`
  (beam search) the output is an n-best list instead (`nbest_lines`). `sampling` draws each
  translation (`transformer.decoding.sampling`); `ensemble` and `best` as `evaluate_split`'s.
  An output path that cannot be written, or an n-best list wider than the beam, is an error
  before anything is decoded.
  """
  _check_search(config, nbest, sampling)
  if output_path:
    _check_writable(output_path)
  with compilation.persistent_cache(config.compilation_cache_dir):
    model, params, tokenizer, steps = _load(config, workdir, num_average, ensemble, best)
    logging.info("translating %s with checkpoint steps %s", input_path, steps)
    if input_path == "-" and jax.process_count() == 1:  # a pipe or a terminal: as lines come
      batches = stream.batches(sys.stdin.buffer, int(config.decode.batch_size))
    else:
      batches = iter([textio.read_lines(input_path)])
    out, first = [], 0
    with _writer(output_path, streamed=input_path == "-") as write:
      for lines in batches:
        decoded = translate.decode_texts(model, params, tokenizer, lines, config, nbest=nbest,
                                         sampling=sampling, first_id=first,
                                         progress=input_path != "-")
        done = (nbest_lines(decoded, first) if nbest > 1
                else [h[0][0] if h else "" for h in decoded])
        write(done)
        out.extend(done)
        first += len(lines)
  return out


@contextlib.contextmanager
def _writer(output_path: str | None, streamed: bool):
  """`write(lines)`, from process 0: to stdout at once; to `output_path` at once when
  `streamed`, else whole or not at all once the writes are done (`textio.write_lines`)."""
  if jax.process_index() != 0:
    yield lambda lines: None
  elif output_path is None:
    yield lambda lines: (sys.stdout.write("".join(f"{l}\n" for l in lines)), sys.stdout.flush())
  else:
    with errors.writing("the translations", output_path):
      if streamed:
        with open(output_path, "w", encoding="utf-8") as f:
          yield lambda lines: (f.write("".join(f"{l}\n" for l in lines)), f.flush())
      else:
        written = []
        yield written.extend
        textio.write_lines(output_path, written)


def nbest_lines(decoded: list[list[tuple[str, float]]], first: int = 0) -> list[str]:
  """`LINE ||| HYPOTHESIS ||| SCORE` per hypothesis, an n-best list:
  LINE is the input line's number from 0 (`first` for `decoded`'s first), each line's
  hypotheses best first, SCORE the length-penalised log-probability the beam ranks them by. A
  blank input line has none."""
  return [f"{first + line} ||| {text} ||| {score:.4f}"
          for line, hypotheses in enumerate(decoded) for text, score in hypotheses]


def _check_search(config, nbest: int, sampling) -> None:
  beam = int(config.decode.beam_size)
  if nbest < 1:
    raise ConfigError(f"--nbest={nbest} must be at least 1")
  if nbest > 1 and sampling is not None:
    raise ConfigError(f"--nbest={nbest} lists beam search's hypotheses; sampling draws one "
                      "per line: drop one of them")
  if nbest > beam:
    raise ConfigError(f"--nbest={nbest} needs a beam at least as wide: pass "
                      f"--config.decode.beam_size={nbest} or more (it is {beam})")


def _check_writable(path: str) -> None:
  reason = writable.cannot_write(path, folder=False)
  if reason is not None:
    raise ConfigError(f"--output={path} cannot be written ({reason}); choose a writable path "
                      "in a folder that exists")
