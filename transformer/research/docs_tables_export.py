"""The tables of docs/export.md: the project's decoder beside CTranslate2 at its best.

Drawn from the records `python -m transformer.export.speed` appends
(`export_speed.<corpus>.<search>.<system>`, and `...project_over_<system>` for the ratios).
"""

from __future__ import annotations

from transformer.research.doc_blocks import Table, fig, text
from transformer.research import doc_blocks

_SEARCHES = (("beam4", "beam 4"), ("greedy", "greedy"))


def knobs(name: str) -> doc_blocks.Cell:
  """The CTranslate2 setting record `name` was fastest at (its `extra["knobs"]`):
  `inter_threads=2, intra_threads=1, max_batch_size=16 examples`."""

  def render(held, sources):
    k = sources.use(doc_blocks.lookup(held, name)).extra["knobs"]
    return (f"inter_threads={k['inter_threads']}, intra_threads={k['intra_threads']}, "
            f"max_batch_size={k['max_batch_size']} {k['batch_type']}")

  return render


def _rows(corpus: str, search: str, label: str) -> list:
  name = f"export_speed.{corpus}.{search}"
  rows = [("project (JAX, XLA:CPU, `translate_texts`)", label,
           fig(f"{name}.project", 1, unit=False), "—", "—"),
          ("project, finished sentences kept in their batch", label,
           fig(f"{name}.project_unshrunk", 1, unit=False), "—", "—")]
  for compute in ("float32", "int8"):
    rows.append((text(f"CTranslate2 {compute} at its best: `translate_batch`, {{k}}",
                      k=knobs(f"{name}.ctranslate2_{compute}")), label,
                 fig(f"{name}.ctranslate2_{compute}", 1, unit=False),
                 fig(f"{name}.project_over_ctranslate2_{compute}"), "its own ranking"))
  for compute in ("float32", "int8"):
    rows.append((text(f"CTranslate2 {compute}, the project's ranking (`ctranslate2_search`), "
                      "{k}", k=knobs(f"{name}.ctranslate2_{compute}_project_rule")), label,
                 fig(f"{name}.ctranslate2_{compute}_project_rule", 1, unit=False),
                 fig(f"{name}.project_over_ctranslate2_{compute}_project_rule"),
                 "the project's"))
  return rows


def speed_table(corpus: str) -> Table:
  """Every engine's sentences/s on `corpus`, and the project's speed over each peer row."""
  return Table(("engine", "search", "sentences/s", "project over it", "ranking"),
               [row for search, label in _SEARCHES for row in _rows(corpus, search, label)])


EXPORT_TABLES = {"export_speed_synthetic": speed_table("synthetic"),
                 "export_speed_tatoeba": speed_table("tatoeba")}
