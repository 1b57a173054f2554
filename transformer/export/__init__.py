"""Trained models out of the codebase (CTranslate2 and Hugging Face Marian model folders), and
Marian / OPUS-MT models into it.

  python -m transformer.export --workdir=W --format=ctranslate2 --output=DIR
  python -m transformer.export --workdir=W --num_average=5 --format=ctranslate2 \\
      --output=DIR --quantization=int8
  python -m transformer.export --workdir=W --format=huggingface --output=DIR

`model_source` reads a workdir (its config, the latest or averaged checkpoints, the shared
vocabulary) into NumPy and refuses, in one line naming the key, a model that a format cannot
express. `to_ctranslate2` builds the CTranslate2 model through that package's own spec API;
`to_huggingface` writes a `MarianMTModel` folder with safetensors; neither needs PyTorch.
`ctranslate2_search` and `huggingface_search` decode with an exported model and rank and
bound as this project's beam search does (the engines' own `length_penalty` divides by
`|Y|^α`, the project by the GNMT penalty `((5 + |Y|) / 6)^α`; `search_rule` holds the
project's rule). `from_marian` turns a Hugging Face Marian folder (any OPUS-MT model) into a
workdir: `python -m transformer.export.from_marian --config=C --model=DIR --workdir=W`.
`speed` measures the project's decoder beside CTranslate2 float32 and int8,
each at its fastest documented setting on the same cores, and transformers. docs/export.md has
the commands, what the equality tests check, and the figures.
"""
