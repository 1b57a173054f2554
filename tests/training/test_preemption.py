"""SIGTERM and SIGINT: stop after the step in flight with a checkpoint, resume exactly.

`train.py` runs as a subprocess on a tiny model of the built-in synthetic pair
(tests/tiny_config.py: 24 steps, a checkpoint every 4, every step logged). One workdir is
interrupted four times, SIGTERM and SIGINT each at a step and during a save; every stop must exit
with its status and one line naming the checkpoint, and the run that finally completes must
end bit-identical to an uninterrupted one. A second trainer on the workdir while one runs is
refused.
"""

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from tests import support, tiny_config
from transformer.run import checkpoint
from transformer.training import preemption
from transformer.training import train_lib
from transformer.errors import ConfigError

REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT_S = 120
EXIT_STATUS = {signal.SIGTERM: 0, signal.SIGINT: 130}  # what docs/failures.md promises

# (signal, log pattern after which it is sent): at a step, or while a save is under way.
INTERRUPTIONS = [
    (signal.SIGTERM, r"step 2/24"),
    (signal.SIGINT, r"saving checkpoint 8"),
    (signal.SIGTERM, r"saving checkpoint 12"),
    (signal.SIGINT, r"step 18/24"),
]


def _start(workdir: pathlib.Path, cache: pathlib.Path) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, "train.py", "--config=tests/tiny_config.py", f"--workdir={workdir}",
       f"--config.data.cache_dir={cache}"],
      cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
      env=dict(os.environ, PYTHONUNBUFFERED="1"))


def _interrupt(process: subprocess.Popen, pattern: str, signum: int, while_running=None):
  """Sends `signum` once a stderr line matches `pattern` (calling `while_running` first);
  returns the exit status and the stderr lines."""
  lines = []
  for line in process.stderr:
    lines.append(line)
    if re.search(pattern, line):
      if while_running:
        while_running()
      process.send_signal(signum)
      break
  try:
    _, rest = process.communicate(timeout=TIMEOUT_S)
  except subprocess.TimeoutExpired:
    process.kill()
    pytest.fail(f"no exit {TIMEOUT_S} s after {signal.Signals(signum).name}")
  return process.returncode, lines + rest.splitlines(keepends=True)


def test_interrupted_four_times_ends_like_an_uninterrupted_run(tmp_path, synthetic_data_cache):
  cache = synthetic_data_cache  # one vocabulary and token cache for every run
  config = tiny_config.get_config()
  config.data.cache_dir = str(cache)
  straight = config.copy_and_resolve_references()
  straight.checkpoint_every_steps = 24  # saves change no number; the reference needs the last
  train_lib.train_and_evaluate(straight, str(tmp_path / "straight"))

  workdir = tmp_path / "interrupted"
  second_trainer = []

  def start_a_second_trainer():
    before = (workdir / "config.json").read_bytes()
    with pytest.raises(ConfigError, match=r"in use by another trainer \(PID \d+ on "):
      train_lib.train_and_evaluate(config, str(workdir))
    assert (workdir / "config.json").read_bytes() == before
    second_trainer.append("refused")

  saved = []
  for i, (signum, pattern) in enumerate(INTERRUPTIONS):
    status, lines = _interrupt(_start(workdir, cache), pattern, signum,
                               start_a_second_trainer if i == 0 else None)
    stopped = [l for l in lines if l.startswith("stopped by")]
    assert status == EXIT_STATUS[signum], "".join(lines[-30:])
    assert len(stopped) == 1, "".join(lines[-30:])
    step = int(re.search(r"checkpoint (\d+) is saved", stopped[0]).group(1))
    assert signal.Signals(signum).name in stopped[0]
    assert "Traceback" not in "".join(lines)
    assert checkpoint.Checkpointer(str(workdir), read_only=True).steps()[-1] == step
    assert not list((workdir / "checkpoints").glob("*tmp*"))
    assert not (workdir / "train.lock").exists()
    saved.append(step)
  assert second_trainer == ["refused"]
  assert saved == sorted(saved) and saved[-1] < 24, saved

  train_lib.train_and_evaluate(config, str(workdir))
  params = [checkpoint.Checkpointer(str(w), read_only=True).restore_params(24)
            for w in (tmp_path / "straight", workdir)]
  jax.tree.map(np.testing.assert_array_equal, *params)
  assert support.logged(workdir) == support.logged(tmp_path / "straight")


def test_a_second_signal_while_stopping_is_noted_and_ignored(caplog):
  """The second Ctrl-C of an impatient user, sent while the stop's checkpoint is saved,
  neither raises KeyboardInterrupt nor changes the stop; the handlers are put back after."""
  before = signal.getsignal(signal.SIGINT)
  with preemption.StopRequests() as stops:
    # In the main thread the context takes SIGINT over; elsewhere this test's own
    # signal would end the test process.
    assert signal.getsignal(signal.SIGINT) == stops._handle
    for expected in ("SIGINT received: stopping", "SIGINT received again"):
      os.kill(os.getpid(), signal.SIGINT)
      deadline = time.monotonic() + 10
      while expected not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.01)  # Python runs the handler between bytecodes of the main thread
      assert expected in caplog.text
      assert stops.stop_after(1) and stops.signum == signal.SIGINT
  assert stops.exit_code == EXIT_STATUS[signal.SIGINT]
  assert signal.getsignal(signal.SIGINT) == before
