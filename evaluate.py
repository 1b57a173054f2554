"""Evaluates a trained workdir: BLEU on a split, or translation of a text file.

  python evaluate.py --workdir=runs/base --num_average=5
  python evaluate.py --workdir=runs/base --checkpoint=best   # the best on the dev set
  python evaluate.py --workdir=runs/base --checkpoint=best --num_average=5  # and 4 before it
  python evaluate.py --workdir=runs/base --config.decode.beam_size=1   # greedy
  python evaluate.py --workdir=runs/demo --input=in.txt --output=out.txt
  python evaluate.py --workdir=runs/demo --input=in.txt --nbest=4          # n-best list
  python evaluate.py --workdir=runs/seed0 --ensemble=runs/seed1,runs/seed2  # an ensemble
  python evaluate.py --workdir=runs/demo --input=in.txt --sampling_temperature=1 \
      --sampling_topp=0.9 --sampling_seed=3                                  # sampling
  python evaluate.py --config=configs/base.py --workdir=runs/base --config.decode.beam_size=1
  python evaluate.py --workdir=runs/seed0 --record=tatoeba_small.seed0  # scores as records
  python evaluate.py --workdir=runs/base --comet_model=Unbabel/wmt22-comet-da \
      --comet_python=~/comet-env/bin/python                 # COMET beside BLEU and chrF

The workdir's config.json (saved when training started) is the config unless --config is
given, and `--config.KEY=VALUE` changes either (decoding, data paths; the saved file stays as
it is); a config that describes another model (shape or vocabulary) is refused, naming the
keys. A split's hypotheses and scores go to WORKDIR/eval/, named by what produced them:
`test_step500_avg5_beam4_alpha0.6.json` (split, newest step, checkpoints averaged, beam size
and length penalty) or `test_step500_greedy.json`, so evaluations with other settings never
replace each other. Scores are sacreBLEU (signature printed), the paper's tokenized
compound-split BLEU and chrF, and COMET with `--comet_model` (`transformer.evaluation.comet`).
The work is done by `transformer.evaluation.evaluate_lib`; this file only parses flags.
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
_CHECKPOINT = flags.DEFINE_enum(
    "checkpoint", "latest", ["latest", "best"], "latest: the last --num_average checkpoints; "
    "best: the checkpoint that scored best on the dev set during training (config.select), "
    "alone or (--num_average=k) with the k-1 checkpoints saved before it.")
_ENSEMBLE = flags.DEFINE_list(
    "ensemble", [], "More trained workdirs (WORKDIR, or WORKDIR:STEP for one checkpoint) "
    "decoding with --workdir's model as an ensemble: the mean of their log-probabilities. "
    "They must share --workdir's vocabulary.")
_NBEST = flags.DEFINE_integer(
    "nbest", 1, "With --input: write the K best beam hypotheses of each line, as "
    "'LINE ||| HYPOTHESIS ||| SCORE' (needs --config.decode.beam_size >= K).")
_TEMPERATURE = flags.DEFINE_float(
    "sampling_temperature", 0.0, "With --input: draw each translation from the model's "
    "distribution at this temperature (1 = as the model says) instead of searching.")
_TOPK = flags.DEFINE_integer("sampling_topk", 0, "Sampling: draw from the K most probable "
                             "tokens only (0 = all).")
_TOPP = flags.DEFINE_float("sampling_topp", 1.0, "Sampling: draw from the fewest most probable "
                           "tokens holding this much probability (1 = all).")
_SAMPLING_SEED = flags.DEFINE_integer("sampling_seed", 0, "Sampling: the seed; the same seed "
                                      "draws the same translations.")
_COMET_MODEL = flags.DEFINE_string(
    "comet_model", None, "Score the split with COMET too: a model name on the Hugging Face hub "
    "(Unbabel/wmt22-comet-da), a folder holding checkpoints/model.ckpt, or a model.ckpt.")
_COMET_PYTHON = flags.DEFINE_string(
    "comet_python", sys.executable, "The Python that runs COMET (an environment with "
    "unbabel-comet, which pins numpy<2: docs/evaluation.md).")
_RECORD = flags.DEFINE_string(
    "record", None, "Append the split's scores to results/evaluate.jsonl as records named "
    "evaluate.NAME.<device>.<split>.<score>, for the docs' tables.")
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
  best = _CHECKPOINT.value == "best"
  # The best checkpoint alone unless --num_average asks for the ones before it too.
  k = _NUM_AVERAGE.value or (1 if best else config.num_average)
  if best and _ENSEMBLE.value:
    cli.fail("--checkpoint=best decodes the workdir's own best checkpoint: drop --ensemble, "
             "or ensemble the latest checkpoints")
  sampling = _sampling()
  if _RECORD.value is not None:
    from transformer.evaluation import score_records
    if _INPUT.value:
      cli.fail("--record keeps a split's scores: --input has no references to score")
  if _INPUT.value and _COMET_MODEL.value:
    cli.fail("--comet_model scores a split against its references: --input has none")
    score_records.check_name(_RECORD.value)
  if _INPUT.value:
    evaluate_lib.translate_file(config, _WORKDIR.value, _INPUT.value, _OUTPUT.value, k,
                                nbest=_NBEST.value, sampling=sampling,
                                ensemble=_ENSEMBLE.value, best=best)
  else:
    if _NBEST.value != 1 or sampling:
      cli.fail("--nbest and --sampling_* apply to --input: a split is scored by its best "
               "translation")
    result = evaluate_lib.evaluate_split(config, _WORKDIR.value,
                                         _SPLIT.value or config.data.test_split, k,
                                         ensemble=_ENSEMBLE.value, best=best, comet=_comet())
    if _RECORD.value is not None:
      _record(result, config)


def _record(result: dict, config) -> None:
  """Appends `result`'s scores as records (process 0)."""
  import jax

  from transformer.evaluation import score_records
  made = score_records.make(_RECORD.value, result, config, _WORKDIR.value, _ENSEMBLE.value)
  if jax.process_index() == 0:
    print(f"appended {len(made)} records to {score_records.append(made)}")


def _comet():
  """The COMET scorer `--comet_model` asks for, or None."""
  if not _COMET_MODEL.value:
    return None
  from transformer.evaluation import comet
  return comet.Comet(_COMET_MODEL.value, _COMET_PYTHON.value)


def _sampling():
  """The sampling the flags ask for, or None: sampling is on with a temperature above 0."""
  if _TEMPERATURE.value == 0:
    if _TOPK.value or _TOPP.value != 1:
      cli.fail("--sampling_topk/--sampling_topp need --sampling_temperature (1 = the model's "
               "distribution)")
    return None
  from transformer.decoding import sampling
  try:
    return sampling.Sampling(_TEMPERATURE.value, _TOPK.value, _TOPP.value, _SAMPLING_SEED.value)
  except ValueError as e:
    cli.fail(str(e))


if __name__ == "__main__":
  _CONFIG = _define_config(sys.argv)
  cli.run(main)
