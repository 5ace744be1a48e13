"""No two modules of the `stratify` package import each other, directly or in a ring.

The graph is read statically from the source (nothing is imported): every module of
`stratify`, `stratify.baselines` (the folder `baselines/`) and `stratify.cli` (`cli/`), as
setup.cfg installs them. An edge A -> B is an ``import B`` or ``from B import ...`` in A
(``from P import m`` with ``m`` a module of package ``P`` is an edge to ``P.m`` as well as
to ``P``), wherever in A it is:

- at module level, including inside ``if``/``try``/``with`` blocks and class bodies, since
  it runs on import;
- under ``if TYPE_CHECKING:``: it never runs, but it says that A's interface depends on B;
- inside a function or a method: it runs only when called, which hides a ring from the
  interpreter but not from the design. Two modules that each need the other are one idea
  split in two, or a lower one reaching up (docs/architecture.md, "Package map"); a
  deferred import is kept for a heavy or optional third-party dependency (tenseal,
  torchvision), which this graph does not contain.

A package is not counted as imported by its own submodules: importing ``P.m`` runs
``P/__init__.py`` first, but only an explicit ``from P import x`` in ``P.m`` is an edge.
"""

from __future__ import annotations

import ast
import configparser
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def package_folders(root: Path = ROOT) -> dict[str, Path]:
    """Package name -> its folder, from setup.cfg's ``packages`` and ``package_dir``."""
    setup = configparser.ConfigParser()
    setup.read(root / "setup.cfg")
    packages = setup["options"]["packages"].split()
    mapped = {}
    for line in setup["options"].get("package_dir", "").strip().splitlines():
        name, _, folder = line.partition("=")
        mapped[name.strip()] = folder.strip()
    folders = {}
    for package in packages:
        # a package inside a mapped one lives in the mapped folder (none do today)
        base = next((p for p in sorted(mapped, key=len, reverse=True) if package.startswith(p)), "")
        if base:
            rest = package[len(base) :].lstrip(".").replace(".", "/")
            folders[package] = root / mapped[base] / rest
        else:
            folders[package] = root / package.replace(".", "/")
    return folders


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> source file, for every module of every installed package."""
    modules = {}
    for package, folder in package_folders(root).items():
        for path in sorted(folder.glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = path
    return modules


def imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, inside functions and methods too (see the
    docstring)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def targets(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]
) -> set[str]:
    """The modules of ``known`` that ``node`` (in ``module``) imports."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    if node.level:  # relative: from . import x, from ..y import z
        parts = module.split(".")
        anchor = parts if is_package else parts[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        source = ".".join(anchor + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    found = {source} if source in known else set()
    found |= {f"{source}.{alias.name}" for alias in node.names} & known
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules it imports, at module level or in a function (edges within
    the package)."""
    files = module_files(root)
    known = set(files)
    graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: set[str] = set()
        for node in imports(tree):
            edges |= targets(node, module, path.stem == "__init__", known)
        graph[module] = edges - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_of_stratify_is_part_of_an_import_cycle():
    graph = import_graph()
    # the walk sees the whole package, the installed folders included
    assert {"stratify.config", "stratify.baselines.fedavg", "stratify.cli.main"} <= set(graph)
    assert "stratify.options" in graph["stratify.config"]
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in found)


def test_the_walk_finds_a_cycle_made_by_imports_inside_functions_too(tmp_path):
    (tmp_path / "setup.cfg").write_text(
        "[options]\npackages =\n    pkg\n    pkg.extra\npackage_dir =\n    pkg.extra = extra\n"
    )
    (tmp_path / "pkg").mkdir()
    (tmp_path / "extra").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import thing\n")
    (tmp_path / "pkg" / "b.py").write_text(
        "try:\n    from pkg import c\nexcept ImportError:\n    c = None\n"
        "class Later:\n    def method(self):\n        import pkg.g\n"
    )
    (tmp_path / "pkg" / "c.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "e.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.f import F\n"
    )
    (tmp_path / "pkg" / "f.py").write_text("from pkg.e import E\n")
    # a ring closed only inside a function: invisible at import, still a ring
    (tmp_path / "pkg" / "g.py").write_text("def later():\n    from pkg import a\n")
    (tmp_path / "extra" / "__init__.py").write_text("")
    (tmp_path / "extra" / "d.py").write_text("import pkg.a\nfrom ..b import x\n")
    graph = import_graph(tmp_path)
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg", "pkg.c", "pkg.g"}  # the method's import counts
    assert graph["pkg.g"] == {"pkg", "pkg.a"}  # so does the function's
    assert graph["pkg.e"] == {"pkg.f"}  # a TYPE_CHECKING import is a dependency
    assert graph["pkg.extra.d"] == {"pkg.a", "pkg.b"}  # extra/ installs as pkg.extra
    found = sorted(cycles(graph), key=len)
    assert found == [{"pkg.e", "pkg.f"}, {"pkg.a", "pkg.b", "pkg.g"}]
