"""Parameter counts against the paper's Table 3 column (within 5%, 37k shared vocabulary),
for every variant of configs/table3.py that the paper gives a count for, and against a count
written out from the definitions for every row of configs/modern.py."""

import pytest

from configs import base, modern, table3
from transformer.run import config_checks
from transformer.research import params

# The paper's column sits above the exact count by about 4,000 × d_model in every row (as if
# the vocabulary were ≈ 41k): 2–5% for most rows, but 6.5% for N=2 (C1), whose total is
# smallest. That row is held to 7%; no honest count of the §3 architecture reaches 36M there.
_TOLERANCE = {"C1": 0.07}

# `params.report` traces the model's initialisation (a second or more of CPU). Several rows
# share one model (they differ only in training: label smoothing, optimizer, schedule, loss),
# which is traced once.
_REPORTS = {}


def _report(config) -> list[tuple[str, int]]:
  """`params.report(config)`, once per model: what `model_lib.build_model` reads (config.model
  and config.dtype)."""
  key = (config.model.to_json(), config.dtype)
  if key not in _REPORTS:
    _REPORTS[key] = params.report(config)
  return _REPORTS[key]


@pytest.mark.parametrize("name", table3.NAMES)
def test_every_variant_builds_and_counts_like_the_paper(name):
  config = table3.get_config(name)
  config_checks.validate(config)
  assert config.variant == name and config.paper.row == table3.NAMES.index(name) + 1
  total = _report(config)[-1][1]
  millions = config.paper.params_m
  if millions is not None:
    assert abs(total / 1e6 - millions) / millions < _TOLERANCE.get(name, 0.05), total


def test_table3_names_follow_the_paper():
  assert table3.NAMES == ("base", "A1", "A2", "A3", "A4", "B1", "B2", "C1", "C2", "C3", "C4",
                          "C5", "C6", "C7", "D1", "D2", "D3", "D4", "E", "big")
  counted = [v.name for v in table3.VARIANTS if v.params_m is not None]
  assert counted == ["base", "B1", "B2", "C1", "C2", "C3", "C4", "C5", "C6", "C7", "big"]


def test_report_rows_add_up():
  rows = dict(_report(base.get_config()))
  stacks = rows["encoder (total)"] + rows["decoder (total)"]
  assert rows["total"] == rows["shared_embedding (source, target, softmax)"] + stacks
  # The embedding is counted once although it serves source, target and softmax (§3.4).
  assert rows["shared_embedding (source, target, softmax)"] == 37000 * 512


def _count_from_definitions(m) -> int:
  """The parameters of `config.model` m, written out from each switch's definition."""
  d, heads, kv, n = m.d_model, m.num_heads, m.num_kv_heads or m.num_heads, m.num_layers
  gated = m.activation in ("reglu", "geglu", "swiglu")
  width = round(2 * m.d_ff / 3) if gated and m.ffn_match_params else m.d_ff
  embeddings = {"three_way": 1, "two_way": 2, "none": 3}[m.tie_embeddings] * m.vocab_size * d
  # Queries and outputs over H heads, keys and values over the key/value heads.
  attention = d * heads * m.d_k + d * kv * (m.d_k + m.d_v) + heads * m.d_v * d
  attention += {"rms": 2 * m.d_k, "l2": 1}.get(m.qk_norm, 0)  # two norms' scales, or g
  ffn = (2 if gated else 1) * d * width + width * d
  ffn += ((2 if gated else 1) * width + d) if m.biases and (m.glu_biases or not gated) else 0
  norms = 5 * n + (2 if m.norm == "pre" else 0)  # 2 per encoder layer, 3 per decoder layer
  norm = d * (2 if m.norm_type == "layernorm" and m.biases else 1)
  positions = {"learned": 2 * m.max_len * d, "t5": 2 * 32 * heads,
               "shaw": 2 * n * (2 * m.shaw_clip + 1) * (m.d_k + m.d_v)}.get(m.positional, 0)
  return embeddings + 3 * n * attention + 2 * n * ffn + norms * norm + positions


@pytest.mark.parametrize("name", modern.NAMES)
def test_every_modern_row_builds_and_counts_as_its_definition(name):
  config = modern.get_config(name)
  config_checks.validate(config)
  assert config.variant == name and config.paper.row == modern.NAMES.index(name) + 1
  assert _report(config)[-1][1] == _count_from_definitions(config.model)

