"""configs/tatoeba_fast.py, the time-to-BLEU record: it is tatoeba_small with exactly the
changes it lists (so its docstring and comments are the whole difference), and it validates."""

import pathlib

from configs import tatoeba_fast, tatoeba_small
from transformer.run import config_checks


def _flat(node, prefix=""):
  """A config's leaves as {'model.norm': 'post', ...}."""
  flat = {}
  for key, value in node.items():
    if isinstance(value, dict):
      flat.update(_flat(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def test_the_recipe_is_tatoeba_small_with_exactly_its_listed_changes(monkeypatch, tmp_path):
  folder = tmp_path / tatoeba_small.TATOEBA_FOLDER
  folder.mkdir()
  for name in tatoeba_small.TATOEBA_FILES:
    (folder / name).write_text("Hello.\n")
  monkeypatch.setenv(tatoeba_small.SHARED_DATA_ENV, str(tmp_path))
  small = _flat(tatoeba_small.get_config().to_dict())
  fast = _flat(tatoeba_fast.get_config().to_dict())
  assert fast.keys() == small.keys()  # nothing added: every change is a key tatoeba_small has
  changed = {k for k in fast if fast[k] != small[k]}
  assert changed == set(tatoeba_fast.CHANGES)
  assert {k: fast[k] for k in changed} == tatoeba_fast.CHANGES
  assert fast["num_train_steps"] == tatoeba_fast.STEPS
  config_checks.validate(tatoeba_fast.get_config())


def test_every_change_names_the_paper_section_it_departs_from():
  """Each entry of CHANGES follows a comment naming a section (§) of the paper."""
  source = pathlib.Path(tatoeba_fast.__file__).read_text()
  block = source[source.index("CHANGES = {"):source.index("\n}\n")].splitlines()[1:]
  comment = False
  for line in map(str.strip, block):
    if line.startswith("#"):
      comment = comment or "§" in line
      continue
    key = line.split(":")[0].strip('"')
    if key in ("num_train_steps", "eval_every_steps", "checkpoint_every_steps"):
      comment = False  # how long and how often, not a departure from the paper
      continue
    assert comment, f"{key} in configs/tatoeba_fast.py has no comment naming a § of the paper"
    comment = False
