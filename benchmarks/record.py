"""Time-to-BLEU records: a config raced against the record it means to beat, in one run.

  python -m benchmarks --suite=record --config=configs/tatoeba_fast.py --record_seeds=0,1,2 \\
      --record_against=configs/tatoeba_small.py --record_against_steps=1500 --record_bleu=22.62

A record is the wall time from a fresh start to a test BLEU: vocabulary and tokenized corpus
built, every program compiled, the model trained from scratch, the whole test split (or
`--record_test_sentences`) translated with the config's beam and scored with sacreBLEU. The
checkpoint scored is the one the run's dev metric chose (`config.select`; its dev BLEU during
training is part of the time), the test split looked at once for it; with
`--norecord_choose_on_dev`, the last step's, with no dev BLEU during training. Each run
is one `--suite=time_to_bleu` run on its own: a fresh workdir with its own empty data and
compilation cache folders and JAX's in-memory caches cleared, so every run pays what a
researcher's first run of a config pays (a cache named by JAX_COMPILATION_CACHE_DIR is used
as it is: `compilation.persistent_cache`). `--config` runs once per seed of `--record_seeds`
for its own `num_train_steps`; the records it races (`--record_against`, config files, each
with `:ARG` for a config that takes one) once per seed of `--record_against_seeds`, each for
its number of `--record_against_steps`. They take turns, so that the machine's drift falls on
all of them. A config raced at two lengths is named by its steps too (`tatoeba_fast@600`).

It prints each run's row as it ends (wall time, compilation, training, test BLEU, the step
dev chose and the last step's test BLEU), then per config the median wall time, BLEU as mean ±
standard deviation and its lowest, whether every seed reached the mark, and the ratio of the medians
(each config over the last of `--record_against`). Its records (`records`) are named
`record.<config>.<device>.<entry>.steps<N>[.devchosen].<figure>` for each entry's summary
and `....seed<k>.<figure>` for each run; docs/research.md's table of the standing record is
generated from them.
"""

from __future__ import annotations

import os
import runpy
import statistics

import jax
from absl import flags

from transformer.run import compilation
from transformer.errors import ConfigError
from benchmarks import common
from benchmarks import time_to_bleu

_SEEDS = flags.DEFINE_list("record_seeds", ["0", "1", "2"], "Seeds `--config` runs with.")
_AGAINST = flags.DEFINE_list(
    "record_against", ["configs/tatoeba_small.py"],
    "The configs whose records `--config` races, the one time ratios are to last (empty: "
    "`--config` alone).")
_AGAINST_STEPS = flags.DEFINE_list(
    "record_against_steps", ["1500"], "Steps of each `--record_against`, in its order.")
_AGAINST_SEEDS = flags.DEFINE_list("record_against_seeds", ["0"],
                                   "Seeds `--record_against` runs with.")
_BLEU = flags.DEFINE_float("record_bleu", 22.62, "The test sacreBLEU a run must reach.")
_TEST_SENTENCES = flags.DEFINE_integer(
    "record_test_sentences", -1, "Test sentences translated and scored (-1: the whole split).")
_ON_DEV = flags.DEFINE_bool(
    "record_choose_on_dev", True,
    "Each run keeps its config's dev BLEU during training and the mark is checked on the test "
    "sacreBLEU of the checkpoint its dev metric chose (config.select); with "
    "--norecord_choose_on_dev, on the last step's, with no dev BLEU during training.")


def config_name(spec: str) -> str:
  """`configs/modern_tatoeba.py:pre_ln` -> `modern_tatoeba:pre_ln`."""
  path, colon, arg = spec.partition(":")
  return os.path.splitext(os.path.basename(path))[0] + colon + arg


def load_config(spec: str):
  """The config of `spec`, a config file with an optional `:ARG` for its `get_config`."""
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise ConfigError(f"--record_against={spec}: no such config file {path}; pass one such as "
                      "configs/tatoeba_small.py")
  get_config = runpy.run_path(path)["get_config"]
  return get_config(arg) if arg else get_config()


def against_entries(specs: list[str], steps: list[str], seeds: list[int]) -> list[dict]:
  """An entry per config spec of `--record_against`, with its own count of steps (none for
  an empty `--record_against`: `--config` races alone)."""
  if not specs:
    return []
  if len(steps) != len(specs):
    raise ConfigError(f"--record_against names {len(specs)} configs and "
                      f"--record_against_steps gives {len(steps)} step counts; "
                      "give one count per config, in the same order")
  return [{"name": config_name(spec), "config": load_config(spec), "steps": int(n),
           "seeds": seeds} for spec, n in zip(specs, steps)]


def named_apart(entries: list[dict]) -> list[dict]:
  """The entries, a name that more than one of them has followed by its steps
  (`tatoeba_fast@550`, `tatoeba_fast@600`). Two entries of one name and one length are an
  error: their runs would share a workdir."""
  names = [e["name"] for e in entries]
  renamed = [dict(e, name=f"{e['name']}@{e['steps']}") if names.count(e["name"]) > 1 else e
             for e in entries]
  seen = [e["name"] for e in renamed]
  if len(set(seen)) < len(seen):
    twice = sorted({n for n in seen if seen.count(n) > 1})
    raise ConfigError(f"the race has {', '.join(twice)} more than once; race a config once "
                      "per length")
  return renamed


def turns(entries: list[dict]) -> list[tuple[dict, int]]:
  """`(entry, seed)` for every seed of every entry, the entries taking turns: the first
  entry's first seed, the second's first, the first's second, ..."""
  queues = [[(e, s) for s in e["seeds"]] for e in entries]
  order = []
  while any(queues):
    order += [q.pop(0) for q in queues if q]
  return order


def check_chooses_on_dev(entries: list[dict]) -> None:
  """One-line error, before anything runs, for an entry whose config chooses no checkpoint on
  dev: `config.select` names no dev metric, or the run computes no dev BLEU (time_to_bleu
  scores the chosen checkpoint where dev BLEU ran; with any `select`, a race without it would
  end in a missing figure after its runs)."""
  for e in entries:
    select, every = e["config"].select, e["config"].bleu_every_steps
    if not select or not 0 < every <= e["steps"]:
      raise ConfigError(
          f"{e['name']} chooses no checkpoint on dev (config.select={select!r}, "
          f"config.bleu_every_steps={every} for {e['steps']} steps): set both, or race the "
          "last step with --norecord_choose_on_dev")


def race(entries: list[dict], workdir: str, test_sentences: int,
         run_once=time_to_bleu.run_once, choose_on_dev: bool = True) -> list[dict]:
  """Runs every `(entry, seed)` of `turns(entries)` as one fresh time_to_bleu run; each entry
  is `{"name", "config", "steps", "seeds"}`. Returns a row per run. With `choose_on_dev`,
  each run keeps its config's dev BLEU, and its `test_sacrebleu` is the dev-chosen
  checkpoint's (`chosen_step`; the last step's is `last_test_sacrebleu`): the time is the
  run's, dev evaluations included, to the test split translated once."""
  if choose_on_dev:
    check_chooses_on_dev(entries)
  runs = []
  for entry, seed in turns(entries):
    root = os.path.join(workdir, "record", f"{entry['name']}-seed{seed}")
    config = time_to_bleu.prepared(entry["config"], entry["steps"], root, dev_bleu=choose_on_dev)
    config.seed = seed
    jax.clear_caches()  # what a new process starts without
    with (compilation.persistent_cache(config.compilation_cache_dir),
          compilation.CompileMonitor() as monitor):
      figures = run_once(config, os.path.join(root, "run"), monitor, test_sentences)
    if choose_on_dev:
      figures.update(last_test_sacrebleu=figures["test_sacrebleu"],
                     test_sacrebleu=figures["best_test_sacrebleu"],
                     chosen_step=figures["best_step"])
    figures.update(name=entry["name"], seed=seed, steps=entry["steps"])
    runs.append(figures)
    print(f"{len(runs)} of {sum(len(e['seeds']) for e in entries)} done: {_row(figures)}",
          flush=True)
  return runs


def summarize(runs: list[dict], mark: float) -> list[dict]:
  """Per config, in order of first appearance: its median wall time, BLEU mean, standard
  deviation (0 for one run) and lowest, whether every run reached `mark`, and the ratio of
  its median wall time to the last config's (the record raced; 1.0 for that one)."""
  names = list(dict.fromkeys(r["name"] for r in runs))
  rows = []
  for name in names:
    mine = [r for r in runs if r["name"] == name]
    bleu = [r["test_sacrebleu"] for r in mine]
    rows.append({
        "name": name, "runs": len(mine), "steps": mine[0]["steps"],
        "median_total_s": statistics.median(r["total_s"] for r in mine),
        "bleu_mean": statistics.fmean(bleu),
        "bleu_sd": statistics.stdev(bleu) if len(bleu) > 1 else 0.0,
        "bleu_min": min(bleu), "all_reached": min(bleu) >= mark})
  for row in rows:
    row["time_ratio"] = row["median_total_s"] / rows[-1]["median_total_s"]
  return rows


_HEADER = (f"{'config':<16}{'seed':>5}{'steps':>7}{'total s':>9}{'compile s':>11}"
           f"{'training s':>12}{'eval s':>8}{'BLEU':>7}{'chosen':>8}{'last BLEU':>11}")


def _row(r: dict) -> str:
  """One run under `_HEADER`: BLEU is the chosen checkpoint's where dev chose one."""
  chosen = (f"{r['chosen_step']:>8}{r['last_test_sacrebleu']:>11.2f}" if "chosen_step" in r
            else f"{'last':>8}{r['test_sacrebleu']:>11.2f}")
  return (f"{r['name']:<16}{r['seed']:>5}{r['steps']:>7}{r['total_s']:>9.1f}"
          f"{r['compile_s']:>11.1f}{r['training_s']:>12.1f}{r['evaluation_s']:>8.1f}"
          f"{r['test_sacrebleu']:>7.2f}{chosen}")


def run(config, workdir: str) -> dict:
  """Runs the suite (see the module docstring); prints the tables and returns the figures."""
  entries = [{"name": config_name(flags.FLAGS["config"].config_filename), "config": config,
              "steps": config.num_train_steps, "seeds": [int(s) for s in _SEEDS.value]}]
  entries = named_apart(entries + against_entries(
      _AGAINST.value, _AGAINST_STEPS.value, [int(s) for s in _AGAINST_SEEDS.value]))
  test_sentences = _TEST_SENTENCES.value
  runs = race(entries, workdir, test_sentences, choose_on_dev=_ON_DEV.value)
  summary = summarize(runs, _BLEU.value)
  print(f"\ntime-to-BLEU record — {common.device_name()}; test split "
        f"{'whole' if test_sentences < 0 else f'first {test_sentences}'}, beam "
        f"{config.decode.beam_size}; every run from empty caches; the checkpoint scored: "
        f"{'chosen on dev' if _ON_DEV.value else 'the last'}")
  print(_HEADER)
  for r in runs:
    print(_row(r))
  print(f"\n{'config':<16}{'runs':>5}{'steps':>7}{'median s':>10}{'BLEU':>16}{'lowest':>8}"
        f"{f'all >= {_BLEU.value:g}':>14}{'time ratio':>12}")
  for s in summary:
    print(f"{s['name']:<16}{s['runs']:>5}{s['steps']:>7}{s['median_total_s']:>10.1f}"
          f"{s['bleu_mean']:>10.2f} ± {s['bleu_sd']:.2f}{s['bleu_min']:>8.2f}"
          f"{'yes' if s['all_reached'] else 'no':>14}{s['time_ratio']:>12.2f}")
  return {"mark": _BLEU.value, "test_sentences": test_sentences, "runs": runs,
          "summary": summary, "choose_on_dev": _ON_DEV.value}


_SUMMARY_UNITS = {"median_total_s": "s", "bleu_mean": "BLEU", "time_ratio": "x"}
_RUN_UNITS = {"total_s": "s", "compile_s": "s", "training_s": "s", "evaluation_s": "s",
              "test_sacrebleu": "BLEU", "chosen_step": "step", "last_test_sacrebleu": "BLEU"}


def records(figures: dict) -> list[tuple[str, float, str, dict]]:
  """`(name, figure, unit, extra)` of every entry's summary and every run, for
  `benchmarks/__main__.py` to record; a summary's BLEU keeps its spread and lowest, its time
  ratio the config it is over. A race that chose each run's checkpoint on dev is named
  `.devchosen` after the steps."""
  out = []
  last = figures["summary"][-1]["name"].split("@")[0]
  dev = ".devchosen" if figures.get("choose_on_dev") else ""
  for s in figures["summary"]:
    name = f"{s['name'].split('@')[0]}.steps{s['steps']}{dev}"
    seeds = [r["seed"] for r in figures["runs"] if r["name"] == s["name"]]
    extra = {"seeds": seeds, "runs": s["runs"]}
    for key, unit in _SUMMARY_UNITS.items():
      more = ({"sd": s["bleu_sd"], "lowest": s["bleu_min"], "mark": figures["mark"],
               "all_reached": s["all_reached"]} if key == "bleu_mean" else
              {"over": last} if key == "time_ratio" else {})
      out.append((f"{name}.{key}", float(s[key]), unit, {**extra, **more}))
  for r in figures["runs"]:
    name = f"{r['name'].split('@')[0]}.steps{r['steps']}{dev}.seed{r['seed']}"
    out += [(f"{name}.{key}", float(r[key]), unit, {"seeds": [r["seed"]]})
            for key, unit in _RUN_UNITS.items() if key in r]
  return out
