"""COMET (Rei et al. 2020), the neural metric MT papers report beside BLEU and chrF, scored by
Unbabel's own library in a Python of the user's choosing.

COMET is not a dependency of the project, and cannot be one today: unbabel-comet (2.2.7, its
latest release) pins numpy<2 and protobuf<5, and the JAX this project runs on needs numpy>=2.
So `Comet` runs `comet_worker.py` with `python` (default: this interpreter, which works once
COMET installs beside JAX), sending the sources, hypotheses and references as JSON and reading
a score per sentence back. A separate environment for it:

  python -m venv ~/comet-env && ~/comet-env/bin/pip install unbabel-comet 'setuptools<81'
  python evaluate.py --workdir=runs/base --comet_model=Unbabel/wmt22-comet-da \\
      --comet_python=~/comet-env/bin/python

The model is the user's to name: a hub name (COMET downloads it into its own cache), a local
folder or a `model.ckpt`. The system score is the mean of the sentences' scores, COMET's
own; the sentence scores are kept in the evaluation's JSON (`segments`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
from typing import Sequence

from transformer.errors import ConfigError
from transformer.evaluation import comet_worker

WORKER = pathlib.Path(comet_worker.__file__)
LABEL = "COMET"
_STDERR_LINES = 20  # of a failed worker's output, in the error


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
    request = {"model": self.model, "batch_size": self.batch_size, "src": list(sources),
               "mt": list(hypotheses), "ref": list(references)}
    answer = self._run(json.dumps(request))
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
    return self._run(json.dumps({"model": self.model, "check": True}))["checkpoint"]

  def _run(self, request: str) -> dict:
    python = os.path.expanduser(self.python)
    try:
      done = subprocess.run([python, str(WORKER)], input=request, capture_output=True,
                            text=True, check=False)
    except OSError as e:
      raise ConfigError(f"--comet_python={self.python} does not run ({e.strerror}): give "
                        "the python of an environment with unbabel-comet") from None
    if done.returncode == comet_worker.NO_COMET:
      raise ConfigError(
          f"COMET is not installed for {python}: install it there (pip install unbabel-comet "
          "'setuptools<81'), or in an environment of its own (python -m venv ~/comet-env && "
          "~/comet-env/bin/pip install unbabel-comet 'setuptools<81') and pass "
          "--comet_python=~/comet-env/bin/python")
    if done.returncode == comet_worker.NO_MODEL:
      raise ConfigError(f"COMET model {self.model!r}: {done.stderr.strip().splitlines()[-1]} "
                        "(a hub name such as Unbabel/wmt22-comet-da, a folder holding "
                        "checkpoints/model.ckpt, or a model.ckpt)")
    if done.returncode != 0:
      tail = "\n".join(done.stderr.strip().splitlines()[-_STDERR_LINES:])
      raise RuntimeError(f"COMET ({self.model}, run by {python}) failed with exit status "
                         f"{done.returncode}:\n{tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])
