"""A tiny COMET model made with unbabel-comet's own classes, and its scores read through the
library directly: run by the Python that has COMET (tests/evaluation/test_comet.py), never
imported by the suite.

  python tests/comet_tiny_model.py build FOLDER TEXT   # FOLDER/checkpoints/model.ckpt
  python tests/comet_tiny_model.py score CHECKPOINT     # JSON {src, mt, ref} on stdin

`build` trains a SentencePiece vocabulary of 200 pieces on TEXT, writes a 2-layer, width-32
XLM-RoBERTa encoder's config and tokenizer beside it, and saves a `RegressionMetric` over it
with random weights (seed 0) as COMET's downloads are laid out (`hparams.yaml`,
`checkpoints/model.ckpt`). `score` prints COMET's `predict` scores, one per sentence, as a JSON
list: the reference the project's scorer is compared with.
"""

import json
import pathlib
import sys


def build(folder: pathlib.Path, text: str) -> None:
  import pytorch_lightning as pl
  import sentencepiece as spm
  import torch
  import yaml
  from comet.models import RegressionMetric
  from transformers import XLMRobertaConfig, XLMRobertaTokenizer

  encoder = folder / "encoder"
  encoder.mkdir(parents=True)
  spm.SentencePieceTrainer.train(input=text, model_prefix=str(encoder / "pieces"),
                                 vocab_size=200, character_coverage=1.0, num_threads=1,
                                 minloglevel=2)
  tokenizer = XLMRobertaTokenizer(str(encoder / "pieces.model"))
  tokenizer.save_pretrained(str(encoder))
  XLMRobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                   num_attention_heads=2, intermediate_size=64, max_position_embeddings=130,
                   pad_token_id=1, bos_token_id=0, eos_token_id=2).save_pretrained(str(encoder))
  torch.manual_seed(0)
  hparams = dict(pretrained_model=str(encoder), load_pretrained_weights=False,
                 hidden_sizes=[16], layer="mix", pool="avg", dropout=0.0,
                 final_activation="Sigmoid")
  model = RegressionMetric(**hparams)
  (folder / "hparams.yaml").write_text(yaml.safe_dump(dict(model.hparams)))
  (folder / "checkpoints").mkdir()
  torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams),
              "pytorch-lightning_version": pl.__version__},
             folder / "checkpoints" / "model.ckpt")


def score(checkpoint: str) -> None:
  from comet import load_from_checkpoint

  data = json.load(sys.stdin)
  samples = [dict(src=s, mt=m, ref=r) for s, m, r in zip(data["src"], data["mt"], data["ref"])]
  output = load_from_checkpoint(checkpoint).predict(samples, batch_size=3, gpus=0,
                                                    progress_bar=False)
  print(json.dumps([float(x) for x in output.scores]))


if __name__ == "__main__":
  if sys.argv[1] == "build":
    build(pathlib.Path(sys.argv[2]), sys.argv[3])
  else:
    score(sys.argv[2])
