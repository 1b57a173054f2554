"""Time-to-BLEU suite: a real training run from start to test BLEU, and where its time goes.

  python -m benchmarks --config=configs/tatoeba_small.py --suite=time_to_bleu
  # longer: more steps, the whole test split
  ... --ttb_steps=400 --ttb_test_sentences=-1

Trains `--config` (configs/tatoeba_small.py reads the Tatoeba pairs in ../shared/data) for
`--ttb_steps` steps in a fresh workdir, then translates the first `--ttb_test_sentences` of
its test split with beam search and scores them. It does this `--ttb_runs` times (default 2)
with one compilation cache folder that starts empty: the first run compiles every program
and stores it, the later ones start with JAX's in-memory caches cleared (`jax.clear_caches`,
as a new process would) and read the programs from that folder. Each run's wall time is split
into
  * data: vocabulary and tokenized corpus (built by the first run, read by the later ones);
  * compilation: tracing, lowering and XLA compilation, or reading a program from the cache
    (`compilation.CompileMonitor`), in training (every bucket shape, ahead of step 1) and in
    evaluation (the decoding programs);
  * training: the rest of the training loop (steps, dev loss, checkpoints);
  * evaluation: the rest of restoring, decoding and scoring the test sentences;
with training target tokens/s (real tokens over the training time), dev perplexity and test
BLEU (sacreBLEU). Later runs give the same BLEU: the runs are deterministic.

With `--ttb_dev_bleu` the runs keep the config's dev BLEU during training (configs/
tatoeba_small.py: the whole dev split every 400 steps and at the last), and each run reports
what it cost: its seconds (`dev/bleu_seconds` summed), their share of the run and the last
dev sacreBLEU; then, outside the timing, the test sacreBLEU of the checkpoint dev BLEU chose
(`best_step`, `best_test_sacrebleu`; where `config.select` kept one), beside the last step's.

Its records (`records`) are named `time_to_bleu.<config>.<device>.steps<N>[.test<n>]
[.devbleu].run<i>.<figure>`: `.test<n>` where fewer than the whole test split were scored,
`.devbleu` with `--ttb_dev_bleu`.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import time

import jax
from absl import flags

from transformer.run import averaging
from transformer.run import best as best_lib
from transformer.run import compilation
from transformer.data import input_pipeline
from transformer.model import transformer as model_lib
from transformer.training import parallel
from transformer.research import runs as runs_lib
from transformer.evaluation import evaluate_lib
from transformer.training import train_lib
from benchmarks import common

_STEPS = flags.DEFINE_integer("ttb_steps", 60, "Training steps of each run.")
_TEST_SENTENCES = flags.DEFINE_integer(
    "ttb_test_sentences", 200, "Test sentences translated and scored (-1: the whole split).")
_RUNS = flags.DEFINE_integer("ttb_runs", 2, "Runs sharing one compilation cache folder that "
                             "starts empty (the first compiles, the others read it).")
_DEV_BLEU = flags.DEFINE_bool(
    "ttb_dev_bleu", False, "Keep the config's dev BLEU during training (bleu_every_steps, "
    "bleu_num_sentences) and report its seconds and share of the run.")


def _training_tokens(run: runs_lib.Run) -> float:
  """Real target tokens trained on, from the per-interval rates in metrics.jsonl."""
  tokens, last_step = 0.0, 0
  for m in run.metrics:
    if "train/target_tokens_per_sec" in m:
      seconds = (m["step"] - last_step) / m["train/steps_per_sec"]
      tokens += m["train/target_tokens_per_sec"] * seconds
      last_step = m["step"]
  return tokens


def run_once(config, workdir: str, monitor: compilation.CompileMonitor,
             test_sentences: int) -> dict:
  """One run in `workdir` (emptied first); returns its figures."""
  shutil.rmtree(workdir, ignore_errors=True)
  t0 = time.time()
  data = input_pipeline.create_datasets(
      config, workdir, rows_multiple=parallel.create(config).rows_multiple)
  t1 = time.time()
  train_lib.train_and_evaluate(config, workdir, data=data)
  t2 = time.time()
  model = model_lib.build_model(config)
  params, _ = averaging.average_params(workdir, 1)  # the last checkpoint
  pairs = data.splits[config.data.test_split]
  pairs = pairs if test_sentences < 0 else pairs[:test_sentences]
  _, scores = evaluate_lib.translate_and_score(model, params, data.tokenizer, pairs, config,
                                               progress=False)
  t3 = time.time()
  logged = runs_lib.load_run(pathlib.Path(workdir))
  chosen = _dev_chosen(logged, workdir, model, data.tokenizer, pairs, config)
  compile_train, compile_eval = monitor.seconds(t1, t2), monitor.seconds(t2, t3)
  training = t2 - t1 - compile_train
  return {
      "total_s": t3 - t0, "data_s": t1 - t0,
      "compile_s": monitor.seconds(t0, t3), "compile_train_s": compile_train,
      "compile_eval_s": compile_eval, "training_s": training,
      "evaluation_s": t3 - t2 - compile_eval,
      "compile_share": monitor.seconds(t0, t3) / (t3 - t0),
      "target_tokens_per_sec": _training_tokens(logged) / training,
      "dev_perplexity": logged.last("dev/perplexity"),
      "test_sentences": len(pairs), "test_sacrebleu": scores["sacrebleu"]["score"],
      **_dev_bleu(logged, t3 - t0), **chosen,
  }


def _dev_chosen(logged: runs_lib.Run, workdir: str, model, tokenizer, pairs, config) -> dict:
  """Where dev BLEU ran: the step it chose (`workdir/best/`) and that checkpoint's test
  sacreBLEU, scored after the run's timing, beside the last step's."""
  if (not any("dev/bleu_seconds" in m for m in logged.metrics)
      or best_lib.saved_step(workdir) is None):  # config.select='' keeps none
    return {}
  params, step = best_lib.BestSnapshot(workdir, read_only=True).restore_params()
  _, scores = evaluate_lib.translate_and_score(model, params, tokenizer, pairs, config,
                                               progress=False)
  return {"best_step": step, "best_test_sacrebleu": scores["sacrebleu"]["score"]}


def _dev_bleu(logged: runs_lib.Run, total_s: float) -> dict:
  """The seconds that dev BLEU during training took (`dev/bleu_seconds`: decoding, its
  programs' compilation and scoring; inside `compile_train_s` and `training_s`), their share
  of the run and the evaluations; none where the run computed no dev BLEU."""
  seconds = [m["dev/bleu_seconds"] for m in logged.metrics if "dev/bleu_seconds" in m]
  if not seconds:
    return {}
  return {"dev_bleu_s": sum(seconds), "dev_bleu_share": sum(seconds) / total_s,
          "dev_bleu_evaluations": len(seconds), "dev_sacrebleu": logged.last("dev/sacrebleu")}


_HEADER = (f"{'run':<5}{'total s':>9}{'data s':>8}{'compile s':>11}{'(train':>8}{'eval)':>7}"
           f"{'training s':>12}{'eval s':>8}{'compile %':>11}{'tgt tok/s':>11}{'dev ppl':>9}"
           f"{'BLEU':>7}{'cache hit/miss':>16}")


def _row(r: dict) -> str:
  """One run's figures under `_HEADER`."""
  return (f"{r['run']:<5}{r['total_s']:>9.1f}{r['data_s']:>8.1f}{r['compile_s']:>11.1f}"
          f"{r['compile_train_s']:>8.1f}{r['compile_eval_s']:>7.1f}{r['training_s']:>12.1f}"
          f"{r['evaluation_s']:>8.1f}{r['compile_share']:>11.1%}"
          f"{r['target_tokens_per_sec']:>11,.0f}{r['dev_perplexity'] or float('nan'):>9.2f}"
          f"{r['test_sacrebleu']:>7.2f}{r['cache_hits']:>9}/{r['cache_misses']}")


def prepared(config, steps: int, root: str, dev_bleu: bool = False):
  """A copy of `config` as the suite runs it: `steps` steps, one dev evaluation and one
  checkpoint at the end, no BLEU during training (with `dev_bleu`, the config's own);
  vocabulary, tokenized corpus and compiled programs under `root` (emptied first)."""
  config = config.copy_and_resolve_references()
  config.update(num_train_steps=steps, eval_every_steps=steps, checkpoint_every_steps=steps,
                log_every_steps=min(config.log_every_steps, steps), bleu_at_end=False)
  if not dev_bleu:
    config.bleu_every_steps = 0
  config.data.cache_dir = os.path.join(root, "data")
  config.compilation_cache_dir = os.path.join(root, "xla-cache")
  shutil.rmtree(root, ignore_errors=True)
  return config


def run(config, workdir: str) -> dict:
  """Runs the suite (see the module docstring); prints a table and returns the figures."""
  steps = _STEPS.value
  root = os.path.join(workdir, "time_to_bleu")
  config = prepared(config, steps, root, _DEV_BLEU.value)
  with compilation.persistent_cache(config.compilation_cache_dir) as cache:
    runs = []
    for i in range(_RUNS.value):
      if i:
        jax.clear_caches()  # what a new process would start without
      with compilation.CompileMonitor() as monitor:
        figures = run_once(config, os.path.join(root, f"run{i + 1}"), monitor,
                           _TEST_SENTENCES.value)
      figures.update(run=i + 1, cache_hits=monitor.cache_hits,
                     cache_misses=monitor.cache_misses)
      runs.append(figures)
      print(f"run {i + 1} of {_RUNS.value} done: {_row(figures)}", flush=True)  # long on a CPU

  print(f"\ntime to BLEU — {common.device_name()}; {steps} steps, "
        f"{runs[0]['test_sentences']} test sentences (beam {config.decode.beam_size}); "
        f"compilation cache {cache or 'off'}")
  print(_HEADER)
  for r in runs:
    print(_row(r))
  print("compile = tracing + lowering + XLA compilation or cache reads (wall time, parallel "
        "compilations counted once); training and eval exclude it")
  for r in (r for r in runs if "dev_bleu_s" in r):
    chosen = (f"; the step it chose, {r['best_step']}, scores {r['best_test_sacrebleu']:.2f} "
              "test sacreBLEU" if "best_step" in r else "")
    print(f"run {r['run']}: dev BLEU during training {r['dev_bleu_s']:.1f} s over "
          f"{r['dev_bleu_evaluations']} evaluations ({r['dev_bleu_share']:.1%} of the run; "
          f"last dev sacreBLEU {r['dev_sacrebleu']:.2f}){chosen}")
  return {"steps": steps, "compilation_cache": cache, "dev_bleu": _DEV_BLEU.value,
          "whole_test_split": _TEST_SENTENCES.value < 0, "runs": runs}


# The unit of each figure of a run, for its record.
UNITS = {"total_s": "s", "data_s": "s", "compile_s": "s", "compile_train_s": "s",
         "compile_eval_s": "s", "training_s": "s", "evaluation_s": "s",
         "compile_share": "fraction", "target_tokens_per_sec": "tokens/s",
         "dev_bleu_s": "s", "dev_bleu_share": "fraction", "dev_bleu_evaluations": "evaluations",
         "dev_sacrebleu": "BLEU", "best_step": "step", "best_test_sacrebleu": "BLEU",
         "dev_perplexity": "perplexity", "test_sacrebleu": "BLEU", "cache_hits": "programs",
         "cache_misses": "programs"}


def records(figures: dict) -> list[tuple[str, float, str]]:
  """`(name, figure, unit)` of every run's figures, for `benchmarks/__main__.py` to record."""
  tests = figures["runs"][0]["test_sentences"]
  whole = figures.get("whole_test_split", False)
  prefix = (f"steps{figures['steps']}" + ("" if whole else f".test{tests}")
            + (".devbleu" if figures.get("dev_bleu") else ""))
  return [(f"{prefix}.run{r['run']}.{key}", float(r[key]), unit)
          for r in figures["runs"] for key, unit in UNITS.items() if r.get(key) is not None]
