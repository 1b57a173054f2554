"""The CTranslate2 export computes the project's model: teacher-forced log-probabilities to
float32 tolerance (for the paper's model and every row of configs/modern.py CTranslate2 can
express), and greedy and beam-4 translations of the synthetic test split sentence for
sentence (so sacreBLEU too); a model the format cannot express is one line before anything is
written."""

import dataclasses
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import modern
from tests.conftest import REPO
from tests.export import packages
from transformer.errors import ConfigError
from transformer.export import model_source
from transformer.model import transformer as model_lib
from transformer.tokens import EOS_ID, PAD_ID

# Sentences of the synthetic test split translated both ways (all 500: ~1 min on 2 cores).
_NUM_SENTENCES = 64
# One thread per translator, as the tests' OMP_NUM_THREADS=1 (tests/conftest.py): with two,
# the second spins waiting for a core the other pytest worker holds, 15-80x the CPU time of
# the translations themselves (measured); the 64 translations compared were the same with two.
_THREADS = 1


@pytest.fixture(scope="module")
def ctranslate2():
  return packages.require("ctranslate2")


@pytest.fixture(scope="module")
def source(trained):
  _, workdir = trained
  return model_source.load(workdir, 1)


@pytest.fixture(scope="module")
def exported_folder(ctranslate2, source, tmp_path_factory):
  from transformer.export import to_ctranslate2

  return to_ctranslate2.export(source, tmp_path_factory.mktemp("ct2") / "model")


@pytest.fixture(scope="module")
def exported(ctranslate2, exported_folder):
  return ctranslate2.Translator(str(exported_folder), device="cpu", intra_threads=_THREADS)


@pytest.fixture(scope="module")
def test_pairs(trained):
  from transformer.data import input_pipeline

  config, workdir = trained
  return input_pipeline.load_split(config, str(workdir), "test")[:_NUM_SENTENCES]


def _project_log_probs(source, inputs: list[list[int]], targets: list[list[int]]):
  """log p(target token | prefix, source) of each target token, teacher-forced: one list per
  pair, from one padded batch (padding changes no output: tests/model/test_model.py)."""
  model = model_lib.build_model(source.config)

  def padded(rows):
    out = np.full((len(rows), max(map(len, rows))), PAD_ID, np.int32)
    for i, row in enumerate(rows):
      out[i, :len(row)] = row
    return jnp.asarray(out)

  logits = jax.jit(model.apply)({"params": source.params}, padded(inputs), padded(targets))
  log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  return [log_probs[i, np.arange(len(t)), t] for i, t in enumerate(targets)]


def _pieces(source, ids):
  return [source.tokenizer.piece(i) for i in ids]


def _assert_scores_match(translator, source, pairs):
  tok = source.tokenizer
  sources = [tok.encode(s) for s, _ in pairs]
  targets = [tok.encode(t) for _, t in pairs]
  scored = translator.score_batch([_pieces(source, s) for s in sources],
                                  [_pieces(source, t) for t in targets])
  expected = _project_log_probs(source, [s + [EOS_ID] for s in sources],
                                [t + [EOS_ID] for t in targets])
  for t, result, expected in zip(targets, scored, expected):
    assert result.tokens == _pieces(source, t + [EOS_ID])
    np.testing.assert_allclose(result.log_probs, expected, atol=2e-5, rtol=1e-5)


def test_teacher_forced_log_probs_equal_the_project_s(exported, source, test_pairs):
  _assert_scores_match(exported, source, test_pairs[:8])


def _untrained(source, change, seed=1):
  """`source` with `change(config)` applied and random parameters of the same size, every one
  moved off its initial value (biases from zero, norm scales from one), for the branches the
  paper's model does not take."""
  config = source.config.copy_and_resolve_references()
  change(config)
  params = model_lib.init_params(model_lib.build_model(config), jax.random.PRNGKey(seed))
  noise = np.random.default_rng(seed + 1)  # on the host: no program to compile per shape
  params = jax.tree.map(
      lambda p: np.asarray(p) + 0.1 * noise.standard_normal(p.shape, np.float32), params)
  return dataclasses.replace(source, config=config, params=model_source._as_numpy(params))


# The rows of configs/modern.py whose model differs from base's, but ALiBi and QK-norm
# (refused below); the others change only training and export as base does.
_EXPORTED_ROWS = [name for name in modern.NAMES
                  if name not in ("base", "alibi", "qk_norm", "qk_norm_l2", "z_loss", "adamw",
                                  "adafactor", "cosine", "wsd")]


@pytest.mark.parametrize("change", [lambda c: c.model.update(norm="pre"),
                                    lambda c: c.model.update(positional="learned"),
                                    *(modern.ROWS[modern.NAMES.index(n)]
                                      for n in _EXPORTED_ROWS)],
                         ids=["pre_ln_only", "learned", *_EXPORTED_ROWS])
def test_other_positions_norms_and_modern_rows_export_exactly(ctranslate2, source, tmp_path,
                                                              change, test_pairs):
  from transformer.export import to_ctranslate2

  other = _untrained(source, change)
  folder = to_ctranslate2.export(other, tmp_path / "model")
  translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=_THREADS)
  _assert_scores_match(translator, other, test_pairs[:3])


@pytest.mark.parametrize("beam_size", [1, 4])
def test_translations_and_sacrebleu_equal_the_project_s(ctranslate2, exported, exported_folder,
                                                        source, test_pairs, beam_size):
  from transformer.decoding import translate
  from transformer.evaluation import scoring
  from transformer.export import ctranslate2_search

  config = source.config.copy_and_resolve_references()
  config.decode.beam_size = beam_size
  sources = [s for s, _ in test_pairs]
  references = [r for _, r in test_pairs]
  model = model_lib.build_model(config)
  ours = translate.translate_texts(model, source.params, source.tokenizer, sources, config,
                                   progress=False)
  theirs = ctranslate2_search.translate(
      exported, source.tokenizer, sources, beam_size=beam_size,
      alpha=config.decode.length_penalty, max_extra_len=config.decode.max_extra_len,
      max_len=config.model.max_len)
  # Split into sub-batches of 2 sentences that two workers translate in parallel (the speed
  # tool's setting): the same translations.
  workers = ctranslate2.Translator(str(exported_folder), device="cpu", inter_threads=2,
                                   intra_threads=1)
  assert ctranslate2_search.translate(
      workers, source.tokenizer, sources, beam_size=beam_size,
      alpha=config.decode.length_penalty, max_extra_len=config.decode.max_extra_len,
      max_len=config.model.max_len, sub_batch=(2, "examples")) == theirs
  differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
  # A 120-step model still babbles: many of these sentences run to their length limit, where
  # (for beam search) the two searches may part (ctranslate2_search's docstring). None did
  # when this was written; a difference elsewhere is a mapping error.
  assert differ == [], [(sources[i], ours[i], theirs[i]) for i in differ[:3]]
  assert (scoring.score(theirs, references, "tgt")["sacrebleu"]["score"]
          == scoring.score(ours, references, "tgt")["sacrebleu"]["score"])


def test_int8_export_translates(ctranslate2, source, test_pairs, tmp_path):
  from transformer.export import ctranslate2_search
  from transformer.export import to_ctranslate2

  before = model_source.copied_params(source)
  folder = to_ctranslate2.export(source, tmp_path / "int8", "int8")
  # CTranslate2 quantizes the arrays it is given in place: the export gives it copies.
  jax.tree.map(np.testing.assert_array_equal, source.params, before)
  float32 = to_ctranslate2.export(source, tmp_path / "float32")
  # The position table (1,536 x D, float32 in both) is half of this tiny model's file.
  assert ((folder / "model.bin").stat().st_size
          < 0.7 * (float32 / "model.bin").stat().st_size)
  translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=_THREADS)
  out = ctranslate2_search.translate(translator, source.tokenizer,
                                     [s for s, _ in test_pairs[:4]], beam_size=4)
  assert len(out) == 4 and all(out)


@pytest.mark.parametrize("change, key", [
    (dict(d_k=8, d_v=8), "config.model.d_k=8 × num_heads=4 != d_model=64"),
    (dict(d_v=32, d_k=16), "config.model.d_k=16 differs from config.model.d_v=32"),
    (dict(positional="alibi"), "config.model.positional='alibi': ctranslate2 has no ALiBi in "
     "its encoder"),
    (dict(qk_norm="rms"), "config.model.qk_norm='rms': ctranslate2 has no query/key norm"),
    (dict(qk_norm="l2"), "config.model.qk_norm='l2': ctranslate2 has no query/key norm"),
])
def test_a_model_ctranslate2_cannot_express_is_one_line_and_writes_nothing(
    source, tmp_path, change, key):
  from transformer.export import to_ctranslate2

  config = source.config.copy_and_resolve_references()
  config.model.update(change)
  with pytest.raises(ConfigError) as e:
    to_ctranslate2.export(dataclasses.replace(source, config=config), tmp_path / "out")
  assert key in str(e.value) and "\n" not in str(e.value)
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("change, key", [
    (dict(norm="pre"), "config.model.norm='pre'"),
    (dict(positional="learned"), "config.model.positional='learned'"),
    (dict(norm_type="rmsnorm"), "config.model.norm_type='rmsnorm'"),
    (dict(activation="swiglu"), "config.model.activation='swiglu'"),
    (dict(positional="t5"), "config.model.positional='t5'"),
    (dict(num_kv_heads=2), "config.model.num_kv_heads=2"),
    (dict(tie_embeddings="none"), "config.model.tie_embeddings='none'")])
def test_what_marian_cannot_express_is_named(source, change, key):
  config = source.config.copy_and_resolve_references()
  config.model.update(change)
  with pytest.raises(ConfigError, match=key) as error:
    model_source.check_exportable(config.model, "huggingface")
  assert "--format=ctranslate2" in str(error.value) and "\n" not in str(error.value)
  model_source.check_exportable(config.model, "ctranslate2")  # CTranslate2 takes each


def test_command_line_exports_and_refuses_in_one_line(ctranslate2, trained, tmp_path):
  _, workdir = trained
  command = [sys.executable, "-m", "transformer.export", f"--workdir={workdir}",
             "--format=ctranslate2", f"--output={tmp_path / 'model'}", "--quantization=int8"]
  done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr
  assert (tmp_path / "model" / "model.bin").is_file()
  again = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
  assert again.returncode == 2
  assert again.stderr.strip().splitlines() == [
      f"error: --output={tmp_path / 'model'} exists and is not an empty folder; name a new "
      "one (an export never overwrites)"]
