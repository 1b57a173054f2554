"""Parameter report: `python -m transformer.research.params --config=configs/base.py`.

Prints the parameters of each module and the total, from shapes alone (nothing is
allocated), so the big model, every Table 3 row and every row of configs/modern.py report in
a second. With the paper's 37,000-token vocabulary the totals come within 5% of Table 3's
column; the modern rows differ from base by what their formulas say
(tests/research/test_params.py).
"""

from __future__ import annotations

import jax
from absl import flags
from ml_collections import config_flags

from transformer import cli
from transformer.model import config as model_config
from transformer.model import transformer as model_lib

# What each embedding matrix serves, by its name in the parameter tree (`tie_embeddings`).
_EMBEDDINGS = {"shared_embedding": "shared_embedding (source, target, softmax)",
               "source_embedding": "source_embedding",
               "target_embedding": "target_embedding",
               "output_projection": "output_projection (softmax)"}


def param_shapes(config):
  """The parameter tree of `config`'s model as `jax.ShapeDtypeStruct`s."""
  model = model_lib.build_model(config)
  return jax.eval_shape(lambda: model_lib.init_params(model, jax.random.key(0)))


def report(config) -> list[tuple[str, int]]:
  """Rows `(module path, parameters)`: the embeddings, each layer of each stack (and a
  stack's shared relative attention bias), the total."""
  shapes = param_shapes(config)
  tied_target = config.model.tie_embeddings == "two_way"
  rows = [(_EMBEDDINGS[name] + (" (target, softmax)" if tied_target and
                                name == "target_embedding" else ""),
           model_lib.count_params(shapes[name])) for name in _EMBEDDINGS if name in shapes]
  for stack in ("encoder", "decoder"):
    for name, sub in shapes[stack].items():
      rows.append((f"{stack}/{name}", model_lib.count_params(sub)))
    rows.append((f"{stack} (total)", model_lib.count_params(shapes[stack])))
  rows.append(("total", model_lib.count_params(shapes)))
  return rows


def _define_flags() -> None:
  """Flags, defined only when run as a program: report.py and the benchmarks import this
  module into processes that define --config themselves."""
  config_flags.DEFINE_config_file("config", None, "Experiment config (configs/*.py).")
  flags.mark_flag_as_required("config")


def main(argv):
  del argv
  config = flags.FLAGS.config
  m = config.model
  print(f"N={m.num_layers} d_model={m.d_model} d_ff={m.d_ff} h={m.num_heads} d_k={m.d_k} "
        f"d_v={m.d_v} vocab={m.vocab_size} positional={m.positional}")
  paper = model_config.defaults()
  shown = ("num_layers", "d_model", "d_ff", "num_heads", "d_k", "d_v", "vocab_size",
           "positional", "dropout_rate", "max_len")
  departures = [f"{k}={m[k]}" for k in paper if k not in shown and m[k] != paper[k]]
  if departures:
    print("departures from the paper: " + " ".join(departures))
  rows = report(config)
  for name, n in rows:
    print(f"{name:<46}{n:>14,}")
  print(f"{'total (millions)':<46}{rows[-1][1] / 1e6:>14.1f}")


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
