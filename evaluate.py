"""Evaluates a trained workdir: BLEU on a split, or translation of a text file.

  python evaluate.py --workdir=runs/base --num_average=5
  python evaluate.py --workdir=runs/base --config.decode.beam_size=1   # greedy
  python evaluate.py --workdir=runs/demo --input=in.txt --output=out.txt
  python evaluate.py --config=configs/base.py --workdir=runs/base --config.decode.beam_size=1

The workdir's config.json (saved when training started) is the config unless --config is
given, and `--config.KEY=VALUE` changes either (decoding, data paths; the saved file stays as
it is); a config that describes another model (shape or vocabulary) is refused, naming the
keys. A split's hypotheses and scores go to WORKDIR/eval/, named by what produced them:
`test_step500_avg5_beam4_alpha0.6.json` (split, newest step, checkpoints averaged, beam size
and length penalty) or `test_step500_greedy.json`, so evaluations with other settings never
replace each other. Scores are sacreBLEU (signature printed), the paper's tokenized
compound-split BLEU and chrF. The work is done by `transformer.evaluation.evaluate_lib`; this
file only parses flags.
"""

import sys

from absl import flags
from ml_collections import config_flags

from transformer import cli

_CONFIG_HELP = ("The config the workdir was trained with, to change decoding or data paths "
                "(default: WORKDIR/config.json; --config.KEY=VALUE changes either).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir holding checkpoints/.")
_SPLIT = flags.DEFINE_string("split", None, "Split to score (default: config.data.test_split).")
_INPUT = flags.DEFINE_string("input", None, "Translate this text file ('-' = stdin) instead.")
_OUTPUT = flags.DEFINE_string("output", None, "Where --input's translations go (default stdout).")
_NUM_AVERAGE = flags.DEFINE_integer(
    "num_average", None, "Average the last k checkpoints (default: config.num_average; paper: "
    "5 for base, 20 for big). 1 = the latest checkpoint alone.")
flags.mark_flag_as_required("workdir")


def _workdir_in(argv: list[str]) -> str | None:
  """The value of `--workdir` in `argv` (`--workdir=W` or `--workdir W`), read before the
  flags are parsed."""
  for i, arg in enumerate(argv[1:], start=1):
    name, given, value = arg.partition("=")
    if name in ("--workdir", "-workdir"):
      return value if given else (argv[i + 1] if i + 1 < len(argv) else None)
  return None


def _as_tuples(node):
  """`node` (a config as nested dicts) with its lists as tuples: config.json has no tuples, and
  ml_collections overrides a tuple key (as a config file has it) but not a list."""
  if isinstance(node, dict):
    return {k: _as_tuples(v) for k, v in node.items()}
  return tuple(_as_tuples(v) for v in node) if isinstance(node, list) else node


def _define_config(argv: list[str]) -> flags.FlagHolder:
  """`--config`: the config file given; without one, the workdir's config.json, so that the
  `--config.KEY=VALUE` overrides apply to it. A workdir without a readable config.json is then
  a one-line error."""
  workdir = _workdir_in(argv)
  if cli.config_file_given(argv) or workdir is None:
    return config_flags.DEFINE_config_file("config", None, _CONFIG_HELP)
  import ml_collections

  from transformer.errors import ConfigError
  from transformer.run import workdir as workdir_lib
  try:
    saved = workdir_lib.load_config(workdir)
  except ConfigError as e:
    cli.fail(str(e))
  return cli.define_config(ml_collections.ConfigDict(_as_tuples(saved.to_dict())), argv,
                           _CONFIG_HELP)


def main(argv):
  del argv
  from transformer.evaluation import evaluate_lib  # once the flags are good
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
  _CONFIG = _define_config(sys.argv)
  cli.run(main)
