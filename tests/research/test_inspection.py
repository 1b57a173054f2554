"""Looking inside a model: sentence vectors over real tokens only, attention weights, and
heatmaps of a trained workdir; bad input writes nothing."""

import subprocess
import sys

import jax
import numpy as np
import pytest
from matplotlib import image

from tests.conftest import REPO
from transformer.run import averaging
from transformer.research import inspection
from transformer.model import transformer as model_lib
from transformer.run import workdir as workdir_lib
from transformer.errors import ConfigError


@pytest.fixture(scope="module")
def trained_model(trained):
  config, workdir = trained
  return model_lib.build_model(config), averaging.average_params(str(workdir), 1)[0]


def test_pooled_embeddings_ignore_padding(trained_model):
  model, params = trained_model
  ids = np.array([[5, 6, 7, 8, 1], [9, 10, 1, 0, 0]], np.int32)
  padded = np.pad(ids, ((0, 0), (0, 6)))
  encoded = np.asarray(jax.jit(lambda p, x: model.apply({"params": p}, x, method="encode"))(
      params, ids))
  for pooling in inspection.POOLINGS:
    vectors = np.asarray(inspection.sentence_embeddings(model, params, ids, pooling))
    assert vectors.shape == (2, model.cfg.d_model)
    np.testing.assert_allclose(
        vectors, inspection.sentence_embeddings(model, params, padded, pooling), atol=1e-5)
  np.testing.assert_allclose(inspection.sentence_embeddings(model, params, ids, "mean")[1],
                             encoded[1, :3].mean(axis=0), atol=1e-5)
  np.testing.assert_allclose(inspection.sentence_embeddings(model, params, ids, "max")[1],
                             encoded[1, :3].max(axis=0), atol=1e-5)
  with pytest.raises(ConfigError, match="pooling='sum' is not one of mean, max, first"):
    inspection.sentence_embeddings(model, params, ids, "sum")


def test_attention_weights_are_distributions_and_the_decoder_is_causal(trained_model):
  model, params = trained_model
  weights = inspection.attention_weights(model, params, [5, 6, 7, 1], [9, 10, 1])
  heads = model.cfg.num_heads
  assert weights["encoder", "self_attention", 0].shape == (heads, 4, 4)
  assert weights["decoder", "self_attention", 0].shape == (heads, 3, 3)
  assert weights["decoder", "cross_attention", 0].shape == (heads, 3, 4)
  for w in weights.values():
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, atol=1e-5)
  assert np.all(np.triu(weights["decoder", "self_attention", 0], k=1) == 0)


def test_heatmaps_of_a_trained_workdir(trained, tmp_path):
  config, workdir = trained
  translation, written = inspection.inspect_sentence(config, workdir, "I like tea.", tmp_path)
  assert translation
  assert [p.name for p in written] == [
      "attention_encoder_self_layer0.png", "attention_decoder_self_layer0.png",
      "attention_decoder_cross_layer0.png", "positional_encoding.png"]
  for path in written:
    height, width, _ = image.imread(path).shape
    assert height > 100 and width > 100


def test_empty_sentence_or_no_checkpoint_is_one_line_writing_nothing(trained, tmp_path):
  config, workdir = trained
  with pytest.raises(ConfigError, match="--sentence is empty"):
    inspection.inspect_sentence(config, workdir, "  ", tmp_path / "out")
  untrained = tmp_path / "untrained"
  untrained.mkdir()
  workdir_lib.save_config(untrained, config)
  run = subprocess.run([sys.executable, "-m", "transformer.research.inspection", f"--workdir={untrained}",
                        "--sentence=Hello."], cwd=REPO, capture_output=True, text=True)
  assert run.returncode == 2 and run.stderr.startswith("error: no checkpoint in"), run.stderr
  assert run.stderr.count("\n") == 1
  assert sorted(p.name for p in tmp_path.rglob("*")) == ["config.json", "untrained"]
