"""Training processes of a sweep run here: one after another, or several at once, each seeing
only its own accelerators.

`--parallel=N` keeps up to N runs going; `--devices_per_run=K` gives each K devices of the
machine's list (`--devices`, or found: `CUDA_VISIBLE_DEVICES`, else `nvidia-smi`, else the TPU
chips under /dev). A run's process sees only its devices through its environment:

- GPU: `CUDA_VISIBLE_DEVICES=<its ids>`; with more runs than GPUs and no
  `--devices_per_run`, runs share GPUs, each with `XLA_PYTHON_CLIENT_MEM_FRACTION` set to
  its part of 80% of the memory (the rest is left to each process's CUDA libraries); with
  XLA's autotuning off, 12 runs at once on one H200 have trained side by side
  (docs/research.md; what was tried on the way: CHANGELOG.md);
- TPU: `TPU_VISIBLE_CHIPS` (and the older `TPU_VISIBLE_DEVICES`) with `TPU_PROCESS_BOUNDS=
  1,1,1`, `TPU_CHIPS_PER_PROCESS_BOUNDS` for 1, 2 or 4 chips and a port of its own
  (`TPU_MESH_CONTROLLER_PORT`), libtpu's settings for independent processes on one TPU VM
  (not tried on a TPU here);
- CPU: nothing to split; N processes share the cores.

With N = 1 a run prints to the sweep's terminal, as a sweep always did. With N > 1 each run
appends its output to `<workdir>/train.log`, and the sweep prints one progress line per
running run (its step and loss, from its `metrics.jsonl`) every `progress_every` seconds and
the last lines of the log of a run that fails. A crash stops only that run. SIGTERM stops
every running run (each saves a checkpoint after its step in flight) and starts no more;
Ctrl-C reaches the runs from the terminal by itself (and a run started as it landed, from the
sweep), and the sweep waits for them likewise.

Runs of one group (a row's seeds: one config but the seed, so the same programs) compile
once: while one of them compiles, the others wait and runs of other groups take the free
slots. They start once its train.log says it has compiled its training and dev programs
ahead of step 1 (they are then in the compilation cache, where the others read them), or it
has logged a line to its `metrics.jsonl` (a run that compiles nothing ahead), or has ended.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

from transformer.errors import ConfigError
from transformer.run import compilation

# libtpu's chip bounds for one process of 1, 2 or 4 chips of a TPU VM.
_TPU_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1"}
_TPU_PORT = 8476


@dataclasses.dataclass(frozen=True)
class Devices:
  """The accelerators a sweep may hand out: kind 'cpu' (none to split), 'gpu' or 'tpu'."""

  kind: str
  ids: tuple[str, ...] = ()


def find_devices(environ=os.environ) -> Devices:
  """This machine's GPUs (`CUDA_VISIBLE_DEVICES`, else `nvidia-smi`), else its TPU chips
  (/dev/accel*, /dev/vfio/<n>), else the CPU. Starts no JAX backend: the sweep must leave
  the accelerators to its runs."""
  visible = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
  if visible:
    return Devices("gpu", tuple(v.strip() for v in visible.split(",") if v.strip()))
  if shutil.which("nvidia-smi"):
    try:
      out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
      out = None
    ids = tuple(line.strip() for line in out.stdout.splitlines()
                if line.strip().isdigit()) if out and out.returncode == 0 else ()
    if ids:
      return Devices("gpu", ids)
  # TPU chips are /dev/accel<n> (v4 and before) or /dev/vfio/<n> (v5e, v6e), where libtpu is
  # installed; other accelerators use those names too.
  chips = glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*")
  if chips and importlib.util.find_spec("libtpu") is not None:
    return Devices("tpu", tuple(str(i) for i in range(len(chips))))
  return Devices("cpu")


def parse_devices(text: str, environ=os.environ) -> Devices:
  """`--devices`: 'auto' (`find_devices`), 'cpu', 'gpu:0,1,2,3' or 'tpu:0,1,2,3'."""
  text = text.strip()
  if text == "auto":
    return find_devices(environ)
  if text == "cpu":
    return Devices("cpu")
  kind, sep, ids = text.partition(":")
  chosen = tuple(i.strip() for i in ids.split(",") if i.strip())
  if kind not in ("gpu", "tpu") or not sep or not chosen:
    raise ConfigError(f"--devices={text}: expected auto, cpu, gpu:IDS or tpu:IDS, e.g. "
                      "--devices=gpu:0,1,2,3")
  return Devices(kind, chosen)


def slot_environments(devices: Devices, parallel: int, per_run: int) -> list[dict[str, str]]:
  """The environment variables of each of `parallel` slots: the devices its runs see.

  Args:
    devices: what there is to hand out.
    parallel: how many runs at once.
    per_run: devices per run; 0: all of them with `parallel` 1, else an equal share.

  Raises:
    ConfigError: more devices asked for than there are, or a TPU share libtpu cannot bound.
  """
  if parallel < 1 or per_run < 0:
    raise ConfigError(f"--parallel={parallel} must be >= 1 and --devices_per_run={per_run} "
                      ">= 0")
  if devices.kind == "cpu":
    return [{} for _ in range(parallel)]
  if parallel == 1 and per_run == 0:
    return [{}]  # the whole machine, as without a sweep
  if devices.kind == "gpu" and per_run == 0 and parallel > len(devices.ids):
    # More runs than GPUs (small runs on one GPU): they share, each held to its part of the
    # GPU's memory (JAX takes 75% of it by default). Their parts add up to at most 80%, rounded
    # down, leaving the rest to each process's CUDA libraries (cuBLASLt failed to start in two
    # of 16 processes that held 0.06 each).
    per_gpu = math.ceil(parallel / len(devices.ids))
    return [{"CUDA_VISIBLE_DEVICES": devices.ids[slot % len(devices.ids)],
             "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{math.floor(80 / per_gpu) / 100:.2f}"}
            for slot in range(parallel)]
  per_run = per_run or len(devices.ids) // parallel
  if per_run < 1 or parallel * per_run > len(devices.ids):
    raise ConfigError(f"--parallel={parallel} runs of --devices_per_run={per_run or 1} need "
                      f"{parallel * max(per_run, 1)} {devices.kind.upper()}s but "
                      f"{len(devices.ids)} are there ({','.join(devices.ids)}); lower one")
  if devices.kind == "tpu" and per_run not in _TPU_BOUNDS:
    raise ConfigError(f"--devices_per_run={per_run}: a run on a TPU VM takes 1, 2 or 4 chips")
  slots = []
  for slot in range(parallel):
    ids = ",".join(devices.ids[slot * per_run:(slot + 1) * per_run])
    if devices.kind == "gpu":
      slots.append({"CUDA_VISIBLE_DEVICES": ids})
    else:
      port = str(_TPU_PORT + slot)
      slots.append({"TPU_VISIBLE_CHIPS": ids, "TPU_VISIBLE_DEVICES": ids,
                    "TPU_PROCESS_BOUNDS": "1,1,1",
                    "TPU_CHIPS_PER_PROCESS_BOUNDS": _TPU_BOUNDS[per_run],
                    "TPU_MESH_CONTROLLER_ADDRESS": f"localhost:{port}",
                    "TPU_MESH_CONTROLLER_PORT": port})
  return slots


@dataclasses.dataclass
class Job:
  """One run to train: its command, where it trains and how far."""

  name: str  # its folder below the sweep root, for messages
  argv: list[str]  # the command; argv[0] 'python' runs as this interpreter
  workdir: str
  total_steps: int
  message: str = ""  # logged when it starts
  group: str = ""  # jobs of one group compile the same programs, one after another; '': none

  def size(self, name: str) -> int:
    """The size of a file in its workdir (0: none yet)."""
    try:
      return os.path.getsize(os.path.join(self.workdir, name))
    except OSError:
      return 0


@dataclasses.dataclass
class _Running:
  job: Job
  proc: subprocess.Popen
  log: object  # its train.log, open, or None
  started: float  # time.monotonic()
  metrics_at_start: int  # the size of its metrics.jsonl then (a resumed run has some)
  read_to: int  # how far its train.log has been read (from its size at the start)
  compiled: bool = False

  def compiling(self) -> bool:
    """Whether it may still be compiling its programs: it runs and has neither said it
    compiled them (train.log) nor logged a metric since it started."""
    if self.compiled or self.proc.poll() is not None:
      return False
    if self.log is not None:
      mark = compilation.COMPILED_AHEAD.encode()
      with open(self.log.name, "rb") as f:
        f.seek(max(0, self.read_to - len(mark)))  # the mark may straddle the last read
        self.compiled, self.read_to = mark in f.read(), f.tell()
    self.compiled = self.compiled or self.job.size("metrics.jsonl") > self.metrics_at_start
    return not self.compiled


def progress(job: Job, started: float) -> str:
  """`NAME: step S/T, loss L, 3m05s` from the last training line of its metrics.jsonl."""
  elapsed = _duration(time.monotonic() - started)
  last = None
  try:
    with open(os.path.join(job.workdir, "metrics.jsonl"), "rb") as f:
      f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
      for line in f.read().decode("utf-8", "replace").splitlines():
        try:
          entry = json.loads(line)
        except ValueError:
          continue
        if isinstance(entry, dict) and "train/loss" in entry:
          last = entry
  except OSError:
    pass
  if last is None:
    return f"{job.name}: starting, {elapsed}"
  return (f"{job.name}: step {last['step']}/{job.total_steps}, loss {last['train/loss']:.3f}, "
          f"{elapsed}")


def _duration(seconds: float) -> str:
  minutes, seconds = divmod(int(seconds), 60)
  hours, minutes = divmod(minutes, 60)
  return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def _tail(path: str, lines: int = 20) -> str:
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      return "".join(f.readlines()[-lines:])
  except OSError:
    return ""


class Launcher:
  """Runs jobs, up to one per slot at a time, each with its slot's environment."""

  def __init__(self, slots: list[dict[str, str]], *, progress_every: float = 60.0,
               out=None):
    self.slots = slots
    self.progress_every = progress_every
    self.out = out or sys.stderr

  def _say(self, text: str) -> None:
    print(text, file=self.out, flush=True)

  def _start(self, job: Job, slot: int):
    env = dict(os.environ, **self.slots[slot])
    argv = [sys.executable, *job.argv[1:]] if job.argv[0] == "python" else job.argv
    if job.message:
      shown = " ".join(f"{k}={v}" for k, v in self.slots[slot].items() if "VISIBLE" in k)
      self._say(f"{job.message}{f' ({shown})' if shown else ''}")
    if len(self.slots) == 1:
      return subprocess.Popen(argv, env=env), None
    os.makedirs(job.workdir, exist_ok=True)
    log = open(os.path.join(job.workdir, "train.log"), "a")
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT), log

  def _next(self, pending: list[Job], running: dict[int, _Running], held: set[str]):
    """The first pending job that no running job of its group is compiling for, or None;
    says once of each job that waits why it does."""
    compiling_for = {r.job.group: r.job for r in running.values()
                     if r.job.group and r.compiling()}  # each log read once a call
    for job in pending:
      compiling = compiling_for.get(job.group) if job.group else None
      if compiling is None:
        return job
      if job.name not in held:
        held.add(job.name)
        self._say(f"{job.name}: waits for {compiling.name} to compile its programs, then "
                  "reads them from the compilation cache")
    return None

  def run(self, jobs: list[Job]) -> tuple[dict[str, int], bool]:
    """Runs `jobs` in order, each as soon as a slot is free, except that a job waits while
    another of its group compiles (a later one that need not wait takes the slot); returns
    each started job's exit status by name, and whether the sweep was asked to stop (then
    the rest never start)."""
    pending, running, codes, stopping, held = list(jobs), {}, {}, [], set()
    signalled = set()  # the runs `forward` has passed a signal on to, by process id

    def forward(signum, frame):
      del frame
      stopping.append(signum)
      for r in running.values():
        r.proc.send_signal(signum)
        signalled.add(r.proc.pid)

    def interrupted(signum, frame):
      del frame
      stopping.append(signum)  # the runs got it too, from the terminal: wait for them

    # Ctrl-C is noted, not raised: a KeyboardInterrupt between a run's start and its
    # registration below would leave that run unwatched. Not where SIGINT is ignored (a
    # background job), whose runs must inherit that.
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, forward)}
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
      previous[signal.SIGINT] = signal.signal(signal.SIGINT, interrupted)
    shown = time.monotonic()
    try:
      while running or (pending and not stopping):
        free = [s for s in range(len(self.slots)) if s not in running]
        while free and not stopping and (job := self._next(pending, running, held)):
          pending.remove(job)
          sizes, slot = (job.size("metrics.jsonl"), job.size("train.log")), free.pop(0)
          proc, log = self._start(job, slot)
          running[slot] = _Running(job, proc, log, time.monotonic(), *sizes)
          if stopping and proc.pid not in signalled:
            proc.send_signal(stopping[-1])  # the signal came while it was starting
            signalled.add(proc.pid)
        for slot, r in list(running.items()):
          job, proc, log, started = r.job, r.proc, r.log, r.started
          if proc.poll() is None:
            continue
          del running[slot]
          codes[job.name] = proc.returncode
          if log is not None:
            log.close()
            if proc.returncode in (0, 130) or stopping:
              self._say(f"{job.name}: exit {proc.returncode} after "
                        f"{_duration(time.monotonic() - started)}")
            else:
              self._say(f"{job.name}: exit {proc.returncode}; the end of {log.name}:\n"
                        + _tail(log.name))
        if len(self.slots) > 1 and running and time.monotonic() - shown >= self.progress_every:
          shown = time.monotonic()
          self._say("\n".join(progress(r.job, r.started) for r in running.values()))
        time.sleep(0.2)
    finally:
      for signum, handler in previous.items():
        signal.signal(signum, handler)
    return codes, bool(stopping)
