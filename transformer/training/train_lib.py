"""Training: the loop `train_and_evaluate`: build, restore or initialise, loop (step, log,
evaluate, save), finish. What one step computes is `steps`."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Callable, NamedTuple

import jax
import optax
from absl import logging

from transformer.run import best as best_lib
from transformer.run import checkpoint
from transformer.run import config_checks
from transformer import errors
from transformer.training import finite_checks
from transformer.training import init_from
from transformer.training import metric_writer
from transformer.model import transformer as model_lib
from transformer.training import optimizer
from transformer.training import parallel
from transformer.training import selection as selection_lib
from transformer.training import steps as steps_lib
from transformer.training import supervision
from transformer.training import tracking
from transformer.run import workdir as workdir_lib


def train_and_evaluate(config, workdir: str, *, data=None,
                       allow_config_changes: bool = False) -> dict[str, float]:
  """Trains `config` in `workdir`, resuming from its newest good checkpoint; returns the last
  logged metrics (and the test-set scores).

  Checkpoints every `config.checkpoint_every_steps` and at the end; logs every
  `log_every_steps`; dev-set loss every `eval_every_steps`; dev-set BLEU every
  `bleu_every_steps` (0 = never); test-set BLEU and sample translations at the end. The
  dev metric `config.select` keeps the best step's parameters in `workdir/best/`;
  `config.patience` evaluations without a better one end the run early
  (`selection.Selection`). A
  non-finite loss or gradient stops the run (`errors.Diverged`) or skips the update
  (`config.on_nonfinite`); no checkpoint is ever written from non-finite parameters.
  The run is supervised (`supervision.Supervisor`): one trainer at a time per workdir;
  SIGTERM or SIGINT stop it after the step in flight with a checkpoint (`errors.Stopped`);
  running out of disk space or quota stops it with `errors.DiskFull`, whose one line names
  what was being written and the checkpoint the next run resumes from; a process of a
  multi-process run that fails, is lost or is stuck ends every process.

  Args:
    config: the experiment config.
    workdir: the run folder (checkpoints, logs, the data cache by default).
    data: the corpus as `input_pipeline.Datasets`; by default made from `config.data`. Any
      object with its fields will do (the multi-host test feeds an in-memory stream; its
      `tokenizer` and `eval_batches` may be None when no vocabulary or dev split is used).
    allow_config_changes: resume although keys other than model and data keys differ from
      the workdir's config.json (e.g. more steps); model and data keys never may.
  """
  config_checks.validate(config)
  config_checks.check_trainable(config)
  config_checks.check_workdir(workdir)
  with supervision.Supervisor(config, workdir) as supervisor:
    return _train(config, workdir, data, allow_config_changes, supervisor)


class _Run(NamedTuple):
  """What a run trains with (`_build`)."""
  config: Any
  workdir: str
  runner: Any  # parallel.create's
  model: model_lib.Transformer
  tx: optax.GradientTransformation
  ckpt: checkpoint.Checkpointer
  data: Any  # input_pipeline.Datasets, or an object with its fields
  init_rng: jax.Array
  dropout_rng: jax.Array


def _train(config, workdir: str, data, allow_config_changes: bool,
           supervisor: supervision.Supervisor) -> dict[str, float]:
  """Build, restore or initialise, loop (step, log, evaluate, save), finish."""
  changes = _check_saved_config(config, workdir, allow_config_changes)
  if config.comet_model and jax.process_index() == 0:  # before training, not at its first use
    _comet_scorer(config).check()
  run = _build(config, workdir, data)
  init = lambda: _initial_state(run)  # one function, so JAX traces it once for both uses
  abstract = _abstract_state(run, init)
  supervisor.watch_checkpoints(run.ckpt, abstract)
  step, state, meta = _restore_or_init(run, abstract, init)
  if jax.process_index() == 0 and (meta is None or changes):
    with errors.writing("the run's config", workdir_lib.config_path(workdir)):
      workdir_lib.save_config(workdir, config)
  progress = _Progress(metric_writer.LogWindow((meta or {}).get("log")),
                       selection_lib.Selection.from_config(config, (meta or {}).get("select")),
                       best_lib.BestSnapshot(workdir))
  progress.best.forget_after(step)
  more = step < config.num_train_steps and not progress.selection.exhausted
  train_step, eval_step = _compile(run, state, more, supervisor)
  with metric_writer.MetricWriter(workdir, config.num_train_steps, start_step=step,
                                  tracker=tracking.create(config, workdir)) as writer:
    state, step, last = _loop(run, train_step, eval_step, state, step, progress, writer,
                              supervisor)
    return {**last, **_finish(run, state, step, writer, supervisor)}


def _build(config, workdir: str, data) -> _Run:
  """The run's runner, model, optimizer, checkpoints, corpus (made from `config.data` unless
  `data` is given) and random keys."""
  runner = parallel.create(config)
  ckpt = checkpoint.Checkpointer(workdir, keep=config.keep_checkpoints,
                                 keep_full=config.keep_full_checkpoints)
  if config.data.vocab_path and ckpt.steps():  # before the corpus is tokenized with it
    from transformer.data import tokenizer as tokenizer_lib

    meta = ckpt.latest_meta()
    if meta and meta.get("vocab"):
      tokenizer_lib.open_vocabulary(config.data.vocab_path).check_matches(meta["vocab"])
  if data is None:
    from transformer.data import input_pipeline  # tensorflow-datasets is imported on use

    data = input_pipeline.create_datasets(config, workdir, rows_multiple=runner.rows_multiple)
  init_rng, dropout_rng = jax.random.split(jax.random.key(config.seed))
  return _Run(config, workdir, runner, model_lib.build_model(config),
              optimizer.create_optimizer(config), ckpt, data, init_rng,
              steps_lib.dropout_key(dropout_rng, config.dropout_rng_impl))


def _initial_state(run: _Run) -> steps_lib.TrainState:
  return steps_lib.create_train_state(run.model, run.tx, run.init_rng)


def _abstract_state(run: _Run, init: Callable[[], steps_lib.TrainState]
                    ) -> steps_lib.TrainState:
  """The train state's shapes, dtypes and shardings only (`init` traced, not run): a run
  that resumes restores into these and never computes the initial state, so it holds one
  train state, not two."""
  abstract = run.runner.abstract_init(init)
  logging.info("model: %s parameters", f"{model_lib.count_params(abstract.params):,}")
  return abstract


def _restore_or_init(run: _Run, abstract: steps_lib.TrainState,
                     init: Callable[[], steps_lib.TrainState]
                     ) -> tuple[int, steps_lib.TrainState, dict | None]:
  """`(step, state, metadata)`: the newest good checkpoint's, or step 0's (`init` run by the
  runner, with `config.init_from`'s parameters where it names one) and None."""
  restored = run.ckpt.restore_latest(abstract)
  if restored is None:
    state = run.runner.init_state(init)
    if run.config.init_from:  # fine-tuning: another run's parameters, a fresh optimiser
      vocab = run.data.tokenizer.record() if run.data.tokenizer else None
      state = state.replace(params=init_from.load(state.params, run.config.init_from,
                                                  run.config.init_from_partial, vocab))
    return 0, state, None
  step, state, data_state, meta = restored
  if run.data.tokenizer:
    run.data.tokenizer.check_matches(meta["vocab"])
  run.data.train.set_state(data_state)
  logging.info("resumed from %s at step %d", run.ckpt.directory, step)
  if step >= run.config.num_train_steps:
    logging.info("training already finished (step %d of config.num_train_steps=%d); "
                 "evaluating its final parameters", step, run.config.num_train_steps)
  return step, state, meta


def _compile(run: _Run, state: steps_lib.TrainState, more: bool,
             supervisor: supervision.Supervisor) -> tuple[Callable, Callable]:
  """The train and eval steps, compiled for the batch shapes ahead where there are `more`
  steps to train."""
  config = run.config
  train_step = run.runner.compile_train_step(
      steps_lib.make_train_step(run.model, run.tx, config, axis_name=run.runner.axis_name),
      state)
  eval_step = run.runner.compile_eval_step(steps_lib.make_eval_step(run.model, config))
  if more:
    with supervisor.not_stepping():
      steps_lib.compile_batch_shapes(run.runner, train_step, eval_step, state,
                                     run.dropout_rng, run.data, config)
  return train_step, eval_step


class _Progress(NamedTuple):
  """What a run carries from step to step besides the train state, and saves with it."""
  window: metric_writer.LogWindow  # the steps since the last log
  selection: selection_lib.Selection  # the best dev score so far (config.select)
  best: best_lib.BestSnapshot  # its parameters


def _loop(run: _Run, train_step, eval_step, state: steps_lib.TrainState, step: int,
          progress: _Progress, writer: metric_writer.MetricWriter,
          supervisor: supervision.Supervisor
          ) -> tuple[steps_lib.TrainState, int, dict[str, float]]:
  """Trains from `step` to `config.num_train_steps` (or until `config.patience` runs out),
  logging, evaluating and saving as the config says; returns the state, its step and the last
  logged metrics. Raises `errors.Stopped` after a checkpoint where a signal asked to stop,
  `errors.Diverged` where the loss or gradients stopped being finite
  (`config.on_nonfinite='stop'`)."""
  config, data = run.config, run.data
  schedule = optimizer.learning_rate_schedule(config)
  vocab_record = data.tokenizer.record() if data.tokenizer else None
  finite = finite_checks.FiniteChecks(config.on_nonfinite == "stop", run.ckpt, writer)
  window, selection = progress.window, progress.selection
  # Dev BLEU every `bleu_every_steps` and at the last step, where there is a dev split.
  bleu_every = config.bleu_every_steps if data.splits.get(config.data.eval_split) else 0
  last: dict[str, float] = {}

  def save(step: int) -> None:
    finite.check(newest_too=True)  # never a checkpoint of non-finite parameters
    logging.info("saving checkpoint %d", step)
    run.ckpt.save(step, run.runner.host_state(state), data.train.get_state(),
                  {"vocab": vocab_record, "step": step, "log": window.state(),
                   "select": selection.state()})

  def evaluated(step: int, scores: dict[str, float], evaluation: str) -> None:
    writer.write(step, scores, prefix="dev")
    if selection.scored_by(evaluation) and selection.update(step, scores):
      finite.check(newest_too=True)
      progress.best.save(step, run.runner.host_state(state.params),
                         {"step": step, "metric": config.select, "value": selection.best})
      logging.info("best so far: %s", selection.describe())

  with supervisor.training():
    while (step < config.num_train_steps and not selection.exhausted
           and not supervisor.should_stop(step)):
      batch = run.runner.place_batch(next(data.train))
      state, step_metrics = train_step(state, batch, run.dropout_rng)
      step += 1
      finite.add(step, step_metrics["nonfinite"])
      supervisor.step_done()
      window.add(step_metrics)
      final = step == config.num_train_steps
      if step % config.log_every_steps == 0 or final:
        finite.check(newest_too=True)
        last = _log(step, window, float(schedule(step - 1)), writer, config.warn_loss_factor)
      if data.eval_batches and (step % config.eval_every_steps == 0 or final):
        with supervisor.not_stepping():  # may compile the shapes of dev batches
          dev = steps_lib.evaluate_loss(eval_step, state.params, data.eval_batches(),
                                        run.runner, config.num_eval_batches)
        logging.info("step %d dev: %s", step, _fmt(dev))
        evaluated(step, dev, "loss")
      if bleu_every and (step % bleu_every == 0 or final):  # the last: a candidate best
        with supervisor.not_stepping():  # compiles and runs the decoder
          started = time.time()
          scores = _bleu(config, run.model, state.params, data, config.data.eval_split,
                         config.bleu_num_sentences)
          # What dev BLEU costs the run: decoding (compiled the first time) and scoring.
          evaluated(step, {**scores, "bleu_seconds": time.time() - started}, "bleu")
      if step % config.checkpoint_every_steps == 0 or final or selection.exhausted:
        save(step)
    supervisor.stop_if_asked(step, save, flush=writer.close)
  if selection.exhausted:
    logging.info("stopped early at step %d: config.patience=%d evaluations without a better "
                 "dev %s; the best is %s", step, config.patience, config.select,
                 selection.describe())
  progress.best.close()
  return state, step, last


def _finish(run: _Run, state: steps_lib.TrainState, step: int,
            writer: metric_writer.MetricWriter,
            supervisor: supervision.Supervisor) -> dict[str, float]:
  """Waits for the last save; then, when `config.bleu_at_end`, the test set's scores and sample
  translations, returned as `test_<score>`, and the scores of the checkpoint dev chose
  (`_test_at_best`)."""
  run.ckpt.wait()
  run.ckpt.close()
  supervisor.finished()
  config = run.config
  if not (config.bleu_at_end and config.data.test_split):
    return {}
  best_step = best_lib.saved_step(run.workdir)
  scores = _bleu(config, run.model, state.params, run.data, config.data.test_split, -1,
                 num_samples=config.num_samples_to_print,
                 write_to=(run.workdir, step, (False, True) if best_step == step else (False,)))
  writer.write(step, scores, prefix="test")
  if best_step is not None and best_step != step:
    _test_at_best(run)
  return {f"test_{k}": v for k, v in scores.items()}


def _test_at_best(run: _Run) -> None:
  """Scores the test split at the best checkpoint on dev (`config.select`), written as
  `evaluate.py --checkpoint=best` writes it, so that a run's dev-chosen test score needs no
  second command. (Where that checkpoint is the last, `_finish` writes its one decoding
  twice.)"""
  snapshot = best_lib.BestSnapshot(run.workdir, read_only=True)
  try:
    params, best_step = snapshot.restore_params()
  finally:
    snapshot.close()
  scores = _bleu(run.config, run.model, params, run.data, run.config.data.test_split, -1,
                 write_to=(run.workdir, best_step, (True,)))
  if jax.process_index() == 0:
    print(f"{run.config.data.test_split} at the checkpoint chosen on dev (step {best_step}): "
          f"sacreBLEU {scores['sacrebleu']:.2f}, chrF {scores['chrf']:.2f}")


def _log(step: int, window: metric_writer.LogWindow, learning_rate: float,
         writer: metric_writer.MetricWriter, warn_loss_factor: float) -> dict[str, float]:
  """Writes the means of the steps since the last log (`window`) and returns them; warns when
  the loss is far above its first logged value."""
  last = window.close(learning_rate)
  writer.write(step, last)
  writer.progress(step, {k: last[k] for k in ("loss", "perplexity", "learning_rate",
                                               "target_tokens_per_sec")})
  if last["loss"] > warn_loss_factor * window.first_loss:
    logging.warning("training loss %.4g at step %d is above %g x its first logged value "
                    "(%.4g): the run may be diverging", last["loss"], step, warn_loss_factor,
                    window.first_loss)
  return last


def _check_saved_config(config, workdir: str, allow_changes: bool) -> list[str]:
  """The keys that differ from the workdir's saved config (refused where they may not)."""
  path = workdir_lib.config_path(workdir)
  if not path.is_file():
    return []
  try:
    saved = json.loads(path.read_text())
  except ValueError as e:
    raise errors.ConfigError(f"{path} cannot be read ({e}); move it away to start this "
                             "workdir's config afresh") from None
  workdir_lib.keep_added_keys(config, workdir_lib.fill_added_keys(saved))
  changed = workdir_lib.check_resume_config(saved, config, allow_changes=allow_changes)
  if changed:
    logging.warning("resuming with config changes: %s", ", ".join(changed))
  return changed


def _comet(config, pairs, hypotheses) -> dict:
  """COMET's scores of `hypotheses` by `config.comet_model`, computed by process 0 and given to
  every process, so that all of them choose the same best checkpoint on dev."""
  from transformer.run import coordination

  scored = ""
  if jax.process_index() == 0:
    scored = json.dumps(_comet_scorer(config).score_pairs(pairs, hypotheses))
  return json.loads(coordination.gather("comet", scored)[0])


def _comet_scorer(config):
  """The COMET scorer `config.comet_model` and `config.comet_python` name."""
  from transformer.evaluation import comet

  return comet.Comet(config.comet_model, config.comet_python or sys.executable)


def _fmt(d: dict) -> str:
  return ", ".join(f"{k} {v:.4g}" for k, v in d.items())


def _bleu(config, model, params, data, split: str, num_sentences: int,
          num_samples: int = 0, write_to: tuple[str, int, tuple[bool, ...]] | None = None
          ) -> dict[str, float]:
  """Decodes `split` (its first `num_sentences`; all of it for 0 or less, as
  `config.bleu_num_sentences=0` asks); returns its scores by name.

  With `write_to=(workdir, step, kinds)`, the translations and scores are also written under
  `workdir/eval/` as `evaluate.py --num_average=1` writes them for checkpoint `step`: for
  each of `kinds`, as the latest checkpoint (False) or as the best on dev (True,
  `--checkpoint=best`).
  """
  from transformer.evaluation import evaluate_lib
  from transformer.evaluation import scoring

  pairs = data.splits[split]
  if num_sentences > 0:
    pairs = pairs[:num_sentences]
  hypotheses, scores = evaluate_lib.translate_and_score(model, params, data.tokenizer, pairs,
                                                        config)
  if config.comet_model:
    scores["comet"] = _comet(config, pairs, hypotheses)
  for best in write_to[2] if write_to else ():
    evaluate_lib.write_outputs(write_to[0], split, [write_to[1]], config, pairs, hypotheses,
                               scores, best=best)
  report = scoring.format_scores(scores)
  if not num_samples:
    logging.info("%s (%d sentences): %s", split, len(pairs), report)
  elif jax.process_index() == 0:  # the end-of-training report: on stdout, once
    print(f"\n{split} ({len(pairs)} sentences):\n{report}")
    for (src, ref), hyp in list(zip(pairs, hypotheses))[:num_samples]:
      print(f"  source     {src}\n  hypothesis {hyp}\n  reference  {ref}\n")
  return scoring.scalars(scores)
