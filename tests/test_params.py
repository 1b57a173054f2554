"""Parameter counts against the paper's Table 3 column (within 5%, 37k shared vocabulary)."""

import pytest

from configs import base, big
from transformer import params

# (overrides of config.model, paper's count in millions, tolerance)
# The paper's column sits above the exact count by about 4,000 × d_model in every row (as if
# the vocabulary were ≈ 41k): 2–5% for most rows, but 6.5% for N=2, whose total is smallest.
# That row is held to 7%; no honest count of the §3 architecture reaches 36M there.
TABLE_3 = [
    ({}, 65, 0.05),
    ({"d_k": 16}, 58, 0.05),
    ({"d_k": 32}, 60, 0.05),
    ({"num_layers": 2}, 36, 0.07),
    ({"num_layers": 4}, 50, 0.05),
    ({"num_layers": 8}, 80, 0.05),
    ({"d_model": 256, "d_k": 32, "d_v": 32}, 28, 0.05),
    ({"d_model": 1024, "d_k": 128, "d_v": 128}, 168, 0.05),
    ({"d_ff": 1024}, 53, 0.05),
    ({"d_ff": 4096}, 90, 0.05),
]


@pytest.mark.parametrize("overrides,millions,tolerance", TABLE_3,
                         ids=[str(o) for o, _, _ in TABLE_3])
def test_table3_rows_match_paper(overrides, millions, tolerance):
  config = base.get_config()
  config.model.update(overrides)
  total = params.report(config)[-1][1]
  assert abs(total / 1e6 - millions) / millions < tolerance, total


def test_big_within_5_percent():
  total = params.report(big.get_config())[-1][1]
  assert abs(total / 1e6 - 213) / 213 < 0.05, total


def test_report_rows_add_up():
  rows = dict(params.report(base.get_config()))
  stacks = rows["encoder (total)"] + rows["decoder (total)"]
  assert rows["total"] == rows["shared_embedding (source, target, softmax)"] + stacks
  # The embedding is counted once although it serves source, target and softmax (§3.4).
  assert rows["shared_embedding (source, target, softmax)"] == 37000 * 512
