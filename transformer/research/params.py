"""Parameter report: `python -m transformer.research.params --config=configs/base.py`.

Prints the parameters of each module and the total, from shapes alone (nothing is
allocated), so the big model and every Table 3 row report in a second. With the paper's
37,000-token vocabulary the totals come within 5% of Table 3's column (tests/research/test_params.py).
"""

from __future__ import annotations

import jax
from absl import flags
from ml_collections import config_flags

from transformer.model import transformer as model_lib
from transformer import cli


def param_shapes(config):
  """The parameter tree of `config`'s model as `jax.ShapeDtypeStruct`s."""
  model = model_lib.build_model(config)
  return jax.eval_shape(lambda: model_lib.init_params(model, jax.random.key(0)))


def report(config) -> list[tuple[str, int]]:
  """Rows `(module path, parameters)`: the embedding, each layer of each stack, the total."""
  shapes = param_shapes(config)
  rows = [("shared_embedding (source, target, softmax)",
           model_lib.count_params(shapes["shared_embedding"]))]
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
  rows = report(config)
  for name, n in rows:
    print(f"{name:<46}{n:>14,}")
  print(f"{'total (millions)':<46}{rows[-1][1] / 1e6:>14.1f}")


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
