"""Fine-tuning from another run's checkpoint (`config.init_from`,
transformer/training/init_from.py): a fresh run starts from the source's parameters with a
fresh optimiser and step, reports what it loaded, refuses another shape (unless partial) or
another vocabulary in one line, and resumes its own checkpoints, not the source's."""

import logging

import jax
import numpy as np
import pytest

from tests import support
from tests.conftest import TRAINED_STEPS
from transformer.data import tokenizer as tokenizer_lib
from transformer.errors import ConfigError
from transformer.model import transformer as model_lib
from transformer.run import checkpoint
from transformer.training import init_from
from transformer.training import train_lib

_STEPS = 4


def _fine_tune_config(copy_of_trained):
  """The trained run's config, fine-tuning from its copy for `_STEPS` steps in another workdir,
  reading the copy's data cache (its vocabulary and tokenized splits)."""
  config, source = copy_of_trained
  config.init_from = str(source)
  config.num_train_steps = config.checkpoint_every_steps = _STEPS
  config.eval_every_steps = config.log_every_steps = 1
  config.bleu_every_steps = 0
  config.data.cache_dir = str(source / "data")
  return config, source


def _params(workdir, step):
  return checkpoint.Checkpointer(str(workdir), read_only=True).restore_params(step)


def test_a_fine_tuning_run_starts_from_the_source_and_resumes_its_own(copy_of_trained,
                                                                     tmp_path, caplog):
  config, source = _fine_tune_config(copy_of_trained)
  caplog.set_level(logging.INFO)
  config.num_train_steps = 2
  train_lib.train_and_evaluate(config, str(tmp_path / "tuned"))
  assert f"init_from {source} (step {TRAINED_STEPS}): loaded " in caplog.text
  assert "newly initialised 0; refused for their shape 0; not used 0" in caplog.text
  # Step 1 starts from the source's parameters: its loss is about the trained model's dev
  # loss, far below a fresh model's first (about log(vocabulary size) = 6.9).
  first_loss = dict(support.logged(tmp_path / "tuned"))[1]
  trained_dev_loss = dict(support.logged(source, "dev/loss"))[TRAINED_STEPS]
  assert first_loss < trained_dev_loss + 1.0 < 6.0, (first_loss, trained_dev_loss)
  # Resumed to _STEPS from its own checkpoint 2 (the source is not read again), it ends as an
  # uninterrupted fine-tuning run does.
  caplog.clear()
  config.num_train_steps = _STEPS
  train_lib.train_and_evaluate(config, str(tmp_path / "tuned"), allow_config_changes=True)
  assert "init_from" not in caplog.text
  train_lib.train_and_evaluate(config, str(tmp_path / "straight"))
  jax.tree.map(np.testing.assert_array_equal, _params(tmp_path / "tuned", _STEPS),
               _params(tmp_path / "straight", _STEPS))
  assert checkpoint.Checkpointer(str(tmp_path / "tuned"), read_only=True).steps() == [2, _STEPS]


def test_another_shape_is_refused_unless_partial(copy_of_trained, tmp_path, caplog):
  config, source = _fine_tune_config(copy_of_trained)
  config.model.d_ff = 96
  # The feed-forward layers' two kernels and first bias, in each stack.
  with pytest.raises(ConfigError, match=r"config.init_from=.*: \['decoder'\]\['layer_0'\]\['ffn'\]"
                                        r"\['wi'\]\['bias'\] \(128,\) -> \(96,\) \(shape there -> "
                                        r"here, and 5 more\): a model of another shape; "
                                        r"config.init_from_partial=True starts such parameters"):
    train_lib.train_and_evaluate(config, str(tmp_path / "refused"))
  # With config.init_from_partial the run starts from `init_from.load` (the refusal above shows
  # train_lib calling it): the source's leaves where the shapes agree, its own draws elsewhere.
  fresh = model_lib.init_params(model_lib.build_model(config), jax.random.key(0))
  caplog.set_level(logging.INFO)
  started = init_from.load(fresh, str(source), partial=True, vocab=None)
  assert "newly initialised 0; refused for their shape 6 (" in caplog.text, caplog.text
  theirs = dict(jax.tree_util.tree_leaves_with_path(_params(source, TRAINED_STEPS)))
  refused = 0
  for (path, leaf), drawn in zip(jax.tree_util.tree_leaves_with_path(started),
                                 jax.tree.leaves(fresh)):
    expected = theirs[path] if theirs[path].shape == leaf.shape else drawn
    refused += theirs[path].shape != leaf.shape
    np.testing.assert_array_equal(leaf, expected, err_msg=jax.tree_util.keystr(path))
  assert refused == 6


def test_a_missing_checkpoint_or_another_vocabulary_is_one_line(copy_of_trained, tmp_path):
  config, source = _fine_tune_config(copy_of_trained)
  config.init_from = f"{source}:7"
  with pytest.raises(ConfigError, match=rf"has no checkpoint 7 \(it has \[60, {TRAINED_STEPS}\]\)"):
    train_lib.train_and_evaluate(config, str(tmp_path / "a"))
  config.init_from = str(tmp_path)
  with pytest.raises(ConfigError, match="no checkpoint in"):
    train_lib.train_and_evaluate(config, str(tmp_path / "b"))
  config.init_from = str(source)
  config.data.vocab_path = str(tmp_path / "other.model")
  tokenizer_lib.train_vocabulary([f"satz nummer {i} mit worten" for i in range(300)],
                                 tmp_path / "other.model", vocab_size=60)
  with pytest.raises(ConfigError, match=r"was trained with another vocabulary \(.*\) than this "
                                        r"run's \(.*other.model\); fine-tune with the source's: "
                                        r"--config.data.vocab_path="):
    train_lib.train_and_evaluate(config, str(tmp_path / "c"))
