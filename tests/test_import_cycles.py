"""No two modules of the `stratify` package import each other, directly or in a ring.

The graph is read statically from the source (nothing is imported): every module of
`stratify`, `stratify.baselines` (the folder `baselines/`) and `stratify.cli` (`cli/`), as
setup.cfg installs them. An edge A -> B is an ``import B`` or ``from B import ...`` in A
(``from P import m`` with ``m`` a module of package ``P`` is an edge to ``P.m`` as well as
to ``P``), made at module level:

- statements at module level count, including inside module-level ``if``/``try``/
  ``with`` blocks and class bodies, since they run on import;
- so do imports under ``if TYPE_CHECKING:``: they never run, but they say that A's
  interface depends on B. A ring of them is the design problem this test is for (two
  modules that each need the other), merely hidden from the interpreter, as in the two
  cycles listed below;
- imports inside functions and methods do not: they run only when called, after both
  modules are loaded, and are the usual way to defer a heavy or optional dependency
  (tenseal, torchvision). (Today counting them too finds no further cycle.)

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


def module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of a module outside its functions (see the docstring)."""
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):  # TYPE_CHECKING blocks included
            pending += node.body + node.orelse
        elif isinstance(node, ast.Try):
            pending += node.body + node.orelse + node.finalbody
            for handler in node.handlers:
                pending += handler.body
        elif isinstance(node, ast.With):
            pending += node.body
        elif isinstance(node, (ast.For, ast.While)):
            pending += node.body + node.orelse
        elif isinstance(node, ast.ClassDef):  # a class body runs on import, its methods do not
            pending += node.body


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
    """Module -> the modules it imports when it is imported (edges within the package)."""
    files = module_files(root)
    known = set(files)
    graph = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: set[str] = set()
        for node in module_level_imports(tree):
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


def test_the_walk_finds_a_cycle_and_ignores_imports_inside_functions(tmp_path):
    (tmp_path / "setup.cfg").write_text(
        "[options]\npackages =\n    pkg\n    pkg.extra\npackage_dir =\n    pkg.extra = extra\n"
    )
    (tmp_path / "pkg").mkdir()
    (tmp_path / "extra").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import thing\n")
    (tmp_path / "pkg" / "b.py").write_text(
        "try:\n    from pkg import c\nexcept ImportError:\n    c = None\n"
        "def later():\n    from pkg import a\n"
        "class Later:\n    def method(self):\n        import pkg.e\n"
    )
    (tmp_path / "pkg" / "c.py").write_text("from . import a\n")
    (tmp_path / "pkg" / "e.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.f import F\n"
    )
    (tmp_path / "pkg" / "f.py").write_text("from pkg.e import E\n")
    (tmp_path / "extra" / "__init__.py").write_text("")
    (tmp_path / "extra" / "d.py").write_text("import pkg.a\nfrom ..b import x\n")
    graph = import_graph(tmp_path)
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg", "pkg.c"}  # not the function's or the method's
    assert graph["pkg.c"] == {"pkg", "pkg.a"}
    assert graph["pkg.e"] == {"pkg.f"}  # a TYPE_CHECKING import is a dependency
    assert graph["pkg.extra.d"] == {"pkg.a", "pkg.b"}  # extra/ installs as pkg.extra
    found = sorted(cycles(graph), key=len)
    assert found == [{"pkg.e", "pkg.f"}, {"pkg.a", "pkg.b", "pkg.c"}]
