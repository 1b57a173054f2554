"""Choosing the checkpoint on the dev set (`config.select`) and stopping early
(`config.patience`): the best step's parameters kept in `workdir/best/`, decisions that a
resumed run makes as an uninterrupted one does, and `evaluate.py --checkpoint=best`."""

import json

import jax
import numpy as np
import pytest

from tests import support
from transformer.errors import ConfigError
from transformer.evaluation import evaluate_lib
from transformer.run import best as best_lib
from transformer.run import averaging
from transformer.run import checkpoint
from transformer.run import checkpoint_layout
from transformer.run import config_checks
from transformer.training import selection as selection_lib
from transformer.training import train_lib


def _selection(metric, patience=0, saved=None):
  config = support.tiny_config()
  config.select, config.patience = metric, patience
  return selection_lib.Selection.from_config(config, saved)


@pytest.mark.parametrize("metric, scores, best_step", [
    ("bleu", [10.0, 12.0, 12.0, 11.0], 2),  # higher is better; a tie keeps the earlier step
    ("chrf", [30.0, 29.0, 31.0, 30.5], 3),
    ("loss", [3.0, 2.5, 2.7, 2.5], 2),  # lower is better
    ("perplexity", [20.0, 21.0, 19.0, 19.0], 3),
])
def test_the_best_step_is_the_first_with_the_best_score(metric, scores, best_step):
  key = selection_lib.METRICS[metric][0]
  selection = _selection(metric)
  improved = [selection.update(step, {key: v}) for step, v in enumerate(scores, start=1)]
  assert selection.best_step == best_step and selection.best == scores[best_step - 1]
  assert improved == [True] + [step == best_step for step in range(2, len(scores) + 1)]
  assert selection.since_best == len(scores) - best_step and not selection.exhausted


def test_each_metric_is_a_score_its_evaluation_logs(trained):
  """Every `config.select` metric names a key that its evaluation computes: training logs
  each as `dev/<key>` (the trained run evaluated dev loss and dev BLEU; COMET needs a model)."""
  _, workdir = trained
  for metric, (key, _, evaluation) in selection_lib.METRICS.items():
    if metric != "comet":
      assert support.logged(workdir, f"dev/{key}"), (metric, evaluation)


def test_patience_counts_evaluations_since_the_best_and_resumes_from_the_saved_state():
  selection = _selection("loss", patience=2)
  for step, loss in ((1, 3.0), (2, 2.0), (3, 2.5)):
    selection.update(step, {"loss": loss})
  assert not selection.exhausted
  resumed = _selection("loss", patience=2, saved=json.loads(json.dumps(selection.state())))
  assert resumed == selection
  resumed.update(4, {"loss": 2.0})  # a tie is no improvement
  assert resumed.exhausted and resumed.best_step == 2
  # Another metric chosen on resume starts afresh; patience 0 never stops.
  assert _selection("bleu", saved=selection.state()).best is None
  never = _selection("loss")
  for step in range(1, 20):
    never.update(step, {"loss": 1.0})
  assert not never.exhausted


@pytest.mark.parametrize("select, bleu_every, message", [
    ("", 5, r"config.patience=3 counts evaluations of config.select's dev metric, and "
            r"config.select='' names none"),
    ("bleu", 0, r"config.patience=3 with config.select='bleu' needs dev BLEU during training, "
                r"and config.bleu_every_steps=0 computes none"),
])
def test_patience_without_its_metric_is_one_line(select, bleu_every, message):
  config = support.tiny_config()
  config.select, config.patience, config.bleu_every_steps = select, 3, bleu_every
  config_checks.validate(config)
  with pytest.raises(ConfigError, match=message):
    config_checks.check_trainable(config)


def test_selecting_on_comet_without_a_comet_model_is_one_line():
  config = support.tiny_config()
  config.select = "comet"
  config_checks.validate(config)
  with pytest.raises(ConfigError, match=r"^config.select='comet' needs COMET during training, "
                                        r"and config.comet_model='' names no model"):
    config_checks.check_trainable(config)
  config.comet_model = "Unbabel/wmt22-comet-da"
  config_checks.check_trainable(config)


def _early_stopping_config(copy_of_trained, steps):
  """The trained run's model from scratch, chosen on dev loss every 4 steps with patience 2. A
  warm-up of 5 steps makes it learn fast and then overshoot: the dev loss falls for three
  evaluations and rises after (a BLEU on so short a run is 0 at every evaluation, and a tie
  keeping the first, the best would never move)."""
  config, source = copy_of_trained
  config = config.copy_and_resolve_references()
  config.num_train_steps, config.warmup_steps = steps, 5
  config.checkpoint_every_steps = config.eval_every_steps = config.log_every_steps = 4
  config.bleu_every_steps = 0
  config.select, config.patience = "loss", 2
  config.keep_checkpoints = 10  # every checkpoint of the run, for averaging up to the best
  config.data.cache_dir = str(source / "data")  # its vocabulary and tokenized splits
  return config


def _params(workdir, step):
  return checkpoint.Checkpointer(str(workdir), read_only=True).restore_params(step)


def test_patience_stops_a_run_that_resumes_to_the_same_stop_and_best(copy_of_trained,
                                                                     tmp_path):
  config = _early_stopping_config(copy_of_trained, 60)
  train_lib.train_and_evaluate(config, str(tmp_path / "straight"))
  dev = support.logged(tmp_path / "straight", "dev/loss")
  stop = checkpoint.Checkpointer(str(tmp_path / "straight"), read_only=True).steps()[-1]
  assert stop < 60 and [s for s, _ in dev][-1] == stop  # stopped on its own, at an evaluation
  best_value = min(v for _, v in dev)
  best_step = next(s for s, v in dev if v == best_value)
  assert best_step > dev[1][0]  # the best moved on at least twice
  assert stop == best_step + 2 * 4  # two evaluations without a better score
  snapshot = best_lib.BestSnapshot(str(tmp_path / "straight"), read_only=True)
  assert snapshot.record() == {"step": best_step, "metric": "loss", "value": best_value}
  params, step = snapshot.restore_params()
  assert step == best_step
  jax.tree.map(np.testing.assert_array_equal, params, _params(tmp_path / "straight", best_step))
  # --checkpoint=best --num_average=3: the best and the two checkpoints saved before it.
  before = [s for s in checkpoint_layout.saved_steps(str(tmp_path / "straight")) if s < best_step]
  mean, steps = averaging.averaged_to_best(str(tmp_path / "straight"), 3)
  assert steps == [*before[-2:], best_step]
  expected = jax.tree.map(lambda *p: sum(np.asarray(x, np.float64) for x in p) / 3, params,
                          *(_params(tmp_path / "straight", s) for s in before[-2:]))
  jax.tree.map(lambda m, e: np.testing.assert_allclose(m, e, rtol=1e-6, atol=1e-7), mean,
               expected)
  with pytest.raises(ConfigError, match=rf"keeps {len(before)} checkpoint\(s\) before the "
                                        rf"best step {best_step}"):
    averaging.averaged_to_best(str(tmp_path / "straight"), len(before) + 2)

  # Stopped after the best and resumed: the same stop, the same best, the same log.
  workdir = tmp_path / "resumed"
  train_lib.train_and_evaluate(_early_stopping_config(copy_of_trained, best_step + 4),
                               str(workdir))
  for _ in range(2):  # the second run finds the first stopped early and trains no further
    train_lib.train_and_evaluate(config, str(workdir), allow_config_changes=True)
    assert checkpoint.Checkpointer(str(workdir), read_only=True).steps()[-1] == stop
  assert support.logged(workdir, "dev/loss") == dev
  assert support.logged(workdir) == support.logged(tmp_path / "straight")
  jax.tree.map(np.testing.assert_array_equal,
               best_lib.BestSnapshot(str(workdir), read_only=True).restore_params()[0], params)

  # evaluate.py --checkpoint=best: the best step's parameters score the test split, in files
  # of that step that say so.
  config.decode.beam_size = 1
  evaluate_lib.evaluate_split(config, str(workdir), "test", 1, best=True)
  scored = json.loads((workdir / "eval" / f"test_step{best_step}_best_greedy.json").read_text())
  assert (scored["checkpoint"], scored["steps"]) == ("best", [best_step])


def test_a_workdir_without_a_best_checkpoint_is_one_line(tmp_path):
  with pytest.raises(ConfigError, match=r"no best checkpoint in .*best: training keeps one "
                                        r"where config.select names a dev metric"):
    evaluate_lib.evaluate_split(support.synthetic_tiny(steps=1), str(tmp_path), "test", 1,
                                best=True)
