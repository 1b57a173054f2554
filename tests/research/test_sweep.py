"""Sweeps end to end on a tiny variant × two seeds, two runs at a time (trained, skipped when
finished, resumed when interrupted, then reported); launch commands and the SLURM array script
with seeds and grid points; bad input."""

import csv
import json
import os
import shutil
import subprocess
import sys

import pytest
from matplotlib import image

from tests import support
from tests.conftest import REPO
from transformer.run import checkpoint
from transformer.run import checkpoint_layout
from transformer.research import grid
from transformer.research import plots
from transformer.research import report
from transformer.research import sweep
from transformer.errors import ConfigError

# Two variants of one tiny model on a toy corpus, for 2 and 4 steps with a checkpoint every 2:
# the same programs (compiled once, then read from the session's compilation cache). The
# end-to-end test trains 'long' over two seeds; the checks of configs use 'short'.
_CONFIG = '''
from tests import support

NAMES = ("short", "long")
DATA = {data!r}


def get_config(name="short"):
  config = support.files_config(DATA)
  config.model.update(d_model=16, d_ff=32, num_heads=2, d_k=8, d_v=8, num_layers=1, max_len=32,
                      dropout_rate=0.0)
  config.data.update(max_source_len=32, max_target_len=32,
                     tokens_per_batch=256, bucket_boundaries=(32,))
  config.update(num_train_steps={{"short": 2, "long": 4}}[name], warmup_steps=2,
                checkpoint_every_steps=2, log_every_steps=2, bleu_every_steps=0,
                bleu_at_end=False)
  config.variant = name
  return config
'''


@pytest.fixture
def sweep_config(tmp_path):
  data = tmp_path / "data"
  support.write_pairs(data, n=400)
  path = tmp_path / "tiny_sweep.py"
  path.write_text(_CONFIG.format(data=str(data)))
  return str(path)


def _steps(workdir):
  return checkpoint.Checkpointer(str(workdir), read_only=True).steps()


def _sweep(*args):
  # One device: the variants' programs compile faster than over the 8 fake ones.
  env = dict(os.environ, XLA_FLAGS="")
  return subprocess.run([sys.executable, "-m", "transformer.research.sweep", *args], cwd=REPO,
                        capture_output=True, text=True, env=env)


def test_sweep_of_seeds_side_by_side_trains_skips_resumes_and_reports(sweep_config, tmp_path):
  root = tmp_path / "runs"
  args = (f"--config={sweep_config}", f"--workdir={root}", "--variants=long", "--seeds=0,1",
          "--parallel=2", "--devices=cpu")  # two processes at once sharing the cores
  run = _sweep(*args)
  assert run.returncode == 0, run.stderr[-3000:]
  for seed in (0, 1):
    assert _steps(root / "long" / f"seed{seed}") == [2, 4]
    saved = json.loads((root / "long" / f"seed{seed}" / "config.json").read_text())
    assert saved["seed"] == seed and saved["data"]["cache_dir"] == str(root / "data")
    assert not (root / "long" / f"seed{seed}" / "data").exists()  # the sweep's cache, shared
  # The seeds share one vocabulary (drawn with data.seed) and its tokenized splits.
  assert len(list((root / "data").glob("spm-*.model"))) == 1  # (and its lock file)
  assert len([p for p in (root / "data").glob("tokens-train-*") if p.suffix != ".lock"]) == 1
  assert "step 4/4" in (root / "long" / "seed1" / "train.log").read_text()
  # long/seed1 was interrupted after its first checkpoint: its last one is gone.
  shutil.rmtree(root / "long" / "seed1" / "checkpoints" / "4")
  finished = (root / "long" / "seed0" / "metrics.jsonl").stat().st_mtime_ns

  run = _sweep(*args)
  assert run.returncode == 0, run.stderr[-3000:]
  assert "long/seed0: finished before (step 4 of 4), skipped" in run.stderr
  assert "long/seed1: resuming at step 2 of 4" in run.stderr
  assert (root / "long" / "seed0" / "metrics.jsonl").stat().st_mtime_ns == finished
  assert _steps(root / "long" / "seed1") == [2, 4]
  lines = (root / "long" / "seed1" / "metrics.jsonl").read_text().splitlines()
  timed = [(m["step"], m["time"]) for m in map(json.loads, lines) if "train/loss" in m]
  assert [s for s, _ in timed] == [2, 4] and timed[1][1] > timed[0][1]  # one run, one clock

  written = report.write_report(root)
  with open(root / "report.csv") as f:
    rows = list(csv.DictReader(f))
  assert [(r["kind"], r["row"], r["seed"], r["n"], r["steps"]) for r in rows] == [
      ("run", "long", "0", "1", "4"), ("run", "long", "1", "1", "4"),
      ("variant", "long", "0 1", "2", "4")]
  times = [float(r["wall_time_s"]) for r in rows[:2]]
  assert float(rows[2]["wall_time_s"]) == pytest.approx(sum(times) / 2)
  assert float(rows[2]["wall_time_s_std"]) == pytest.approx(abs(times[0] - times[1]) / 2 ** 0.5)
  assert float(rows[2]["params_m"]) > 0
  assert "| long | 2 |" in (root / "report.md").read_text()
  for filename, _, _, _ in plots.CURVES:
    with open(written[filename], "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    height, width, _ = image.imread(written[filename]).shape
    assert (width, height) == tuple(int(x * plots.DPI) for x in plots.CURVE_SIZE_INCHES)


def test_progress_counts_only_complete_checkpoints(tmp_path):
  assert checkpoint_layout.latest_saved_step(str(tmp_path)) == 0  # no checkpoints folder yet
  for name in ("2", "10", "12.orbax-checkpoint-tmp-1700000000"):
    (tmp_path / "checkpoints" / name).mkdir(parents=True)
  assert checkpoint_layout.saved_steps(str(tmp_path)) == [2, 10]
  assert checkpoint_layout.latest_saved_step(str(tmp_path)) == 10


def test_the_modern_rows_print_one_command_each(tmp_path):
  from configs import modern

  root = tmp_path / "runs"
  run = _sweep("--config=configs/modern.py", "--variants=all", f"--workdir={root}",
               "--print_commands")
  assert run.returncode == 0, run.stderr
  assert run.stdout.splitlines() == [
      f"python train.py --config=configs/modern.py:{name} --workdir={root}/{name} "
      f"--config.data.cache_dir={root}/data" for name in modern.NAMES]
  assert len(modern.NAMES) == 25 and not root.exists()


def test_print_commands_and_slurm_script_name_every_run(tmp_path):
  root = tmp_path / "runs"
  # One launch shows it all (a plain variant's folder: the modern rows' test): the variants in
  # order, each over the grid and seeds; --set first, then the grid's values and the seed.
  run = _sweep("--config=configs/table3.py", "--variants=A1,big", f"--workdir={root}",
               "--set", "num_train_steps=1000", "--grid", "warmup_steps=4000,8000",
               "--seeds=0,1", "--print_commands")
  assert run.returncode == 0, run.stderr
  assert run.stdout.splitlines() == [
      f"python train.py --config=configs/table3.py:{name} --workdir={root}/{name}/"
      f"warmup_steps={w}/seed{s} --config.num_train_steps=1000 --config.data.cache_dir="
      f"{root}/data --config.warmup_steps={w} --config.seed={s}"
      for name in ("A1", "big") for w in (4000, 8000) for s in (0, 1)]
  assert not root.exists()

  names = list(sweep.select("configs/table3.py", "all"))
  points = grid.points(names, grid.parse_grid(["model.dropout_rate=0.1,0.3"]), [0, 1, 2])
  cwd = os.getcwd()
  os.chdir(REPO)
  try:
    script = sweep.Sweep("configs/table3.py", str(root), ("data.tfds_data_dir=/d",)
                         ).slurm_script(points, nodes=2)
  finally:
    os.chdir(cwd)
  path = tmp_path / "sweep.sbatch"
  path.write_text(script)
  assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
  assert len(points) == len(names) * 2 * 3
  assert f"#SBATCH --array=0-{len(points) - 1}" in script and "#SBATCH --nodes=2" in script
  assert 'srun python train.py "${RUN[@]}"' in script
  assert "#SBATCH --signal=TERM@120" in script and "#SBATCH --requeue" in script
  # The array index picks the run: run the script's case statement for the last task.
  start, end = script.index("case "), script.index("esac") + 4
  shown = subprocess.run(["bash", "-c", script[start:end] + '\nprintf "%s\\n" "${RUN[@]}"'],
                         env={"SLURM_ARRAY_TASK_ID": str(len(points) - 1)},
                         capture_output=True, text=True)
  assert shown.stdout.splitlines() == [
      "--config=configs/table3.py:big", f"--workdir={root}/big/dropout_rate=0.3/seed2",
      "--config.data.tfds_data_dir=/d", f"--config.data.cache_dir={root}/data",
      "--config.model.dropout_rate=0.3", "--config.seed=2"]


def test_runs_share_the_sweeps_data_cache_unless_they_have_their_own(tmp_path):
  """New runs read ROOT/data; a run begun with WORKDIR/data (a sweep from before runs shared
  a cache) keeps it; a cache named with --set is used as it is."""
  root = tmp_path / "runs"
  (root / "A1" / "data").mkdir(parents=True)
  points = grid.points(["A1", "A2"], [], [])
  shared = f"--config.data.cache_dir={root}/data"
  commands = [sweep.Sweep("configs/table3.py", str(root)).command(p) for p in points]
  assert [shared in c for c in commands] == [False, True]
  given = sweep.Sweep("configs/table3.py", str(root), ("data.cache_dir=/cache",))
  assert all(shared not in given.command(p) for p in points)


def test_runs_that_log_to_wandb_have_their_grid_point_as_group(tmp_path):
  """Each row of a sweep (a variant's grid point) is one W&B group, its seeds the runs in it;
  only where the runs log to W&B, and not over a group the command names."""
  points = grid.points(["A1"], grid.parse_grid(["model.dropout_rate=0.1,0.3"]), [0, 1])

  def groups(*sets):
    commands = [sweep.Sweep("configs/table3.py", str(tmp_path), sets).command(p) for p in points]
    return [[c for c in command if c.startswith("--config.wandb.group=")] for command in commands]

  assert groups("wandb.project=p") == [["--config.wandb.group=A1/dropout_rate=0.1"]] * 2 + [
      ["--config.wandb.group=A1/dropout_rate=0.3"]] * 2
  assert groups() == [[]] * 4
  assert groups("wandb.project=p", "wandb.group=mine") == [["--config.wandb.group=mine"]] * 4
  seeds_only = sweep.Sweep("configs/table3.py", str(tmp_path), ("wandb.project=p",))
  assert not any("wandb.group" in c for p in grid.points(["A1"], [], [0, 1])
                 for c in seeds_only.command(p))  # the variant is the group already


def test_unknown_variant_lists_the_names_and_writes_nothing(tmp_path):
  run = _sweep("--config=configs/table3.py", "--variants=A1,Z9", f"--workdir={tmp_path}/r")
  assert run.returncode == 2 and run.stderr.count("\n") == 1
  assert run.stderr.startswith("error: --variants=A1,Z9: unknown variant Z9; configs/table3.py "
                               "has base, A1, A2")
  assert not (tmp_path / "r").exists()


def test_bad_overrides_grid_values_and_files_are_one_line_errors(sweep_config):
  short = grid.points(["short"], [], [])
  with pytest.raises(ConfigError, match=r"tiny_sweep.py:short: unknown config key model.dk; "
                     r"did you mean model.d_k\?"):
    sweep.Sweep(sweep_config, "runs", ("model.dk=3",)).check(short)
  with pytest.raises(ConfigError, match=r"^short/norm=mid: config.model.norm='mid' is not one "
                     r"of 'post', 'pre'$"):
    sweep.Sweep(sweep_config, "runs").check(
        grid.points(["short"], grid.parse_grid(["model.norm=pre,mid"]), []))
  with pytest.raises(ConfigError, match="expected KEY=VALUE"):
    sweep.overrides(["num_train_steps"])
  with pytest.raises(ConfigError, match="defines no NAMES: sweep it alone with --grid or "
                     "--seeds"):
    sweep.select("configs/base.py", "all")
  assert sweep.select("configs/base.py", "all", alone=True) == [None]


def test_bad_grid_key_is_one_line_before_anything_runs(tmp_path):
  run = _sweep("--config=configs/table3.py", "--variants=A1", f"--workdir={tmp_path}/r",
               "--grid", "model.dropout=0.1,0.2", "--seeds=0,1")
  assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
  assert run.stderr.startswith("error: configs/table3.py:A1: unknown config key "
                               "model.dropout; did you mean model.dropout_rate?")
  assert not (tmp_path / "r").exists()
