"""Scores translations with a COMET model, in whichever Python has Unbabel's `unbabel-comet`.

Run by `transformer.evaluation.comet` as a script, not imported: it needs nothing of this
project, so the interpreter may be another environment's (unbabel-comet 2.2.7 pins
numpy<2, which JAX's releases no longer install beside). It reads one JSON object on stdin,

  {"model": NAME_OR_PATH, "batch_size": N, "src": [...], "mt": [...], "ref": [...]}

and prints one JSON line on stdout: `{"scores": [...], "system_score": x, "model": ...,
"comet_version": ...}`, a score per sentence in input order and their mean. NAME_OR_PATH is a
`model.ckpt` file, a folder holding `checkpoints/model.ckpt` (what `comet.download_model`
leaves), or a model name on the Hugging Face hub, which COMET downloads. It exits with
status 3, printing nothing on stdout, when `comet` does not import.

`{"model": NAME_OR_PATH, "check": true}` only finds the model (downloading a hub name) and
prints `{"checkpoint": PATH, "comet_version": ...}`. Either request exits with status 4 when
the model cannot be found.
"""

import json
import os
import sys

NO_COMET = 3
NO_MODEL = 4


def _checkpoint(model: str) -> str:
  """The `model.ckpt` that `model` names, downloading a hub name (COMET's own cache)."""
  import comet

  if os.path.isfile(model):
    return model
  if os.path.isdir(model):
    return os.path.join(model, "checkpoints", "model.ckpt")
  return comet.download_model(model)


def main() -> None:
  # Python put this file's folder first on the path, where the project's own `comet.py` would
  # stand for Unbabel's package: take it off.
  here = os.path.dirname(os.path.abspath(__file__))
  sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
  try:
    import comet
  except ImportError as e:
    print(f"comet does not import in {sys.executable}: {e}", file=sys.stderr)
    sys.exit(NO_COMET)
  from importlib import metadata

  import torch

  request = json.load(sys.stdin)
  try:  # a name COMET does not know is a KeyError, a failed download an OSError
    path = _checkpoint(request["model"])
  except (KeyError, OSError) as e:
    print(f"neither a file, a folder nor a model COMET knows ({e})", file=sys.stderr)
    sys.exit(NO_MODEL)
  if not os.path.isfile(path):
    print(f"no COMET model at {path}", file=sys.stderr)
    sys.exit(NO_MODEL)
  if request.get("check"):
    print(json.dumps({"checkpoint": path, "comet_version": metadata.version("unbabel-comet")}))
    return
  model = comet.load_from_checkpoint(path)
  samples = [{"src": s, "mt": m, "ref": r}
             for s, m, r in zip(request["src"], request["mt"], request["ref"])]
  output = model.predict(samples, batch_size=request["batch_size"],
                         gpus=1 if torch.cuda.is_available() else 0, progress_bar=False)
  print(json.dumps({"scores": [float(x) for x in output.scores],
                    "system_score": float(output.system_score), "model": request["model"],
                    "comet_version": metadata.version("unbabel-comet")}))


if __name__ == "__main__":
  main()
