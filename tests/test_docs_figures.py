"""The README's and docs' figures against the records in results/: every generated table is
what the records give, every record says how it was measured, the README quotes no measured
figure outside its generated table, and every relative link between the pages resolves."""

import dataclasses
import datetime
import re

import pytest


from transformer.research import doc_blocks
from transformer.research import docs_tables
from transformer import records

REPO = records.REPO
PAGES = [*doc_blocks.pages(REPO), REPO / "CHANGELOG.md"]


def test_every_generated_table_is_what_the_records_give():
  stale = docs_tables.update(check=True, folder=records.RESULTS)
  assert not stale, ("stale generated tables (run `python -m transformer.research.docs_tables`): "
                     + ", ".join(stale))


def test_every_table_is_on_a_page_once():
  names = [b.name for page in doc_blocks.pages(REPO)
           for b in doc_blocks.blocks(page.read_text(encoding="utf-8"), str(page))]
  assert sorted(names) == sorted(docs_tables.TABLES)


@pytest.mark.parametrize("path", sorted(records.RESULTS.glob("*.jsonl")), ids=lambda p: p.name)
def test_every_record_says_how_when_where_it_was_measured(path):
  held = records.read(path)  # a line that does not parse fails here, naming it
  assert held, f"{path} holds no record"
  for r in held:
    assert r.command and r.commit and r.device and r.unit is not None, r
    assert r.name.split(".")[0] == path.stem, f"{r.name} in {path.name}"
    datetime.datetime.fromisoformat(r.date)


def _outside_blocks_and_code(page: str) -> str:
  """The text of `page` without its generated blocks and code."""
  page = re.sub(r"<!-- table: \S+ -->.*?<!-- end table -->", "", page, flags=re.S)
  page = re.sub(r"```.*?```", "", page, flags=re.S)
  return re.sub(r"`[^`]*`", "", page)


# The numbers a page may write outside its generated tables: the paper's figures and
# recipe, versions, counts of the model (computed from its shapes, not measured), targets.
_NUMBERS = {
    "README.md": {"3.11", "3.1", "3.3", "3.4", "3.5", "5.1", "5.3", "5.4", "6.1", "0.9",
                  "0.98", "0.6", "0.1", "1.05", "5.7", "9.8", "63.0", "214.2", "27.3", "28.4",
                  "4.92", "4.33", "33.6", "0.7", "1.0"},
    "docs/performance.md": {"0.5", "3.12"},
}


@pytest.mark.parametrize("page", sorted(_NUMBERS))
def test_a_page_quotes_measured_figures_only_in_its_generated_tables(page):
  text = _outside_blocks_and_code((REPO / page).read_text(encoding="utf-8"))
  # A decimal number; versions and section numbers (a.b.c) are not figures.
  numbers = {n for n in re.findall(r"(?<![\w.])\d+(?:\.\d+)+(?![\w.])", text)
             if n.count(".") == 1}
  assert not numbers - _NUMBERS[page], (
      f"{page} quotes figures outside its generated tables: put them in a record and a "
      f"table, or leave them out: {sorted(numbers - _NUMBERS[page])}")


def test_check_names_every_table_a_newer_record_makes_stale(tmp_path):
  assert docs_tables.main(["--check"]) == 0
  for path in records.RESULTS.glob("*.jsonl"):
    (tmp_path / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
  name = "time_to_bleu.tatoeba_small.cpu.steps1500.devbleu.run1.best_test_sacrebleu"
  newer = dataclasses.replace(records.load()[name], figure=99.0,
                              date="2999-01-01T00:00:00+00:00")
  records.append("time_to_bleu", [newer], tmp_path)
  assert docs_tables.update(check=True, folder=tmp_path) == [
      "README.md: results", "docs/training.md: dev_bleu_cost"]


def _anchor(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
  text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
  broken = []
  for target in re.findall(r"\]\(([^)\s]+)\)", text):
    if re.match(r"[a-z]+://|mailto:", target):
      continue
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    if not file.exists():
      broken.append(target)
    elif anchor and file.suffix == ".md":
      headings = re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), flags=re.M)
      if anchor not in {_anchor(h) for h in headings}:
        broken.append(target)
  assert not broken, f"{page.name}: links to nothing: {broken}"
