"""Evaluates a trained workdir: BLEU on a split, or translation of a text file.

  python evaluate.py --workdir=runs/base --num_average=5
  python evaluate.py --workdir=runs/demo --input=in.txt --output=out.txt
  python evaluate.py --config=configs/base.py --workdir=runs/base --config.decode.beam_size=1

The workdir's config.json (saved when training started) is the config unless --config is
given; a --config that describes another model (shape or vocabulary) is refused, naming the
keys. Scores are sacreBLEU (signature printed), the paper's tokenized compound-split BLEU and
chrF. The work is done by `transformer.evaluation.evaluate_lib`; this file only parses flags.
"""

from absl import flags
from ml_collections import config_flags

from transformer import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "The config the workdir was trained with, to change decoding or data "
    "paths (default: WORKDIR/config.json).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir holding checkpoints/.")
_SPLIT = flags.DEFINE_string("split", None, "Split to score (default: config.data.test_split).")
_INPUT = flags.DEFINE_string("input", None, "Translate this text file ('-' = stdin) instead.")
_OUTPUT = flags.DEFINE_string("output", None, "Where --input's translations go (default stdout).")
_NUM_AVERAGE = flags.DEFINE_integer(
    "num_average", None, "Average the last k checkpoints (default: config.num_average; paper: "
    "5 for base, 20 for big). 1 = the latest checkpoint alone.")
flags.mark_flag_as_required("workdir")


def main(argv):
  del argv
  from transformer.evaluation import evaluate_lib
  from transformer.run import workdir
  cli.check_backend()
  config = workdir.config_for(_WORKDIR.value, _CONFIG.value)
  k = _NUM_AVERAGE.value or config.num_average
  if _INPUT.value:
    evaluate_lib.translate_file(config, _WORKDIR.value, _INPUT.value, _OUTPUT.value, k)
  else:
    evaluate_lib.evaluate_split(config, _WORKDIR.value, _SPLIT.value or config.data.test_split,
                                k)


if __name__ == "__main__":
  cli.run(main)
