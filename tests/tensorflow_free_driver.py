"""A tiny run of training, evaluation and translation with `tensorflow` unimportable.

  python tests/tensorflow_free_driver.py WORKDIR DATA_CACHE COMPILATION_CACHE

Trains `support.synthetic_tiny` (the built-in synthetic pair: no real text needed) for 4 steps
(dev loss at the end), then translates two lines of its source language with
`evaluate_lib.translate_file` (greedy), keeping compiled programs in
COMPILATION_CACHE (`config.compilation_cache_dir`). Prints one JSON line: the persistent
cache's hits and misses over the run and whether any TensorFlow module got loaded. Run twice
by tests/run/test_compilation.py, the second time with the caches the first one filled.
"""

from __future__ import annotations

import json
import pathlib
import sys

from tests import support  # imports neither JAX nor TensorFlow

TENSORFLOW = ("tensorflow", "tensorflow_datasets")


def main(workdir: str, data_cache: str, compilation_cache: str) -> None:
  from transformer.data import synthetic
  from transformer.run import compilation
  from transformer.evaluation import evaluate_lib
  from transformer.training import train_lib

  config = support.synthetic_tiny(steps=4)
  config.log_every_steps = 2
  config.num_eval_batches = 1
  config.data.bucket_boundaries = (24,)  # one training shape
  config.data.cache_dir = data_cache
  config.compilation_cache_dir = compilation_cache
  config.decode.beam_size = 1
  source = pathlib.Path(workdir) / "input.txt"
  with compilation.CompileMonitor() as monitor:
    metrics = train_lib.train_and_evaluate(config, workdir)
    lines = [src for src, _ in synthetic.generate_pairs(2, seed=1)]
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    translations = evaluate_lib.translate_file(config, workdir, str(source), None, 1)
  loaded = sorted(m for m in sys.modules if m.partition(".")[0] in TENSORFLOW)
  print(json.dumps(dict(cache_hits=monitor.cache_hits, cache_misses=monitor.cache_misses,
                        compile_seconds=monitor.seconds(), loss=metrics["loss"],
                        translations=len(translations), tensorflow_modules=loaded)))


if __name__ == "__main__":
  # Before the library is imported: `import tensorflow` (or tensorflow_datasets) now raises
  # ModuleNotFoundError, as in an install without the `tfds` extra.
  support.make_unimportable(*TENSORFLOW)
  main(*sys.argv[1:])
