"""No module imports from a layer above its own (docs/architecture.md, the layers table
under "Package map").

The layers are read from the page, so the table and the code cannot drift apart; the
imports are those of tests/test_import_cycles.py's graph, imports inside functions
included. No import may go up: there is no list of exceptions.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_import_cycles import import_graph

ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def layers(text: str) -> list[tuple[str, list[str]]]:
    """The ``| layer | modules |`` table of ``text``: each layer's name and its module
    patterns (a trailing ``.*`` covers a package and everything in it), bottom first."""
    lines = text.splitlines()
    start = lines.index("| layer | modules |")
    found = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        name, modules = (cell.strip() for cell in line.strip("|").split("|"))
        found.append((name, re.findall(r"`([\w.*]+)`", modules)))
    return found


def layer_of(module: str, table: list[tuple[str, list[str]]]) -> int | None:
    """The index of the layer whose most specific pattern covers ``module``."""
    best: tuple[int, int] | None = None
    for index, (_, patterns) in enumerate(table):
        for pattern in patterns:
            package = pattern.removesuffix(".*")
            covers = module == pattern or (
                pattern.endswith(".*") and (module == package or module.startswith(package + "."))
            )
            if covers and (best is None or len(pattern) > best[1]):
                best = (index, len(pattern))
    return None if best is None else best[0]


def upward_imports(
    graph: dict[str, set[str]], table: list[tuple[str, list[str]]]
) -> list[tuple[str, str]]:
    """Every edge of ``graph`` from a module to one in a higher layer."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            low, high = layer_of(module, table), layer_of(target, table)
            if low is not None and high is not None and high > low:
                found.append((module, target))
    return found


def test_every_module_has_a_layer():
    table = layers(ARCHITECTURE.read_text(encoding="utf-8"))
    assert [name for name, _ in table][0] == "foundations" and len(table) >= 5
    unplaced = [module for module in import_graph() if layer_of(module, table) is None]
    assert not unplaced, f"modules in no layer of docs/architecture.md: {unplaced}"


def test_no_module_imports_from_a_layer_above_its_own():
    table = layers(ARCHITECTURE.read_text(encoding="utf-8"))
    found = upward_imports(import_graph(), table)
    assert not found, "imports from a higher layer: " + "; ".join(
        f"{module} -> {target}" for module, target in found
    )


def test_the_layer_walk_flags_an_import_that_goes_up():
    table = [("low", ["pkg.low", "pkg.data.*"]), ("high", ["pkg.high"])]
    graph = {"pkg.low": {"pkg.high"}, "pkg.data.loader": {"pkg.low"}, "pkg.high": {"pkg.low"}}
    assert upward_imports(graph, table) == [("pkg.low", "pkg.high")]
    assert layer_of("pkg.data", table) == 0 and layer_of("pkg.other", table) is None
