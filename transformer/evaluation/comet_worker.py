"""Scores translations with COMET models, in whichever Python has Unbabel's `unbabel-comet`.

Run by `transformer.evaluation.comet` as a script, not imported: it needs nothing of this
project, so the interpreter may be another environment's (unbabel-comet 2.2.7 pins
numpy<2, which JAX's releases no longer install beside). It serves requests, one JSON object a
line on stdin, until stdin closes:

  {"model": NAME_OR_PATH, "batch_size": N, "src": [...], "mt": [...], "ref": [...]}
  {"model": NAME_OR_PATH, "check": true}

and answers each with one JSON line on stdout: `{"scores": [...], "system_score": x,
"comet_version": ...}`, a score per sentence in input order and their mean; for a check,
`{"checkpoint": PATH, "comet_version": ...}` (the model found, nothing scored); or
`{"error": "no_model", "message": ...}` when the model cannot be found. NAME_OR_PATH is a
`model.ckpt` file, a folder holding `checkpoints/model.ckpt` (what `comet.download_model`
leaves), or a model name on the Hugging Face hub, which COMET downloads. A model is loaded once
and kept for the requests that follow (a training run scores each dev evaluation in the same
process). Whatever COMET and its libraries print goes to stderr. It exits with status 3 before
reading a request when `comet` does not import.
"""

import json
import os
import sys

NO_COMET = 3


def _checkpoint(model: str) -> str:
  """The `model.ckpt` that `model` names, downloading a hub name (COMET's own cache)."""
  import comet

  if os.path.isfile(model):
    return model
  if os.path.isdir(model):
    return os.path.join(model, "checkpoints", "model.ckpt")
  return comet.download_model(model)


def _answer(request: dict, models: dict, version: str) -> dict:
  """The answer to one request; `models` keeps each loaded model by its checkpoint's path."""
  import comet
  import torch

  try:  # a name COMET does not know is a KeyError, a failed download an OSError
    path = _checkpoint(request["model"])
  except (KeyError, OSError) as e:
    return {"error": "no_model",
            "message": f"neither a file, a folder nor a model COMET knows ({e})"}
  if not os.path.isfile(path):
    return {"error": "no_model", "message": f"no COMET model at {path}"}
  if request.get("check"):
    return {"checkpoint": path, "comet_version": version}
  if path not in models:
    models[path] = comet.load_from_checkpoint(path)
  samples = [{"src": s, "mt": m, "ref": r}
             for s, m, r in zip(request["src"], request["mt"], request["ref"])]
  output = models[path].predict(samples, batch_size=request["batch_size"],
                                gpus=1 if torch.cuda.is_available() else 0,
                                progress_bar=False)
  return {"scores": [float(x) for x in output.scores],
          "system_score": float(output.system_score), "comet_version": version}


def main() -> None:
  # Python put this file's folder first on the path, where the project's own `comet.py` would
  # stand for Unbabel's package: take it off.
  here = os.path.dirname(os.path.abspath(__file__))
  sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
  # The answers keep stdout to themselves: what the libraries print goes to stderr.
  answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
  os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
  sys.stdout = sys.stderr
  try:
    import comet  # noqa: F401
  except ImportError as e:
    print(f"comet does not import in {sys.executable}: {e}", file=sys.stderr)
    sys.exit(NO_COMET)
  from importlib import metadata

  version, models = metadata.version("unbabel-comet"), {}
  for line in sys.stdin:
    answers.write(json.dumps(_answer(json.loads(line), models, version)) + "\n")
    answers.flush()


if __name__ == "__main__":
  main()
