"""Parameter counts against the paper's Table 3 column (within 5%, 37k shared vocabulary),
for every variant of configs/table3.py that the paper gives a count for."""

import pytest

from configs import base, table3
from transformer.run import config_checks
from transformer.research import params

# The paper's column sits above the exact count by about 4,000 × d_model in every row (as if
# the vocabulary were ≈ 41k): 2–5% for most rows, but 6.5% for N=2 (C1), whose total is
# smallest. That row is held to 7%; no honest count of the §3 architecture reaches 36M there.
_TOLERANCE = {"C1": 0.07}


@pytest.mark.parametrize("name", table3.NAMES)
def test_every_variant_builds_and_counts_like_the_paper(name):
  config = table3.get_config(name)
  config_checks.validate(config)
  assert config.variant == name and config.paper.row == table3.NAMES.index(name) + 1
  total = params.report(config)[-1][1]
  millions = config.paper.params_m
  if millions is not None:
    assert abs(total / 1e6 - millions) / millions < _TOLERANCE.get(name, 0.05), total


def test_table3_names_follow_the_paper():
  assert table3.NAMES == ("base", "A1", "A2", "A3", "A4", "B1", "B2", "C1", "C2", "C3", "C4",
                          "C5", "C6", "C7", "D1", "D2", "D3", "D4", "E", "big")
  counted = [v.name for v in table3.VARIANTS if v.params_m is not None]
  assert counted == ["base", "B1", "B2", "C1", "C2", "C3", "C4", "C5", "C6", "C7", "big"]


def test_report_rows_add_up():
  rows = dict(params.report(base.get_config()))
  stacks = rows["encoder (total)"] + rows["decoder (total)"]
  assert rows["total"] == rows["shared_embedding (source, target, softmax)"] + stacks
  # The embedding is counted once although it serves source, target and softmax (§3.4).
  assert rows["shared_embedding (source, target, softmax)"] == 37000 * 512
