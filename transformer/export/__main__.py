"""Exports a trained workdir for use outside this codebase.

  python -m transformer.export --workdir=runs/demo --format=ctranslate2 --output=exports/demo-ct2
  python -m transformer.export --workdir=runs/base --num_average=5 --format=ctranslate2 \\
      --output=exports/base-ct2-int8 --quantization=int8
  python -m transformer.export --workdir=runs/demo --format=huggingface --output=exports/demo-hf

The weights are the latest checkpoint, or the mean of the last k (`--num_average`, default
the workdir's `config.num_average`); the vocabulary is the workdir's SentencePiece model. A
model the format cannot express, an output folder that is not new or empty, or a missing
package is one line, before anything is written. The work is done by
`transformer.export.to_ctranslate2` and `to_huggingface`; docs/export.md shows the use of the
folders written.
"""

from absl import flags

from transformer import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir holding checkpoints/.")
_FORMAT = flags.DEFINE_string("format", None, "ctranslate2 or huggingface (MarianMTModel).")
_OUTPUT = flags.DEFINE_string("output", None, "The folder to write (new, or empty).")
_NUM_AVERAGE = flags.DEFINE_integer(
    "num_average", None, "Average the last k checkpoints (default: config.num_average). "
    "1 = the latest checkpoint alone.")
_QUANTIZATION = flags.DEFINE_string(
    "quantization", None, "CTranslate2 weight type: int8, int8_float16, float16, ... "
    "(default: float32).")
flags.mark_flags_as_required(["workdir", "format", "output"])

# What each format's export imports (neither needs PyTorch).
_PACKAGES = {"ctranslate2": "ctranslate2", "huggingface": "safetensors"}


def main(argv):
  del argv
  from transformer.errors import ConfigError
  from transformer.export import model_source
  from transformer.run import workdir as workdir_lib

  fmt = _FORMAT.value
  if fmt not in model_source.FORMATS:
    raise ConfigError(f"--format={fmt!r} is not one of "
                      f"{', '.join(map(repr, model_source.FORMATS))}")
  package = _PACKAGES[fmt]
  try:
    __import__(package)
  except ImportError:
    raise ConfigError(f"--format={fmt} needs the {package} package: "
                      "pip install -e '.[export]'") from None
  from transformer.export import to_ctranslate2

  config = workdir_lib.load_config(_WORKDIR.value)
  # Everything that can be refused without reading checkpoints is refused first.
  model_source.check_exportable(config.model, fmt)
  model_source.check_output(_OUTPUT.value)
  if fmt == "huggingface" and _QUANTIZATION.value is not None:
    raise ConfigError("--quantization is for --format=ctranslate2; the Hugging Face folder "
                      "holds float32 weights")
  if _QUANTIZATION.value not in (None, *to_ctranslate2.QUANTIZATIONS):
    raise ConfigError(f"--quantization={_QUANTIZATION.value!r} is not one of "
                      f"{', '.join(to_ctranslate2.QUANTIZATIONS)}")
  source = model_source.load(_WORKDIR.value, _NUM_AVERAGE.value or config.num_average)
  if fmt == "huggingface":
    from transformer.export import to_huggingface

    out = to_huggingface.export(source, _OUTPUT.value, workdir=_WORKDIR.value)
    print(f"wrote {out} (Hugging Face MarianMTModel, checkpoint steps {source.steps})")
    return
  out = to_ctranslate2.export(source, _OUTPUT.value, _QUANTIZATION.value,
                              workdir=_WORKDIR.value)
  print(f"wrote {out} (CTranslate2, {_QUANTIZATION.value or 'float32'}, checkpoint steps "
        f"{source.steps})")


if __name__ == "__main__":
  cli.run(main)
