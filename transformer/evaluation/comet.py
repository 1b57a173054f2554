"""COMET (Rei et al. 2020), the neural metric MT papers report beside BLEU and chrF, scored by
Unbabel's own library in a Python of the user's choosing.

COMET is not a dependency of the project, and cannot be one today: unbabel-comet (2.2.7, its
latest release) pins numpy<2 and protobuf<5, and the JAX this project runs on needs numpy>=2.
So `Comet` runs `comet_worker.py` with `python` (default: this interpreter, which works once
COMET installs beside JAX), sending the sources, hypotheses and references as JSON and reading
a score per sentence back. The process is started at the first request and kept for the
others (one per Python, each model loaded once), so a training run's dev evaluations pay
COMET's start once. A separate environment for it:

  python -m venv ~/comet-env && ~/comet-env/bin/pip install unbabel-comet 'setuptools<81'
  python evaluate.py --workdir=runs/base --comet_model=Unbabel/wmt22-comet-da \\
      --comet_python=~/comet-env/bin/python

The model is the user's to name: a hub name (COMET downloads it into its own cache), a local
folder or a `model.ckpt`. The system score is the mean of the sentences' scores, COMET's
own; the sentence scores are kept in the evaluation's JSON (`segments`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
from typing import Sequence

from transformer.errors import ConfigError
from transformer.evaluation import comet_worker

WORKER = pathlib.Path(comet_worker.__file__)
LABEL = "COMET"
_STDERR_LINES = 20  # of a failed worker's output, in the error
_CLOSE_WAIT_S = 10


@dataclasses.dataclass(frozen=True)
class Comet:
  """A COMET model and the Python that runs it.

  Attributes:
    model: a hub name, a folder holding `checkpoints/model.ckpt`, or a `model.ckpt`.
    python: the interpreter that has unbabel-comet (default: this one).
    batch_size: sentences per forward pass (COMET's `predict`).
  """
  model: str
  python: str = sys.executable
  batch_size: int = 16

  def score(self, sources: Sequence[str], hypotheses: Sequence[str],
            references: Sequence[str]) -> dict:
    """`{'score', 'signature', 'label', 'digits', 'segments'}`: the system score (the
    sentences' mean), what produced it, and each sentence's score in input order.

    Raises:
      ConfigError: the lists differ in length, `python` does not run, or COMET does not
        import there (with how to install it).
      RuntimeError: COMET failed (its last lines of output in the message).
    """
    if not len(sources) == len(hypotheses) == len(references):
      raise ConfigError(f"COMET needs aligned lists: {len(sources)} sources, "
                        f"{len(hypotheses)} hypotheses, {len(references)} references")
    answer = self._ask({"model": self.model, "batch_size": self.batch_size,
                        "src": list(sources), "mt": list(hypotheses),
                        "ref": list(references)})
    return {"score": answer["system_score"], "label": f"{LABEL} ({self.model})",
            "signature": f"comet:{answer['comet_version']}|model:{self.model}|src+mt+ref",
            "digits": 4, "segments": answer["scores"]}

  def score_pairs(self, pairs: Sequence[tuple[str, str]], hypotheses: Sequence[str]) -> dict:
    """`score` of `hypotheses` for `(source, reference)` pairs, as a split is loaded."""
    return self.score([s for s, _ in pairs], hypotheses, [r for _, r in pairs])

  def check(self) -> str:
    """The `model.ckpt` the model names (a hub name is downloaded now), found by COMET in
    `python`, without scoring anything: what a run checks before it trains.

    Raises:
      ConfigError: as `score`, or the model is not there.
    """
    return self._ask({"model": self.model, "check": True})["checkpoint"]

  def _ask(self, request: dict) -> dict:
    answer = _worker(os.path.expanduser(self.python)).ask(request)
    if answer.get("error") == "no_model":
      raise ConfigError(f"COMET model {self.model!r}: {answer['message']} (a hub name such as "
                        "Unbabel/wmt22-comet-da, a folder holding checkpoints/model.ckpt, or "
                        "a model.ckpt)")
    return answer


class _Worker:
  """One `comet_worker.py` process of `python`, answering one request after another."""

  def __init__(self, python: str):
    self.python, self.lock = python, threading.Lock()  # one request at a time
    self.stderr = tempfile.TemporaryFile()  # read back only when the process fails
    try:
      self.process = subprocess.Popen([python, str(WORKER)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                      encoding="utf-8")
    except OSError as e:
      self.stderr.close()
      raise ConfigError(f"--comet_python={python} does not run ({e.strerror}): give the "
                        "python of an environment with unbabel-comet") from None

  def ask(self, request: dict) -> dict:
    with self.lock:
      try:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
      except BrokenPipeError:
        line = ""
    if line:
      return json.loads(line)
    raise self._failure(self.process.wait(), request["model"])

  def _failure(self, status: int, model: str) -> Exception:
    if status == comet_worker.NO_COMET:
      return ConfigError(
          f"COMET is not installed for {self.python}: install it there (pip install "
          "unbabel-comet 'setuptools<81'), or in an environment of its own (python -m venv "
          "~/comet-env && ~/comet-env/bin/pip install unbabel-comet 'setuptools<81') and pass "
          "--comet_python=~/comet-env/bin/python")
    self.stderr.seek(0)
    lines = self.stderr.read().decode("utf-8", "replace").strip().splitlines()
    tail = "\n".join(lines[-_STDERR_LINES:])
    return RuntimeError(f"COMET ({model}, run by {self.python}) failed with exit status "
                        f"{status}:\n{tail}")

  def close(self) -> None:
    if self.process.poll() is None:
      with contextlib.suppress(BrokenPipeError):
        self.process.stdin.close()  # the worker's end of input: it exits
      try:
        self.process.wait(timeout=_CLOSE_WAIT_S)
      except subprocess.TimeoutExpired:
        self.process.kill()
    self.stderr.close()


# One worker per Python, started at its first request and kept: COMET's import takes seconds,
# a model's load more, and a training run asks at every dev evaluation.
_WORKERS: dict[str, _Worker] = {}
_LOCK = threading.Lock()


def _worker(python: str) -> _Worker:
  with _LOCK:
    worker = _WORKERS.get(python)
    if worker is None or worker.process.poll() is not None:  # none yet, or it failed
      if worker is not None:
        worker.close()
      worker = _WORKERS[python] = _Worker(python)
    return worker


@atexit.register
def _close_workers() -> None:
  for worker in _WORKERS.values():
    worker.close()
