"""A Marian / OPUS-MT folder imported as a workdir is transformers' `MarianMTModel`: built here
with transformers' own classes (random weights, biases and `final_logits_bias` included, two
SentencePiece models and a joint vocabulary numbered as OPUS-MT numbers it), the imported
model gives its logits, its tokens and its translations under the same search; at OPUS-MT's
real shape the logits agree too; an exported model comes back through the import unchanged;
what the project cannot express is one line."""

import io
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import tiny_config
from tests.conftest import REPO
from tests.export import packages
from transformer.data.synthetic import corpus
from transformer.errors import ConfigError
from transformer.export import from_marian, model_source
from transformer.model import transformer as model_lib

# OPUS-MT's transformer (Helsinki-NLP/opus-mt-en-de): 6 + 6 layers, 8 heads, Swish.
OPUS_MT = dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
               decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
               vocab_size=58101, max_position_embeddings=512)
TINY = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64)


@pytest.fixture(scope="module")
def torch():
  packages.require("transformers", extra="export-test")
  return packages.require("torch", extra="export-test")


@pytest.fixture(scope="module")
def pairs():
  return corpus.generate_pairs(400, seed=3)


def _spm(sentences, size: int) -> bytes:
  import sentencepiece as spm

  model = io.BytesIO()
  # Marian's SentencePiece ids (</s> 0, <unk> 1, no pad) are not the joint vocabulary's.
  spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model,
                                 vocab_size=size, eos_id=0, unk_id=1, bos_id=-1, pad_id=-1,
                                 num_threads=1, minloglevel=2)
  return model.getvalue()


def _marian_folder(torch, folder, pairs, vocab_size=None, **shape):
  """A `MarianMTModel` folder as OPUS-MT ships one: `</s>` 0, `<unk>` 1, the source's and the
  target's pieces, then `<pad>` last (padding `vocab_size`, if given, with unused pieces);
  every weight random, biases and `final_logits_bias` included."""
  import sentencepiece as spm
  from transformers import MarianConfig, MarianMTModel, MarianTokenizer

  folder.mkdir()
  protos = _spm([s for s, _ in pairs], 120), _spm([t for _, t in pairs], 140)
  pieces = ["</s>", "<unk>"]
  for proto in protos:
    sp = spm.SentencePieceProcessor(model_proto=proto)
    pieces += [p for p in map(sp.id_to_piece, range(sp.get_piece_size())) if p not in pieces]
  pieces += [f"<extra_{i}>" for i in range((vocab_size or 0) - len(pieces) - 1)] + ["<pad>"]
  for name, proto in zip(("source.spm", "target.spm"), protos):
    (folder / name).write_bytes(proto)
  (folder / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}))
  files = (str(folder / name) for name in ("source.spm", "target.spm", "vocab.json"))
  tokenizer = MarianTokenizer(*files, source_lang="src", target_lang="tgt")
  tokenizer.save_pretrained(folder)
  pad = len(pieces) - 1
  config = MarianConfig(**{"max_position_embeddings": 128, **shape, "vocab_size": len(pieces)},
                        activation_function="swish", scale_embedding=True, pad_token_id=pad,
                        decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0)
  torch.manual_seed(0)
  model = MarianMTModel(config).eval()
  with torch.no_grad():
    for p in model.parameters():
      if p.requires_grad:  # not the sinusoids
        p.add_(0.1 * torch.randn_like(p))
    model.final_logits_bias.normal_()
  model.save_pretrained(folder)
  return folder


@pytest.fixture(scope="module")
def tiny_marian(torch, tmp_path_factory, pairs):
  from transformers import MarianMTModel, MarianTokenizer

  folder = _marian_folder(torch, tmp_path_factory.mktemp("marian") / "model", pairs, **TINY)
  return folder, MarianMTModel.from_pretrained(folder).eval(), MarianTokenizer.from_pretrained(
      folder)


@pytest.fixture(scope="module")
def imported_workdir(tiny_marian, tmp_path_factory):
  """The workdir the command writes from the tiny Marian folder."""
  folder = tiny_marian[0]
  workdir = tmp_path_factory.mktemp("imported") / "workdir"
  done = subprocess.run(
      [sys.executable, "-m", "transformer.export.from_marian",
       f"--config={REPO / 'configs' / 'demo.py'}", f"--model={folder}", f"--workdir={workdir}"],
      cwd=REPO, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"wrote {workdir}" in done.stdout
  return workdir


@pytest.fixture(scope="module")
def imported(imported_workdir):
  """The imported workdir, read as the exports and evaluation read one."""
  return model_source.load(imported_workdir, 1)


def _their_ids(tokenizer, source) -> np.ndarray:
  """For each project id, the Marian id of the same piece."""
  vocab = tokenizer.get_vocab()
  return np.asarray([vocab[source.tokenizer.piece(i)] for i in range(source.tokenizer.vocab_size)])


def _plain(tokenizer, pairs, n):
  """`n` pairs that transformers' punctuation normaliser (sacremoses, where installed) leaves
  as they are: the project's vocabulary does not normalise."""
  return [(s, t) for s, t in pairs if tokenizer.normalize(s) == s][:n]


def test_the_vocabulary_gives_marian_tokenizer_s_pieces(tiny_marian, imported, pairs):
  _, _, tokenizer = tiny_marian
  theirs = _their_ids(tokenizer, imported)
  assert [imported.tokenizer.piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
  for source, target in _plain(tokenizer, pairs, 24):
    ours = imported.tokenizer.encode(source) + [1]
    assert theirs[ours].tolist() == tokenizer(source)["input_ids"]
    ours = imported.tokenizer.encode_batch([target], side="target")[0] + [1]
    assert theirs[ours].tolist() == tokenizer(text_target=target)["input_ids"]
    assert imported.tokenizer.decode(ours) == tokenizer.decode(
        theirs[ours], skip_special_tokens=True, use_source_tokenizer=False)


def _logits_both_ways(torch, model, tokenizer, source, pairs):
  """`(theirs, ours)`: teacher-forced logits of the Marian model and of the imported one, the
  Marian columns put in the project's id order, at the valid target positions."""
  theirs_of = _their_ids(tokenizer, source)
  width = lambda rows: max(map(len, rows))
  src = [source.tokenizer.encode(s) + [1] for s, _ in pairs]
  tgt = [source.tokenizer.encode_batch([t], side="target")[0] + [1] for _, t in pairs]
  src = np.asarray([r + [0] * (width(src) - len(r)) for r in src])
  tgt = np.asarray([r + [0] * (width(tgt) - len(r)) for r in tgt])
  pad = model.config.pad_token_id
  decoder_inputs = np.pad(theirs_of[tgt], ((0, 0), (1, 0)), constant_values=pad)[:, :-1]
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(theirs_of[src]),
                   attention_mask=torch.tensor(src != 0).long(),
                   decoder_input_ids=torch.tensor(decoder_inputs)).logits.numpy()
  ours = np.asarray(jax.jit(model_lib.build_model(source.config).apply)(
      {"params": source.params}, jnp.asarray(src), jnp.asarray(tgt)))
  valid = tgt != 0
  return theirs[..., theirs_of][valid], ours[valid]  # [tokens, V]


def test_the_imported_model_gives_marian_s_logits(torch, tiny_marian, imported, pairs):
  _, model, tokenizer = tiny_marian
  m = imported.model
  assert (m.activation, m.num_layers, m.d_model, m.attention_biases, m.output_bias,
          m.norm_epsilon) == ("swish", 2, 32, True, True, 1e-5)
  theirs, ours = _logits_both_ways(torch, model, tokenizer, imported, _plain(tokenizer, pairs, 8))
  assert np.abs(theirs).max() > 1  # random weights, not a constant
  np.testing.assert_allclose(theirs, ours, atol=5e-6, rtol=0)  # ε 1e-6 for 1e-5: 1.6e-5


@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_imported_model_translates_as_generate(torch, tiny_marian, imported, pairs,
                                                   beam_size):
  """The Marian model's own generate() (through `huggingface_search`, in Marian's ids) and the
  project's search over the imported workdir give the same translations."""
  from transformer.decoding import translate
  from transformer.export import huggingface_search

  _, model, tokenizer = tiny_marian
  theirs_of = _their_ids(tokenizer, imported)
  ours_of = np.argsort(theirs_of)

  class InMarianIds:  # the imported vocabulary, in the Marian model's ids
    encode = staticmethod(lambda text: theirs_of[imported.tokenizer.encode(text)].tolist())
    decode = staticmethod(lambda ids: imported.tokenizer.decode(ours_of[np.asarray(ids)]))

  config = imported.config.copy_and_resolve_references()
  config.decode.beam_size = beam_size
  sources = [s for s, _ in _plain(tokenizer, pairs, 10)]
  ours = translate.translate_texts(model_lib.build_model(config), imported.params,
                                   imported.tokenizer, sources, config, progress=False)
  d = config.decode
  theirs = huggingface_search.translate(
      model, InMarianIds, sources, beam_size=beam_size, alpha=d.length_penalty,
      max_extra_len=d.max_extra_len, max_len=config.model.max_len)
  assert ours == theirs
  assert len(set(ours)) > 1  # the random model does not answer every sentence alike


def test_opus_mt_s_real_shape_gives_marian_s_logits(torch, tmp_path, pairs):
  """OPUS-MT's shape and vocabulary size (58,101 pieces, <pad> the last), random weights."""
  from transformers import MarianMTModel, MarianTokenizer

  folder = _marian_folder(torch, tmp_path / "opus", pairs, **OPUS_MT)
  workdir = from_marian.import_model(folder, tmp_path / "workdir", tiny_config.get_config())
  source = model_source.load(workdir, 1)
  m = source.model
  assert (m.d_model, m.num_layers, m.d_ff, m.num_heads, m.vocab_size) == (512, 6, 2048, 8, 58101)
  model, tokenizer = MarianMTModel.from_pretrained(folder).eval(), MarianTokenizer.from_pretrained(
      folder)
  theirs, ours = _logits_both_ways(torch, model, tokenizer, source, _plain(tokenizer, pairs, 2))
  np.testing.assert_allclose(theirs, ours, atol=2e-4, rtol=0)  # 9.2e-5 measured


def test_fine_tuning_starts_from_the_imported_parameters_with_their_vocabulary_only(
    imported_workdir, imported, trained):
  """configs/finetune.py makes the imported workdir's config a fine-tuning run's, and
  `config.init_from` reads its checkpoint 0 (a parameter snapshot, no metadata): its
  vocabulary, named by its config, is checked all the same."""
  from configs import finetune
  from transformer.data import tokenizer as tokenizer_lib
  from transformer.run import config_checks
  from transformer.training import init_from

  tuned = finetune.get_config(str(imported_workdir))
  config_checks.validate(tuned)
  assert tuned.model == imported.config.model and tuned.init_from == str(imported_workdir)
  assert tuned.data.vocab_path == imported.tokenizer.path

  params, step = init_from.source_params(str(imported_workdir), imported.tokenizer.record())
  assert step == 0
  jax.tree.map(np.testing.assert_array_equal, params, imported.params)
  config, workdir = trained
  other = tokenizer_lib.load_tokenizer(config, workdir).record()
  assert finetune.get_config(str(workdir)).data.vocab_path == other["path"]
  with pytest.raises(ConfigError, match="another vocabulary") as e:
    init_from.source_params(str(imported_workdir), other)
  assert "\n" not in str(e.value)


def test_an_export_comes_back_through_the_import_unchanged(trained, tmp_path):
  """Export -> import -> export: every file of the second export is the first's, byte for
  byte, but export.json (which names its workdir)."""
  packages.require("safetensors")
  from transformer.export import to_huggingface

  config, workdir = trained
  first = to_huggingface.export(model_source.load(workdir, 1), tmp_path / "first")
  again = from_marian.import_model(first, tmp_path / "imported", config)
  second = to_huggingface.export(model_source.load(again, 1), tmp_path / "second")
  names = sorted(p.name for p in first.iterdir())
  assert names == sorted(p.name for p in second.iterdir())
  for name in names:
    if name != "export.json":
      assert (first / name).read_bytes() == (second / name).read_bytes(), name


def _edited(folder, tmp_path, **changes):
  import shutil

  copy = tmp_path / "edited"
  shutil.copytree(folder, copy)
  hf = json.loads((copy / "config.json").read_text())
  hf.update(changes)
  (copy / "config.json").write_text(json.dumps(hf))
  return copy


@pytest.mark.parametrize("changes, says", [
    (dict(decoder_layers=1), "encoder_layers=2 but decoder_layers=1"),
    (dict(share_encoder_decoder_embeddings=False), "separate source and target vocabularies"),
    (dict(scale_embedding=False), "scale_embedding=False"),
    (dict(activation_function="gelu_new"), "activation_function='gelu_new'"),
    (dict(model_type="bart"), "model_type='bart'")], ids=str)
def test_what_the_project_cannot_express_is_one_line_and_writes_nothing(tiny_marian, tmp_path,
                                                                        changes, says):
  folder = _edited(tiny_marian[0], tmp_path, **changes)
  with pytest.raises(ConfigError) as e:
    from_marian.import_model(folder, tmp_path / "workdir", tiny_config.get_config())
  assert says in str(e.value) and "\n" not in str(e.value)
  assert not (tmp_path / "workdir").exists()
