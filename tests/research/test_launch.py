"""Runs side by side: the sweep's command line with a stand-in for train.py that records its
arguments and environment, so that what each process receives (its workdir, seed and devices)
and how many run at once are seen without training; stopping and crashes; device shares."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from transformer.errors import ConfigError
from transformer.research import grid
from transformer.research import launch
from transformer.research import sweep
from transformer.run import compilation

_CONFIG = '''
from tests import support

NAMES = ("a", "b")


def get_config(name="a"):
  config = support.files_config({data!r})
  config.num_train_steps = 100
  config.variant = name
  return config
'''

# Records what it was given, then: 'train' waits until two runs have started (so the first
# two must run at once), "trains" to step 100 (b/seed1 crashes); 'wait' waits for SIGTERM.
_TRAINER = '''
import json, os, pathlib, signal, sys, time

args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
workdir = pathlib.Path(args["workdir"])
started = pathlib.Path(os.environ["FAKE_STARTED"])
record = {"argv": sys.argv[1:], "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
          "start": time.time()}


def done(**extra):
  (workdir / "fake.json").write_text(json.dumps(dict(record, end=time.time(), **extra)))


if os.environ["FAKE_MODE"] == "wait":  # its handler in place before it says it started
  signal.signal(signal.SIGTERM, lambda *_: (done(term=True), sys.exit(0)))
(started / str(os.getpid())).touch()
if os.environ["FAKE_MODE"] == "wait":
  time.sleep(60)
  sys.exit(5)
deadline = time.time() + 30
while len(list(started.iterdir())) < 2:
  if time.time() > deadline:
    sys.exit(9)
  time.sleep(0.05)
time.sleep(0.3)
print("fake training step 100/100")
if args["config"].endswith(":b") and args.get("config.seed") == "1":
  print("boom", file=sys.stderr)
  done()
  sys.exit(3)
(workdir / "checkpoints" / "100").mkdir(parents=True)
done()
'''


@pytest.fixture
def fake(tmp_path):
  data = tmp_path / "data"
  data.mkdir()
  (tmp_path / "sweep_config.py").write_text(_CONFIG.format(data=str(data)))
  (tmp_path / "trainer.py").write_text(_TRAINER)
  (tmp_path / "started").mkdir()
  return tmp_path


def _sweep(tmp_path, mode, *args, popen=False):
  env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
  env.update(FAKE_MODE=mode, FAKE_STARTED=str(tmp_path / "started"))
  argv = [sys.executable, "-m", "transformer.research.sweep",
          f"--config={tmp_path / 'sweep_config.py'}", f"--workdir={tmp_path / 'runs'}",
          f"--trainer={tmp_path / 'trainer.py'}", "--variants=a,b", *args]
  if popen:
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
  return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def _records(root):
  return {str(p.parent.relative_to(root)): json.loads(p.read_text())
          for p in root.rglob("fake.json")}


def test_each_run_sees_its_own_gpus_two_at_a_time_and_a_crash_stops_only_itself(fake):
  run = _sweep(fake, "train", "--seeds=0,1", "--parallel=2", "--devices=gpu:0,1,2,3",
               "--nocompile_once")  # a/seed0 and a/seed1 first, at once
  assert run.returncode == 1, run.stderr[-3000:]
  assert "waits for" not in run.stderr
  assert run.stderr.splitlines()[-1].startswith(
      "error: 1 of 4 runs did not finish: b/seed1; run the same command again")
  assert "b/seed1: exit 3; the end of" in run.stderr and "boom" in run.stderr
  assert [line.split() for line in run.stdout.splitlines()] == [
      ["a/seed0", "trained"], ["a/seed1", "trained"], ["b/seed0", "trained"],
      ["b/seed1", "failed", "(exit", "3)", "at", "step", "0"]]
  records = _records(fake / "runs")
  assert sorted(records) == ["a/seed0", "a/seed1", "b/seed0", "b/seed1"]
  for name, r in records.items():
    variant, seed = name.split("/")
    assert f"--workdir={fake / 'runs' / name}" in r["argv"]
    assert r["argv"][0].endswith(f":{variant}") and f"--config.seed={seed[4:]}" in r["argv"]
    assert r["devices"] in ("0,1", "2,3")
    assert (fake / "runs" / name / "train.log").is_file()
  assert "fake training step" in (fake / "runs" / "a" / "seed0" / "train.log").read_text()
  # Runs that overlapped in time had different devices; never more than two at once.
  spans = sorted((r["start"], r["end"], r["devices"]) for r in records.values())
  assert spans[0][1] > spans[1][0]  # the first two ran at once
  for i, (start, end, devices) in enumerate(spans):
    overlapping = [s for s in spans[i + 1:] if s[0] < end]
    assert len(overlapping) <= 1 and all(s[2] != devices for s in overlapping)


def test_on_the_cpu_runs_share_the_machine_and_finished_runs_are_skipped(fake):
  run = _sweep(fake, "train", "--parallel=2", "--devices=cpu")
  assert run.returncode == 0, run.stderr[-3000:]
  records = _records(fake / "runs")
  assert sorted(records) == ["a", "b"]  # without --seeds: ROOT/NAME, as before seeds existed
  assert [r["devices"] for r in records.values()] == [None, None]
  assert not any("--config.seed" in arg for r in records.values() for arg in r["argv"])
  again = _sweep(fake, "train", "--parallel=2", "--devices=cpu")
  assert again.returncode == 0, again.stderr[-3000:]
  assert "a: finished before (step 100 of 100), skipped" in again.stderr
  assert json.loads((fake / "runs" / "sweep.json").read_text())["variants"] == ["a", "b"]


def test_sigterm_stops_every_running_run_and_starts_no_more(fake):
  proc = _sweep(fake, "wait", "--seeds=0,1", "--parallel=2", "--devices=cpu", popen=True)
  deadline = time.time() + 60
  while len(list((fake / "started").iterdir())) < 2:
    assert time.time() < deadline and proc.poll() is None, proc.communicate()
    time.sleep(0.1)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 1, err[-3000:]
  records = _records(fake / "runs")
  # a/seed1 waited for a/seed0 to compile (it never logs), so b/seed0 took the free slot.
  assert "a/seed1: waits for a/seed0 to compile its programs" in err
  assert sorted(records) == ["a/seed0", "b/seed0"] and all(r["term"] for r in records.values())
  assert [line.split()[1:] for line in out.splitlines()] == [
      ["stopped", "at", "step", "0"], ["not", "started"]] * 2


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_a_run_starts_reaches_that_run_too(tmp_path, monkeypatch, signum):
  """The signal lands after the run's process exists and before the launcher holds it among
  its running runs: the launcher holds it and passes the signal on, rather than wait out the
  run (SIGTERM) or lose it (Ctrl-C, once raised there as a KeyboardInterrupt), and starts no
  more. A run may start after the terminal's Ctrl-C; train.py ignores a second one while it
  saves."""
  start = launch.Launcher._start

  def start_then_signalled(self, job, slot):
    started = start(self, job, slot)
    os.kill(os.getpid(), signum)  # handled (by the launcher) before this returns
    return started

  monkeypatch.setattr(launch.Launcher, "_start", start_then_signalled)
  sleeper = ["python", "-c", "import time; time.sleep(30)"]
  jobs = [launch.Job(name, sleeper, str(tmp_path / name), 100) for name in ("a", "b")]
  began = time.monotonic()
  before = signal.signal(signal.SIGINT, signal.default_int_handler)  # an xdist worker ignores it
  try:
    codes, stopped = launch.Launcher([{}]).run(jobs)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
  finally:
    signal.signal(signal.SIGINT, before)
  assert stopped and codes == {"a": -signum}  # b never started
  assert time.monotonic() - began < 20


def test_where_sigint_is_ignored_the_runs_inherit_that(tmp_path):
  """A sweep started as a background job ignores Ctrl-C, and so must its runs."""
  told = ["python", "-c", "import signal, sys; open(sys.argv[1], 'w').write("
          "str(signal.getsignal(signal.SIGINT) is signal.SIG_IGN))", str(tmp_path / "ignored")]
  job = launch.Job("a", told, str(tmp_path), 1)
  before = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    assert launch.Launcher([{}]).run([job]) == ({"a": 0}, False)
  finally:
    signal.signal(signal.SIGINT, before)
  assert (tmp_path / "ignored").read_text() == "True"


# A stand-in run (argv: workdir, mode, seconds, then, the compile mark): says when it
# started; "compiles" for `seconds`, then fails (mode 'fail'), or says in its log that it
# compiled (mode 'mark'; a metrics line 1.5 s later), or appends a metrics line at once (mode
# 'metrics'); trains on for `then` seconds and says when it ended. Each "says" is a file in
# its workdir holding the time.
_COMPILING_RUN = """
import pathlib, sys, time
workdir, mode, seconds, then, mark = pathlib.Path(sys.argv[1]), *sys.argv[2:]
say = lambda what: (workdir / what).write_text(repr(time.time()))
say("start")
time.sleep(float(seconds))
if mode == "fail":
  sys.exit(1)
if mode == "mark":
  say("compiled")
  print(f"compiled 3 {mark} in {seconds} s", flush=True)
  time.sleep(1.5)
with open(workdir / "metrics.jsonl", "a") as f:
  f.write('{"step": 50, "train/loss": 3.0}\\n')
say("logged")
time.sleep(float(then))
say("end")
"""


def _compile_jobs(tmp_path, groups, first, seconds=0.5, then=0.0):
  """a0 (in mode `first`, compiling for `seconds`, training for `then`), b0 and a1 (neither
  compiling nor training) in `groups`, three slots; their exit codes and when each did
  what."""
  names = ("a0", "b0", "a1")
  for name in names:
    (tmp_path / name).mkdir(parents=True, exist_ok=True)
  jobs = [launch.Job(name, ["python", "-c", _COMPILING_RUN, str(tmp_path / name),
                            *((first, str(seconds), str(then)) if name == "a0"
                              else ("metrics", "0", "0")),
                            compilation.COMPILED_AHEAD], str(tmp_path / name), 100,
                     group=group) for name, group in zip(names, groups)]
  codes, stopped = launch.Launcher([{}] * 3, out=open(os.devnull, "w")).run(jobs)
  assert not stopped
  return codes, {name: {p.name: float(p.read_text()) for p in (tmp_path / name).iterdir()
                        if p.name in ("start", "compiled", "logged", "end")} for name in names}


def test_a_rows_other_seeds_wait_for_its_first_run_to_compile(tmp_path):
  """a1 waits for a0 (its group) to say it compiled, though a slot is free; b0 (another
  group) starts at once; a1 starts before a0 logs a metric. a0 resumes: its train.log and
  metrics.jsonl have lines of its last start, which do not count."""
  (tmp_path / "a0").mkdir()
  (tmp_path / "a0" / "metrics.jsonl").write_text('{"step": 10, "train/loss": 5.0}\n')
  (tmp_path / "a0" / "train.log").write_text(f"compiled 3 {compilation.COMPILED_AHEAD} in 1 s\n")
  codes, t = _compile_jobs(tmp_path, ("a", "b", "a"), "mark")
  assert codes == {"a0": 0, "b0": 0, "a1": 0}
  assert t["b0"]["start"] < t["a0"]["compiled"] <= t["a1"]["start"] < t["a0"]["logged"]


def test_a_run_that_says_nothing_releases_its_group_by_a_metric_or_by_ending(tmp_path):
  codes, t = _compile_jobs(tmp_path / "metrics", ("a", "b", "a"), "metrics", then=1.5)
  assert codes == {"a0": 0, "b0": 0, "a1": 0}
  assert t["b0"]["start"] < t["a0"]["logged"] <= t["a1"]["start"] < t["a0"]["end"]
  codes, t = _compile_jobs(tmp_path / "failed", ("a", "b", "a"), "fail")
  assert codes == {"a0": 1, "b0": 0, "a1": 0}
  assert t["a1"]["start"] >= t["a0"]["start"] + 0.5  # after a0 ended
  codes, t = _compile_jobs(tmp_path / "plain", ("", "", ""), "metrics", seconds=1.5)
  assert t["a1"]["start"] < t["a0"]["logged"]  # no groups: all three at once


def test_a_rows_seeds_are_one_compile_group_at_the_sweep_root_too():
  group, cache = sweep.Sweep._compile_group, {"compilation_cache_dir": "~/.cache/xla"}
  at_root = [group(grid.Point(None, (), seed, f"seed{seed}"), cache) for seed in (0, 1)]
  assert at_root[0] == at_root[1] != ""
  assert group(grid.Point("a", (), 0, "a/seed0"), cache) != group(
      grid.Point("b", (), 0, "b/seed0"), cache)
  assert group(grid.Point("a", (("lr", "1"),), 0, "a/lr=1/seed0"), cache) != group(
      grid.Point("a", (("lr", "2"),), 0, "a/lr=2/seed0"), cache)
  assert group(grid.Point("a", (), None, "a"), cache) == ""  # without --seeds
  assert group(grid.Point("a", (), 0, "a/seed0"), {"compilation_cache_dir": ""}) == ""


def test_progress_line_reads_the_runs_metrics(tmp_path):
  job = launch.Job("a/seed0", [], str(tmp_path), 100)
  assert launch.progress(job, time.monotonic()).startswith("a/seed0: starting, 0m0")
  (tmp_path / "metrics.jsonl").write_text(
      '{"step": 10, "train/loss": 3.5}\n{"step": 10, "dev/perplexity": 9}\n'
      '{"step": 20, "train/loss": 2.25}\n{"step": 30, "train/lo')  # the last line cut short
  assert launch.progress(job, time.monotonic() - 65) == "a/seed0: step 20/100, loss 2.250, 1m05s"


def test_device_shares():
  gpus = launch.Devices("gpu", ("0", "1", "2", "3", "4", "5", "6", "7"))
  assert launch.slot_environments(gpus, 1, 0) == [{}]  # the whole machine
  assert [e["CUDA_VISIBLE_DEVICES"] for e in launch.slot_environments(gpus, 4, 0)] == [
      "0,1", "2,3", "4,5", "6,7"]
  assert [e["CUDA_VISIBLE_DEVICES"] for e in launch.slot_environments(gpus, 3, 1)] == [
      "0", "1", "2"]
  assert launch.slot_environments(launch.Devices("cpu"), 3, 0) == [{}, {}, {}]
  # More runs than GPUs: small runs share one, each held to its part of 80% of the memory,
  # rounded down (16 runs at 0.06 left too little to CUDA's libraries).
  assert launch.slot_environments(launch.Devices("gpu", ("0",)), 2, 0) == [
      {"CUDA_VISIBLE_DEVICES": "0", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.40"}] * 2
  assert {e["XLA_PYTHON_CLIENT_MEM_FRACTION"]
          for e in launch.slot_environments(launch.Devices("gpu", ("0", "1")), 32, 0)} == {"0.05"}
  tpu = launch.slot_environments(launch.Devices("tpu", ("0", "1", "2", "3")), 2, 2)
  assert [(e["TPU_VISIBLE_CHIPS"], e["TPU_CHIPS_PER_PROCESS_BOUNDS"],
           e["TPU_MESH_CONTROLLER_PORT"]) for e in tpu] == [("0,1", "1,2,1", "8476"),
                                                           ("2,3", "1,2,1", "8477")]
  with pytest.raises(ConfigError, match=r"--parallel=3 runs of --devices_per_run=3 need 9 GPUs "
                     r"but 8 are there"):
    launch.slot_environments(gpus, 3, 3)
  with pytest.raises(ConfigError, match="takes 1, 2 or 4 chips"):
    launch.slot_environments(launch.Devices("tpu", tuple("012345")), 2, 3)
  assert launch.parse_devices("gpu:2,3") == launch.Devices("gpu", ("2", "3"))
  assert launch.parse_devices("auto", {"CUDA_VISIBLE_DEVICES": "1,5"}) == launch.Devices(
      "gpu", ("1", "5"))
  with pytest.raises(ConfigError, match="--devices=gpu: expected auto, cpu, gpu:IDS"):
    launch.parse_devices("gpu")
