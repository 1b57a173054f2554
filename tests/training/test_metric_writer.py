"""metrics.jsonl: one line per logged step, timed from the start of training across resumes;
TensorBoard's event files, read back by TensorBoard; a failed run leaves the process as it
was."""

import errno
import json
import os
import signal
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tests import support
from tests.conftest import REPO
from transformer import errors
from transformer.training import metric_writer
from transformer.training import train_lib


def _lines(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_time_counts_on_from_the_kept_lines_after_a_resume(tmp_path, monkeypatch):
  clock = [1000.0]
  monkeypatch.setattr(metric_writer.time, "time", lambda: clock[0])
  writer = metric_writer.MetricWriter(str(tmp_path), total_steps=30)
  for step in (10, 20, 30):
    clock[0] += 5.0
    writer.write(step, {"loss": 1.0})
  writer.close()
  assert [(r["step"], r["time"]) for r in _lines(tmp_path)] == [(10, 5.0), (20, 10.0), (30, 15.0)]

  clock[0] = 5000.0  # a later run resumes from the checkpoint at step 20
  writer = metric_writer.MetricWriter(str(tmp_path), total_steps=30, start_step=20)
  clock[0] += 2.0
  writer.write(30, {"loss": 0.5})
  writer.close()
  assert [(r["step"], r["time"]) for r in _lines(tmp_path)] == [(10, 5.0), (20, 10.0), (30, 12.0)]


def test_durations_read_as_hours_and_minutes_or_minutes_and_seconds():
  assert metric_writer.format_duration(3725.9) == "1h02m"
  assert metric_writer.format_duration(249) == "4m09s"
  assert metric_writer.format_duration(-3) == "0m00s"


def test_the_window_sums_steps_on_every_device_exactly_and_resumes_from_its_state():
  """The running sums are the float32 sums of the steps' metrics, as the step returns them
  (replicated over the 8 devices), added in order; a window built from `state()` (a
  checkpoint's) goes on to the same sums as one that never stopped."""
  replicated = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P())
  rng = np.random.default_rng(0)
  steps = [{k: np.float32(v) for k, v in zip(("loss", "weight", "grad_norm", "nonfinite"),
                                                rng.uniform(0, 100, 4))} for _ in range(6)]
  window = metric_writer.LogWindow()
  for i, metrics in enumerate(steps):
    if i == 3:
      window = metric_writer.LogWindow(json.loads(json.dumps(window.state())))
    window.add(jax.device_put(metrics, replicated))
  expected = {k: np.float32(0) for k in steps[0]}
  for metrics in steps:
    expected = {k: np.float32(expected[k] + metrics[k]) for k in expected}
  got = jax.device_get(window.sums)
  assert {k: float(v) for k, v in got.items()} == {k: float(v) for k, v in expected.items()}
  assert window.steps == 6


class _FailingStream(support.StepStream):
  def __next__(self):
    if self.step == 2:
      raise RuntimeError("the input failed")
    return super().__next__()


def test_a_run_that_fails_leaves_the_process_as_it_was(tmp_path):
  """The writer's `threading` hook, the stop handlers and the compilation cache setting are
  the run's alone: a step that raises puts them back too."""
  def process_state():
    return (threading.excepthook, sys.unraisablehook, signal.getsignal(signal.SIGTERM),
            signal.getsignal(signal.SIGINT), jax.config.jax_compilation_cache_dir)

  before = process_state()
  data = support.in_memory_data()
  data.train = _FailingStream()
  with pytest.raises(RuntimeError, match="the input failed"):
    train_lib.train_and_evaluate(support.in_memory_config(5), str(tmp_path), data=data)
  assert process_state() == before


_IMPORTS = """
import sys
import transformer.research.report, transformer.training.train_lib
from transformer.training import metric_writer
metric_writer.MetricWriter(sys.argv[1], total_steps=1).close()
print(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "tensorflow", "tensorboardX",
                                                      "tensorboard"}))
"""


def test_writing_events_imports_no_framework(tmp_path):
  """The event files are the project's own writing: neither PyTorch nor TensorFlow (which
  tensorboardX and tensorboard's writer import wherever installed) is loaded for them."""
  out = subprocess.run([sys.executable, "-c", _IMPORTS, str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.split() == ["[]"]
  assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1


def test_tensorboard_reads_the_scalars_back(tmp_path):
  """What `tensorboard --logdir` shows: each tag's steps and values, read by TensorBoard's
  own loader (which checks every record's checksums)."""
  event_accumulator = pytest.importorskip(
      "tensorboard.backend.event_processing.event_accumulator",
      reason="reading the event files back needs tensorboard")
  writer = metric_writer.MetricWriter(str(tmp_path), total_steps=20)
  writer.write(10, {"loss": 2.5, "learning_rate": 1e-3})
  writer.write(20, {"loss": 1.25})
  writer.write(20, {"bleu": 12.5}, prefix="dev")
  writer.close()
  events = event_accumulator.EventAccumulator(str(tmp_path))
  events.Reload()
  read = {tag: [(e.step, e.value) for e in events.Scalars(tag)]
          for tag in events.Tags()["scalars"]}
  assert read == {"train/loss": [(10, 2.5), (20, 1.25)],
                  "train/learning_rate": [(10, np.float32(1e-3))], "dev/bleu": [(20, 12.5)]}


def test_events_that_fill_the_disk_are_one_line(tmp_path, monkeypatch):
  writer = metric_writer.MetricWriter(str(tmp_path), total_steps=10)

  def no_room(*args):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(metric_writer.EventFile, "add_scalars", no_room)
  with pytest.raises(errors.DiskFull, match=rf"^No space left on device while writing the "
                     rf"TensorBoard events to {tmp_path}; make room"):
    writer.write(1, {"loss": 1.0})
  writer.close()
