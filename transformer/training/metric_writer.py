"""Where training metrics go: TensorBoard event files, a JSON-lines file, console progress
(and a Weights & Biases run where `config.wandb` names one: `tracking.py`).

TensorBoard's event files (`events.out.tfevents.*`, read by `tensorboard --logdir`) are
written here (`EventFile`): training logs scalars alone, each record a few bytes of
protocol buffer in TFRecord framing. The libraries that write them import a framework
wherever one is installed (tensorboardX imports PyTorch; tensorboard's own
`summary.Writer` imports TensorFlow through its file layer), seconds of CPU at every start
of a run. Only process 0 writes; the others are silent. `metrics.jsonl` in the workdir
holds one JSON object per logged step, with `time`: seconds since training started, summed
over resumes; on resume, lines past the restored step (from the interrupted run) are dropped
so the file reads as one uninterrupted run. Running out of disk space or quota while writing
either is `errors.DiskFull`, one line naming the file.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time

import jax
import jax.numpy as jnp
from absl import logging

from transformer import errors
from transformer.data import textio
from transformer.training import losses


def format_duration(seconds: float) -> str:
  """`1h05m` from an hour on, else `4m09s`: the console's ETA and the reports' wall times."""
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _crc32c_table() -> list[int]:
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)  # Castagnoli, reflected
    table.append(crc)
  return table


_CRC32C = _crc32c_table()


def _masked_crc32c(data: bytes) -> int:
  """TFRecord's checksum: CRC-32C, rotated and offset ("masked")."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  crc ^= 0xFFFFFFFF
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
  out = bytearray()
  while True:
    byte, n = n & 0x7F, n >> 7
    out.append(byte | (0x80 if n else 0))
    if not n:
      return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
  """A length-delimited protocol-buffer field (strings, messages)."""
  return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int = 0, *, file_version: str = "",
           scalars: dict[str, float] | None = None) -> bytes:
  """A `tensorflow.Event` (tensorboard/compat/proto/event.proto): wall_time (1, double),
  step (2, int64), file_version (3) or summary (5): `Summary.value` (1) entries of tag (1)
  and simple_value (2, float)."""
  out = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step)
  if file_version:
    out += _field(3, file_version.encode())
  values = b"".join(_field(1, _field(1, tag.encode()) + b"\x15" + struct.pack("<f", value))
                    for tag, value in (scalars or {}).items())
  return out + (_field(5, values) if values else b"")


class EventFile:
  """One TensorBoard event file in `folder`, written and flushed in the caller's thread, so
  that a full disk is an error where the scalars are written."""

  def __init__(self, folder: str):
    name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
    self.path = os.path.join(folder, name)
    os.makedirs(folder, exist_ok=True)
    self._file = open(self.path, "ab")
    self._write(_event(time.time(), file_version="brain.Event:2"))

  def _write(self, event: bytes) -> None:
    header = struct.pack("<Q", len(event))
    self._file.write(header + struct.pack("<I", _masked_crc32c(header)) + event
                     + struct.pack("<I", _masked_crc32c(event)))
    self._file.flush()

  def add_scalars(self, step: int, scalars: dict[str, float]) -> None:
    self._write(_event(time.time(), step, scalars=scalars))

  def close(self) -> None:
    self._file.close()


class MetricWriter:
  """Writes scalars to TensorBoard, `metrics.jsonl` and `tracker` (a W&B run,
  `transformer.training.tracking`, or None), and prints progress with an ETA."""

  def __init__(self, workdir: str, total_steps: int, start_step: int = 0, tracker=None):
    self.enabled = jax.process_index() == 0
    self.tracker = tracker
    self.total_steps = total_steps
    self.workdir, self.path = workdir, os.path.join(workdir, "metrics.jsonl")
    self.events, self._closed = None, False
    if self.enabled:
      with errors.writing("the TensorBoard events", workdir):
        self.events = EventFile(workdir)
    self._t0, self._step0 = time.time(), start_step
    self._time_before = 0.0  # seconds the kept lines of earlier runs (before a resume) span
    if self.enabled:
      self._truncate_after(start_step)

  def _truncate_after(self, step: int) -> None:
    """Keeps the lines up to `step` (the restored checkpoint); a line cut short by a kill
    during its write is dropped with a warning."""
    if not os.path.exists(self.path):
      return
    with open(self.path, encoding="utf-8") as f:
      lines = f.read().split("\n")
    kept = []
    for number, line in enumerate(lines, start=1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError:
        logging.warning("%s:%d is not a whole JSON line (a kill during its write?): dropped",
                        self.path, number)
        continue
      if record.get("step", 0) <= step:
        kept.append(line + "\n")
    with errors.writing("the metrics log", self.path):  # the file itself stays as it was
      textio.write_text_atomically(self.path, "".join(kept))
    self._time_before = max((json.loads(line).get("time", 0.0) for line in kept), default=0.0)

  def write(self, step: int, scalars: dict[str, float], prefix: str = "train") -> None:
    """Logs `scalars` under `prefix/` at `step`."""
    if not self.enabled:
      return
    named = {f"{prefix}/{k}": float(v) for k, v in scalars.items()}
    with errors.writing("the TensorBoard events", self.workdir):
      self.events.add_scalars(step, named)
    elapsed = self._time_before + time.time() - self._t0
    # A line cut short here by a full disk is dropped when the run resumes (`_truncate_after`).
    with errors.writing("the metrics log", self.path), open(self.path, "a") as f:
      f.write(json.dumps({"step": step, "time": round(elapsed, 3), **named}) + "\n")
    if self.tracker:
      self.tracker.log(step, named)

  def progress(self, step: int, scalars: dict[str, float]) -> None:
    """One console line: step, share done, key metrics, speed and time left."""
    if not self.enabled:
      return
    elapsed = time.time() - self._t0
    rate = (step - self._step0) / elapsed if elapsed > 0 else 0.0
    eta = (self.total_steps - step) / rate if rate > 0 else float("nan")
    shown = " ".join(f"{k} {v:.4g}" for k, v in scalars.items())
    logging.info("step %d/%d (%.1f%%) %s | elapsed %s, ETA %s", step, self.total_steps,
                 100.0 * step / self.total_steps, shown, format_duration(elapsed),
                 format_duration(eta) if rate > 0 else "?")

  def close(self) -> None:
    """Closes the event file and ends the tracker's run (once)."""
    if not self.enabled or self._closed:
      return
    self._closed = True
    with errors.writing("the TensorBoard events", self.workdir):
      self.events.close()
    if self.tracker:
      self.tracker.finish()

  def __enter__(self) -> "MetricWriter":
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    """Closes the writer; leaving on an error, a failure to close is not raised over it."""
    if exc_type is None:
      self.close()
      return
    try:
      self.close()
    except Exception:  # the error on its way out says more
      pass


@jax.jit
def _summed(sums: dict, metrics: dict) -> dict:
  """`sums + metrics`, key by key, as one program: added apart, each metric is a program of
  its own, dispatched to every device of the step's output at every step."""
  return jax.tree.map(jnp.add, sums, metrics)


class LogWindow:
  """The training metrics of the steps since the last log line: token sums, summed scalars,
  the number of steps and the seconds they took.

  Its `state()` goes into every checkpoint, so the first line after a resume averages the
  same steps (and prints the same loss) as an uninterrupted run would.
  """

  def __init__(self, saved: dict | None = None):
    saved = saved or {}
    self.sums = {k: jnp.asarray(v, jnp.float32) for k, v in saved.get("sums", {}).items()}
    self.steps = int(saved.get("steps", 0))
    self.first_loss = saved.get("first_loss")  # the run's first logged loss
    self._start = time.time() - float(saved.get("seconds", 0.0))

  def add(self, metrics: dict) -> None:
    """Adds one step's metrics (device scalars; summed on the device, no host sync)."""
    self.sums = metrics if not self.sums else _summed(self.sums, metrics)
    self.steps += 1

  def state(self) -> dict:
    """JSON-able: exact float32 sums, steps, seconds so far, the first logged loss."""
    return {"sums": {k: float(v) for k, v in jax.device_get(self.sums).items()},
            "steps": self.steps, "seconds": time.time() - self._start,
            "first_loss": self.first_loss}

  def close(self, learning_rate: float) -> dict[str, float]:
    """The window's means and rates (see `losses.summarize`); starts a new window."""
    sums = jax.device_get(self.sums)
    seconds = max(time.time() - self._start, 1e-9)
    out = losses.summarize(sums)
    out["grad_norm"] = float(sums["grad_norm"]) / self.steps
    out["nonfinite_steps"] = float(sums["nonfinite"])
    out["learning_rate"] = learning_rate
    out["steps_per_sec"] = self.steps / seconds
    out["target_tokens_per_sec"] = float(sums["weight"]) / seconds
    if self.first_loss is None:
      self.first_loss = out["loss"]
    self.sums, self.steps, self._start = {}, 0, time.time()
    return out
