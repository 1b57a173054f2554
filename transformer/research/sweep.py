"""Sweeps: named variants × grid points × seeds, run here (one at a time or side by side) or
by a cluster.

  python -m transformer.research.sweep --config=configs/table3.py --variants=A1,B2 --workdir=runs/table3
  python -m transformer.research.sweep --config=configs/table3.py --variants=base,A1 \\
      --seeds=0,1,2 --parallel=2 --workdir=runs/table3     # 6 runs, 2 at a time
  python -m transformer.research.sweep --config=configs/table3.py --variants=base \\
      --grid learning_rate_factor=0.5,1,2 --grid warmup_steps=4000,8000 --workdir=runs/lr
  python -m transformer.research.sweep ... --print_commands   # one launch command per run
  python -m transformer.research.sweep ... --slurm            # ROOT/sweep.sbatch, a SLURM job array

A config file with `NAMES` (its variants, in order) and `get_config(name)`, as
configs/table3.py, is swept by name; a config file without them is swept alone, over
`--grid` or `--seeds`. Each run trains in its folder under ROOT (`grid.py`:
`VARIANT[/GRID][/seed<k>]`) with

  python train.py --config=FILE[:NAME] --workdir=ROOT/FOLDER [--config.KEY=VALUE ...]

(`--set KEY=VALUE` adds `--config.KEY=VALUE` to every run, then come the run's grid values
and `--config.seed=k`; `--allow_config_changes` is passed on, to resume with e.g. more
steps). Every run's config is built and checked (`config_checks.validate`) before the first
one starts, so a bad key or value is one line before anything runs. Here each run is its own
process, with this interpreter: it starts clean, and a crash stops only that run. A run whose
latest checkpoint has reached its `num_train_steps` is skipped; one with earlier checkpoints
resumes (train.py resumes from the workdir by itself). `--parallel` and the devices each run
sees: `launch.py`. SIGTERM or Ctrl-C stop the runs in flight (each saves a checkpoint) and
the sweep. With `--slurm` the cluster's scheduler runs the same commands, one array task per
run, under `srun`: with `--slurm_nodes` > 1 every node runs one process and train.py starts
`jax.distributed` from SLURM's environment (transformer/training/distributed.py).
Re-submitting the script resumes the unfinished runs; a finished one only re-scores its test
set. The sweep's variants, grid and seeds are kept in ROOT/sweep.json (merged over the
commands that wrote into ROOT), where the report finds its grid columns.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import runpy
import shlex

from absl import flags, logging
from ml_collections import config_flags

from transformer import cli
from transformer.errors import ConfigError
from transformer.research import grid as grid_lib
from transformer.research import launch
from transformer.run import checkpoint_layout
from transformer.run import config_checks

SLURM_SCRIPT = "sweep.sbatch"
SHARED_CACHE = "data"  # ROOT/data: the runs' shared data cache (`Sweep._shared_cache`)
SWEEP_FILE = "sweep.json"


def variant_names(config_file: str) -> tuple[str, ...]:
  """The `NAMES` a config file defines (empty when it has none), or a `ConfigError`."""
  if not os.path.isfile(config_file):
    raise ConfigError(f"--config={config_file}: no such file; pass a config file such as "
                      "configs/table3.py")
  return tuple(runpy.run_path(config_file).get("NAMES") or ())


def select(config_file: str, variants: str, alone: bool = False) -> list[str | None]:
  """The variants `variants` names ('all', or comma-separated names), in the file's order;
  `[None]` for a config file without `NAMES` swept alone (`alone`: a grid or seeds)."""
  names = variant_names(config_file)
  if not names:
    if alone and variants.strip() == "all":
      return [None]
    raise ConfigError(f"{config_file} defines no NAMES: sweep it alone with --grid or --seeds "
                      "(no --variants), or pass a config file whose get_config(name) has named "
                      "variants, such as configs/table3.py")
  if variants.strip() == "all":
    return list(names)
  chosen = [v.strip() for v in variants.split(",") if v.strip()]
  unknown = [v for v in chosen if v not in names]
  if unknown or not chosen:
    raise ConfigError(f"--variants={variants}: unknown variant {', '.join(unknown) or '(none)'};"
                      f" {config_file} has {', '.join(names)} (or 'all')")
  return [n for n in names if n in chosen]


def overrides(sets) -> list[str]:
  """`--config.KEY=VALUE` for each `KEY=VALUE` of `--set`."""
  out = []
  for item in sets:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
      raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set num_train_steps=1000")
    out.append(f"--config.{key.strip()}={value}")
  return out


@functools.lru_cache(maxsize=None)
def _configured(config_file: str, variant: str | None, key: str) -> str:
  """Dotted `key` (`data.cache_dir`, `wandb.project`) as the config file sets it for `variant`
  ('' = unset)."""
  get_config = runpy.run_path(config_file)["get_config"]
  node = get_config(variant) if variant is not None else get_config()
  for part in key.split("."):
    node = node.get(part, "") if hasattr(node, "get") else ""
  return node


@dataclasses.dataclass(frozen=True)
class Sweep:
  """The runs of `config_file` (`grid_lib.Point`s), each trained in `root/<point.folder>`."""

  config_file: str
  root: str
  sets: tuple[str, ...] = ()  # KEY=VALUE overrides for every run
  allow_config_changes: bool = False  # passed on to train.py
  trainer: str = ""  # the training entry point; '' is the project's train.py

  def _spec(self, point: grid_lib.Point) -> str:
    return self.config_file + (f":{point.variant}" if point.variant is not None else "")

  def _overrides(self, point: grid_lib.Point) -> list[str]:
    return [*overrides(self.sets), *self._shared_cache(point), *self._tracking_group(point),
            *point.overrides()]

  def _set(self, key: str) -> str | None:
    """The value `--set` gives dotted `key`, None where it gives none."""
    given = [item.partition("=") for item in self.sets]
    return next((value for k, _, value in reversed(given) if k.strip() == key), None)

  def _tracking_group(self, point: grid_lib.Point) -> list[str]:
    """`--config.wandb.group=VARIANT/GRID`: in a run that logs to W&B, each row of the sweep
    (a variant's grid point) is a W&B group and its seeds the runs in it; without a grid the
    group is the variant already (`transformer.training.tracking`). Not where `--set` or the
    config file names a group."""
    if not point.grid or self._set("wandb.group") is not None:
      return []
    project = self._set("wandb.project")
    if not (project if project is not None
            else _configured(self.config_file, point.variant, "wandb.project")):
      return []
    if _configured(self.config_file, point.variant, "wandb.group"):
      return []
    row = os.path.dirname(point.folder) if point.seed is not None else point.folder
    return [f"--config.wandb.group={row}"]

  def _shared_cache(self, point: grid_lib.Point) -> list[str]:
    """`--config.data.cache_dir=ROOT/data`: the runs share one data cache, where runs whose
    data settings agree find one vocabulary and one tokenized copy of each split (built by
    the first, `transformer.data.cache_lock`). Not where `--set` names a cache folder, nor
    for a run that began with a cache of its own (WORKDIR/data, before sweeps shared one),
    nor where the config file sets one itself."""
    if self._set("data.cache_dir") is not None:
      return []
    if _configured(self.config_file, point.variant, "data.cache_dir"):
      return []
    if os.path.isdir(os.path.join(self.workdir(point), "data")):
      return []
    return [f"--config.data.cache_dir={os.path.join(self.root, SHARED_CACHE)}"]

  def config(self, point: grid_lib.Point):
    """The run's config with every override, parsed as train.py will parse it."""
    argv = ["train.py", f"--config={self._spec(point)}", *self._overrides(point)]
    values = flags.FlagValues()
    holder = config_flags.DEFINE_config_file("config", None, "", flag_values=values,
                                             sys_argv=argv)
    try:
      values(argv)
    except (KeyError, AttributeError, flags.Error) as e:
      raise ConfigError(f"{self._spec(point)}: {cli.config_flag_error(argv, e)}") from None
    return holder.value

  def workdir(self, point: grid_lib.Point) -> str:
    return os.path.normpath(os.path.join(self.root, point.folder))

  def command(self, point: grid_lib.Point) -> list[str]:
    """The launch command of one run, for the current folder."""
    train_py = self.trainer or os.path.relpath(os.path.join(cli.PROJECT_DIR, "train.py"))
    return ["python", train_py, f"--config={self._spec(point)}",
            f"--workdir={self.workdir(point)}", *self._overrides(point),
            *(["--allow_config_changes"] if self.allow_config_changes else [])]

  def check(self, points: list[grid_lib.Point]) -> dict:
    """point -> config of each run; the first bad override or value raises `ConfigError`,
    naming the run."""
    configs = {}
    for point in points:
      config = self.config(point)
      try:
        config_checks.validate(config)
      except ConfigError as e:
        raise ConfigError(f"{point.folder}: {e}") from None
      configs[point] = config
    return configs

  @staticmethod
  def _compile_group(point: grid_lib.Point, config) -> str:
    """The runs that compile the same programs as this one: its row's seeds ('' without
    --seeds or without a compilation cache to share them through)."""
    if point.seed is None or not config.get("compilation_cache_dir"):
      return ""
    return repr((point.variant, point.grid))  # the point but its seed

  def run(self, points: list[grid_lib.Point], slots=None, progress_every: float = 60.0,
          compile_once: bool = True) -> dict[str, str]:
    """Trains the runs (up to one per slot of `slots` at a time; default: one after
    another); returns folder -> outcome. With `compile_once`, a run whose row's first run
    is compiling waits for it (`launch.Launcher`).

    Outcomes, read from each workdir afterwards: 'finished before' (skipped), 'trained',
    'stopped at step N', or 'failed (exit N) at step M'. Every run's config is checked before
    the first one starts.
    """
    configs = self.check(points)
    outcomes, jobs = {}, []
    for point in points:
      total = configs[point].num_train_steps
      done = checkpoint_layout.latest_saved_step(self.workdir(point))
      if done >= total:
        logging.info("%s: finished before (step %d of %d), skipped", point.folder, done, total)
        outcomes[point.folder] = "finished before"
        continue
      argv = self.command(point)
      jobs.append(launch.Job(
          point.folder, argv, self.workdir(point), total,
          f"{point.folder}: {'resuming' if done else 'starting'} at step {done} of {total}: "
          f"{shlex.join(argv)}",
          group=self._compile_group(point, configs[point]) if compile_once else ""))
    launcher = launch.Launcher(slots or [{}], progress_every=progress_every)
    codes, stopping = launcher.run(jobs)
    for job in jobs:
      if job.name not in codes:
        continue  # never started: the sweep was stopped first
      code, done = codes[job.name], checkpoint_layout.latest_saved_step(job.workdir)
      outcomes[job.name] = ("trained" if done >= job.total_steps and code == 0
                            else f"stopped at step {done}" if stopping or code == 130
                            else f"failed (exit {code}) at step {done}")
      logging.info("%s: %s", job.name, outcomes[job.name])
    return outcomes

  def record(self, variants, grid, seeds) -> None:
    """Merges this command's variants, grid and seeds into ROOT/sweep.json (for the report)."""
    path = os.path.join(self.root, SWEEP_FILE)
    try:
      with open(path) as f:
        kept = json.load(f)
    except (OSError, ValueError):
      kept = {}
    merged = {"config": self.config_file,
              "variants": list(dict.fromkeys([*kept.get("variants", []),
                                              *(v for v in variants if v is not None)])),
              "grid": {**kept.get("grid", {})},
              "seeds": sorted({*kept.get("seeds", []), *seeds})}
    for key, values in grid:
      merged["grid"][key] = list(dict.fromkeys([*merged["grid"].get(key, []), *values]))
    os.makedirs(self.root, exist_ok=True)
    with open(path, "w") as f:
      json.dump(merged, f, indent=2)

  def slurm_script(self, points: list[grid_lib.Point], *, nodes: int = 1,
                   gpus_per_node: int = 8, time: str = "", partition: str = "") -> str:
    """A bash script for `sbatch`: a job array whose task i trains `points[i]` under srun."""
    root = os.path.abspath(self.root)
    options = [f"--job-name={os.path.basename(root) or 'sweep'}",
               f"--array=0-{len(points) - 1}", f"--nodes={nodes}", "--ntasks-per-node=1",
               f"--output={os.path.join(root, 'slurm-%A_%a.out')}",
               # SIGTERM to every task 2 minutes before the time limit (or at preemption):
               # every process saves the same step and exits 0; a requeued task resumes there.
               "--signal=TERM@120", "--requeue"]
    options += [f"--gpus-per-node={gpus_per_node}"] if gpus_per_node else []
    options += [f"--time={time}"] if time else []
    options += [f"--partition={partition}"] if partition else []
    tasks = [f"  {i}) RUN=({shlex.join(self.command(p)[2:])}) ;;"
             for i, p in enumerate(points)]
    train_py = shlex.quote(self.command(points[0])[1])
    return "\n".join([
        "#!/bin/bash",
        f"# {len(points)} runs of {self.config_file}, one array task each (python -m "
        "transformer.research.sweep --slurm).",
        "# Submit from an environment where `python` runs this project (sbatch passes it on).",
        "# The sweep root must be on a filesystem every node shares; with --nodes > 1, srun",
        "# starts one process per node and train.py starts jax.distributed from SLURM's",
        "# environment.",
        *(f"#SBATCH {o}" for o in options),
        "set -euo pipefail",
        f"cd {shlex.quote(os.getcwd())}",
        'case "$SLURM_ARRAY_TASK_ID" in',
        *tasks,
        '  *) echo "no run for array task $SLURM_ARRAY_TASK_ID" >&2; exit 1 ;;',
        "esac",
        'echo "array task $SLURM_ARRAY_TASK_ID: ${RUN[*]}"',
        f'srun python {train_py} "${{RUN[@]}}"',
        ""])


def _define_flags() -> None:
  """Flags, defined only when run as a program: the tools share names (--workdir, --config)
  and must import together into one process (tests, notebooks)."""
  flags.DEFINE_string("config", None, "A config file: one defining NAMES and "
                      "get_config(name), e.g. configs/table3.py, or any config with --grid "
                      "or --seeds.")
  flags.DEFINE_string("variants", "all", "Comma-separated variant names, or 'all'.")
  flags.DEFINE_string("workdir", None, "Sweep root: a run trains in "
                      "ROOT/VARIANT[/GRID][/seed<k>].")
  flags.DEFINE_multi_string("set", [], "KEY=VALUE: --config.KEY=VALUE for every run "
                            "(repeatable).")
  flags.DEFINE_multi_string("grid", [], "KEY=V1,V2,...: one run per value, the product over "
                            "repeated --grid flags (e.g. --grid warmup_steps=4000,8000).")
  flags.DEFINE_string("seeds", "", "Comma-separated seeds: each run once per seed, in "
                      "ROOT/.../seed<k> with --config.seed=k (default: the config's seed, "
                      "no seed folder).")
  flags.DEFINE_integer("parallel", 1, "Runs at once on this machine, each on its own "
                       "devices (on the CPU: processes sharing the cores).")
  flags.DEFINE_bool("compile_once", True, "With --parallel > 1: while a run compiles, the "
                    "other seeds of its row wait and then read its programs from the "
                    "compilation cache (config.compilation_cache_dir) instead of compiling "
                    "them beside it; runs of other rows take the free slots meanwhile.")
  flags.DEFINE_integer("devices_per_run", 0, "Devices each run sees (0: all of them with "
                       "--parallel=1, else an equal share).")
  flags.DEFINE_string("devices", "auto", "Devices to share out: auto (CUDA_VISIBLE_DEVICES, "
                      "nvidia-smi, TPU chips, else the CPU), cpu, gpu:0,1,... or tpu:0,1,...")
  flags.DEFINE_string("trainer", "", "The training command's script (default: the "
                      "project's train.py); a wrapper that takes train.py's flags.")
  flags.DEFINE_bool("allow_config_changes", False, "Passed on to train.py: resume although "
                    "keys such as num_train_steps differ from a workdir's config.json.")
  flags.DEFINE_bool("print_commands", False, "Print one launch command per run and run "
                    "nothing.")
  flags.DEFINE_bool("slurm", False, f"Write ROOT/{SLURM_SCRIPT}, a SLURM job array with one "
                    "task per run, and run nothing.")
  flags.DEFINE_integer("slurm_nodes", 1, "Nodes per run (one process per node).")
  flags.DEFINE_integer("slurm_gpus_per_node", 8, "GPUs per node (0: no --gpus-per-node).")
  flags.DEFINE_string("slurm_time", "", "Time limit per run, e.g. 24:00:00.")
  flags.DEFINE_string("slurm_partition", "", "SLURM partition.")
  flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  f = flags.FLAGS
  sweep = Sweep(f.config, f.workdir, tuple(f.set), f.allow_config_changes, f.trainer)
  grid = grid_lib.parse_grid(f.grid, f.set)
  seeds = grid_lib.parse_seeds(f.seeds)
  if seeds and any(item.partition("=")[0].strip() == "seed" for item in f.set):
    raise ConfigError(f"--seeds={f.seeds} and --set seed=...: give the seeds once")
  variants = select(f.config, f.variants, alone=bool(grid or seeds))
  points = grid_lib.points(variants, grid, seeds)
  if f.slurm and f.parallel != 1:
    raise ConfigError(f"--parallel={f.parallel} is for runs on this machine; a SLURM array "
                      "runs its tasks side by side by itself")
  slots = None
  if not (f.print_commands or f.slurm):
    slots = launch.slot_environments(launch.parse_devices(f.devices), f.parallel,
                                     f.devices_per_run)
  sweep.check(points)  # before anything runs or is written
  if f.print_commands:
    for point in points:
      print(shlex.join(sweep.command(point)))
    return
  sweep.record(variants, grid, seeds)
  if f.slurm:
    path = os.path.join(f.workdir, SLURM_SCRIPT)
    with open(path, "w") as out:
      out.write(sweep.slurm_script(points, nodes=f.slurm_nodes,
                                   gpus_per_node=f.slurm_gpus_per_node, time=f.slurm_time,
                                   partition=f.slurm_partition))
    print(f"wrote {path} ({len(points)} array tasks); submit it with: sbatch {path}")
    return
  outcomes = sweep.run(points, slots, compile_once=f.compile_once)
  width = max(len(p.folder) for p in points) + 2
  for point in points:
    print(f"{point.folder:<{width}}{outcomes.get(point.folder, 'not started')}")
  unfinished = [p.folder for p in points
                if outcomes.get(p.folder) not in ("trained", "finished before")]
  if unfinished:
    cli.fail(f"{len(unfinished)} of {len(points)} runs did not finish: "
             f"{', '.join(unfinished)}; run the same command again to resume them (their logs: "
             f"{'above' if f.parallel == 1 else 'train.log in each workdir'})", status=1)


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
