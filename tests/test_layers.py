"""The package's folders are layers: a module imports only from its own folder and the floors
below it, the module graph has no cycle, and no module is named like a standard-library one.

Floors, lowest first (transformer/__init__.py describes them):
  0  transformer/*.py (errors, tokens, cli)
  1  model/, data/            (neither imports the other)
  2  decoding/
  3  run/
  4  evaluation/, export/      (neither imports the other)
  5  training/
  6  research/
Imports inside functions count as much as those at the top of a module.
"""

import ast
import pathlib
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "transformer"
FLOORS = {"": 0, "model": 1, "data": 1, "decoding": 2, "run": 3, "evaluation": 4,
          "export": 4, "training": 5, "research": 6}


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _folder(module: str) -> str:
  """'transformer.model.attention' -> 'model'; 'transformer.errors' -> ''."""
  parts = module.split(".")
  return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in FLOORS) else ""


def _imports(module: str) -> set[str]:
  """The project modules `module` imports, anywhere in its text."""
  tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      # `from transformer.model import attention` imports the module transformer.model.attention;
      # `from transformer.model.config import ModelConfig`, the module transformer.model.config.
      names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES
               else node.module for alias in node.names]
    else:
      continue
    found.update(name for name in names if name in MODULES and name != module)
  return found


def test_every_folder_has_a_floor():
  folders = {_folder(m) for m in MODULES}
  assert folders == set(FLOORS)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_or_across_the_own_folder(module):
  here = _folder(module)
  for imported in _imports(module):
    there = _folder(imported)
    if there == here or imported == "transformer":
      continue
    assert FLOORS[there] < FLOORS[here], (
        f"{module} (floor {FLOORS[here]}, {here or 'top'}/) imports {imported} "
        f"(floor {FLOORS[there]}, {there or 'top'}/)")


def test_no_import_cycle():
  graph = {m: _imports(m) for m in MODULES}
  state: dict[str, str] = {}

  def visit(module, path):
    state[module] = "open"
    for imported in sorted(graph[module]):
      if state.get(imported) == "open":
        cycle = path[path.index(imported):] + [imported]
        pytest.fail("import cycle: " + " -> ".join(cycle))
      if imported not in state:
        visit(imported, path + [imported])
    state[module] = "done"

  for module in sorted(graph):
    if module not in state:
      visit(module, [module])


def test_no_module_is_named_like_the_standard_library():
  shadowing = sorted(m for m in MODULES if m.rsplit(".", 1)[-1] in sys.stdlib_module_names)
  assert not shadowing
