"""Sweeps: the named variants of a config file, run here one after another or by a cluster.

  python -m transformer.research.sweep --config=configs/table3.py --variants=A1,B2 --workdir=runs/table3
  python -m transformer.research.sweep --config=configs/table3.py --variants=all --workdir=runs/table3 \\
      --set data.tfds_data_dir=/data/tfds --set num_train_steps=20000
  python -m transformer.research.sweep ... --print_commands   # one launch command per variant
  python -m transformer.research.sweep ... --slurm            # ROOT/sweep.sbatch, a SLURM job array

A config file can be swept when it defines `NAMES` (its variants, in order) and
`get_config(name)`, as configs/table3.py does. Variant NAME trains in ROOT/NAME with

  python train.py --config=FILE:NAME --workdir=ROOT/NAME [--config.KEY=VALUE ...]

(`--set KEY=VALUE` adds `--config.KEY=VALUE` to every variant; `--allow_config_changes` is
passed on, to resume with e.g. more steps). Here each variant runs in its own process, with
this interpreter: it starts clean, and a crash stops only that variant. A variant whose latest
checkpoint has reached its `num_train_steps` is skipped; one with earlier checkpoints resumes
(train.py resumes from the workdir by itself). SIGTERM or Ctrl-C stop the variant in flight
(it saves a checkpoint) and the sweep after it. With `--slurm` the
cluster's scheduler runs the same commands, one array task per variant, under `srun`: with
`--slurm_nodes` > 1 every node runs one process and train.py starts `jax.distributed` from
SLURM's environment (transformer/training/distributed.py). Re-submitting the script resumes the
unfinished variants; a finished one only re-scores its test set.
"""

from __future__ import annotations

import dataclasses
import os
import runpy
import shlex
import signal
import subprocess
import sys

from absl import flags, logging
from ml_collections import config_flags

from transformer import cli
from transformer.run import checkpoint
from transformer.errors import ConfigError

SLURM_SCRIPT = "sweep.sbatch"


def variant_names(config_file: str) -> tuple[str, ...]:
  """The `NAMES` a config file defines, or a `ConfigError` (one line)."""
  if not os.path.isfile(config_file):
    raise ConfigError(f"--config={config_file}: no such file; pass a config file with named "
                      "variants such as configs/table3.py")
  names = runpy.run_path(config_file).get("NAMES")
  if not names:
    raise ConfigError(f"{config_file} defines no NAMES: a sweep needs a config file whose "
                      "get_config(name) has named variants, such as configs/table3.py")
  return tuple(names)


def select(config_file: str, variants: str) -> list[str]:
  """The variants `variants` names ('all', or comma-separated names), in the file's order."""
  names = variant_names(config_file)
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


@dataclasses.dataclass(frozen=True)
class Sweep:
  """The variants of `config_file`, trained in `root/<name>` with the same overrides."""

  config_file: str
  root: str
  sets: tuple[str, ...] = ()  # KEY=VALUE overrides for every variant
  allow_config_changes: bool = False  # passed on to train.py

  def config(self, name: str):
    """Variant `name` with the overrides, parsed as train.py will parse them."""
    argv = ["train.py", f"--config={self.config_file}:{name}", *overrides(self.sets)]
    values = flags.FlagValues()
    holder = config_flags.DEFINE_config_file("config", None, "", flag_values=values,
                                             sys_argv=argv)
    try:
      values(argv)
    except (KeyError, AttributeError, flags.Error) as e:
      raise ConfigError(f"{self.config_file}:{name}: {cli.config_flag_error(argv, e)}") from None
    return holder.value

  def workdir(self, name: str) -> str:
    return os.path.join(self.root, name)

  def command(self, name: str) -> list[str]:
    """The launch command of variant `name`, for the current folder."""
    train_py = os.path.relpath(os.path.join(cli.PROJECT_DIR, "train.py"))
    return ["python", train_py, f"--config={self.config_file}:{name}",
            f"--workdir={self.workdir(name)}", *overrides(self.sets),
            *(["--allow_config_changes"] if self.allow_config_changes else [])]

  def check(self, names: list[str]) -> dict:
    """name -> config of each variant; the first bad variant or override raises."""
    return {name: self.config(name) for name in names}

  def run(self, names: list[str]) -> dict[str, str]:
    """Trains each variant in turn, in its own process; returns name -> outcome.

    Outcomes, read from each workdir afterwards: 'finished before' (skipped), 'trained',
    'stopped at step N', or 'failed (exit N) at step M'. Every variant's config is checked
    before the first one starts.
    """
    configs = self.check(names)
    outcomes = {}
    for name in names:
      total = configs[name].num_train_steps
      done = checkpoint.latest_saved_step(self.workdir(name))
      if done >= total:
        logging.info("%s: finished before (step %d of %d), skipped", name, done, total)
        outcomes[name] = "finished before"
        continue
      argv = self.command(name)
      logging.info("%s: %s at step %d of %d: %s", name, "resuming" if done else "starting",
                   done, total, shlex.join(argv))
      code, stopping = self._train(argv)
      done = checkpoint.latest_saved_step(self.workdir(name))
      outcomes[name] = ("trained" if done >= total and code == 0
                        else f"stopped at step {done}" if stopping or code == 130
                        else f"failed (exit {code}) at step {done}")
      logging.info("%s: %s", name, outcomes[name])
      if stopping or code == 130:  # the stop was meant for the whole sweep
        break
    return outcomes

  @staticmethod
  def _train(argv: list[str]) -> tuple[int, bool]:
    """Runs one variant; returns its exit status and whether the sweep was asked to stop.

    Ctrl-C reaches the variant by itself (one process group); SIGTERM, sent to the sweep
    alone by `kill` or a scheduler, is passed on. Either way the variant saves a checkpoint
    after the step in flight, and the sweep waits for it.
    """
    proc = subprocess.Popen([sys.executable, *argv[1:]])
    stopping = []

    def forward(signum, frame):
      del frame
      stopping.append(signum)
      proc.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
      while True:
        try:
          return proc.wait(), bool(stopping)
        except KeyboardInterrupt:
          stopping.append(signal.SIGINT)  # the variant got it too; wait for its checkpoint
    finally:
      signal.signal(signal.SIGTERM, previous)

  def slurm_script(self, names: list[str], *, nodes: int = 1, gpus_per_node: int = 8,
                   time: str = "", partition: str = "") -> str:
    """A bash script for `sbatch`: a job array with task i training `names[i]` under srun."""
    marker = "@VARIANT@"  # each argument quoted for bash, with the array's variant in place
    train = " ".join('"$VARIANT"'.join(shlex.quote(part) if part else ""
                                       for part in arg.split(marker))
                     for arg in self.command(marker))
    root = os.path.abspath(self.root)
    options = [f"--job-name={os.path.basename(root) or 'sweep'}",
               f"--array=0-{len(names) - 1}", f"--nodes={nodes}", "--ntasks-per-node=1",
               f"--output={os.path.join(root, 'slurm-%A_%a.out')}"]
    options += [f"--gpus-per-node={gpus_per_node}"] if gpus_per_node else []
    options += [f"--time={time}"] if time else []
    options += [f"--partition={partition}"] if partition else []
    return "\n".join([
        "#!/bin/bash",
        f"# {len(names)} variants of {self.config_file}, one array task each (python -m "
        "transformer.research.sweep --slurm).",
        "# Submit from an environment where `python` runs this project (sbatch passes it on).",
        "# The sweep root must be on a filesystem every node shares; with --nodes > 1, srun",
        "# starts one process per node and train.py starts jax.distributed from SLURM's",
        "# environment.",
        *(f"#SBATCH {o}" for o in options),
        "set -euo pipefail",
        f"cd {shlex.quote(os.getcwd())}",
        f"VARIANTS=({' '.join(shlex.quote(n) for n in names)})",
        'VARIANT="${VARIANTS[$SLURM_ARRAY_TASK_ID]}"',
        'echo "variant $VARIANT (array task $SLURM_ARRAY_TASK_ID)"',
        f"srun {train}",
        ""])


def _define_flags() -> None:
  """Flags, defined only when run as a program: the tools share names (--workdir, --config)
  and must import together into one process (tests, notebooks)."""
  flags.DEFINE_string("config", None, "A config file defining NAMES and get_config(name), "
                      "e.g. configs/table3.py.")
  flags.DEFINE_string("variants", "all", "Comma-separated variant names, or 'all'.")
  flags.DEFINE_string("workdir", None, "Sweep root: variant NAME trains in ROOT/NAME.")
  flags.DEFINE_multi_string("set", [], "KEY=VALUE: --config.KEY=VALUE for every variant "
                            "(repeatable).")
  flags.DEFINE_bool("allow_config_changes", False, "Passed on to train.py: resume although "
                    "keys such as num_train_steps differ from a workdir's config.json.")
  flags.DEFINE_bool("print_commands", False, "Print one launch command per variant and run "
                    "nothing.")
  flags.DEFINE_bool("slurm", False, f"Write ROOT/{SLURM_SCRIPT}, a SLURM job array with one "
                    "task per variant, and run nothing.")
  flags.DEFINE_integer("slurm_nodes", 1, "Nodes per variant (one process per node).")
  flags.DEFINE_integer("slurm_gpus_per_node", 8, "GPUs per node (0: no --gpus-per-node).")
  flags.DEFINE_string("slurm_time", "", "Time limit per variant, e.g. 24:00:00.")
  flags.DEFINE_string("slurm_partition", "", "SLURM partition.")
  flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  f = flags.FLAGS
  sweep = Sweep(f.config, f.workdir, tuple(f.set), f.allow_config_changes)
  names = select(f.config, f.variants)
  sweep.check(names)  # before anything runs or is written
  if f.print_commands:
    for name in names:
      print(shlex.join(sweep.command(name)))
    return
  if f.slurm:
    os.makedirs(f.workdir, exist_ok=True)
    path = os.path.join(f.workdir, SLURM_SCRIPT)
    with open(path, "w") as out:
      out.write(sweep.slurm_script(names, nodes=f.slurm_nodes,
                                   gpus_per_node=f.slurm_gpus_per_node, time=f.slurm_time,
                                   partition=f.slurm_partition))
    print(f"wrote {path} ({len(names)} array tasks); submit it with: sbatch {path}")
    return
  outcomes = sweep.run(names)
  for name in names:
    print(f"{name:<12}{outcomes.get(name, 'not started')}")
  unfinished = [n for n in names if outcomes.get(n) not in ("trained", "finished before")]
  if unfinished:
    cli.fail(f"{len(unfinished)} of {len(names)} variants did not finish: "
             f"{', '.join(unfinished)}; run the same command again to resume them (their logs "
             "are above)", status=1)


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
