"""Adding a method is one file, one registry line and one generator command
(docs/architecture.md, "Adding a method (worked example)"), checked for real.

The test copies the repository, writes the worked example's FedTrim (the code block of
its step 1, as the page gives it) to ``baselines/fedtrim.py``, adds its one line to
``ALGORITHMS`` in ``stratify/algorithms.py`` and runs the one generator command,
``python -m stratify.cli.docs_tables``. Nothing else in the copy changes. Then, in fresh
processes importing the copy: ``stratify methods`` lists it (untuned), ``stratify train``
runs it, the paired grid plans it beside its comparator, the copy's own tests of the
conformance suite, of the options' effects and of the learning rates pass for it, and
``stratify tables --check`` and ``docs_tables --check`` find every generated table
current.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_worked_example import step_1_code

ROOT = Path(__file__).resolve().parents[1]
REGISTRY_LINE = '    "fedtrim": "stratify.baselines.fedtrim:FedTrim",\n'


def tracked_files() -> list[str]:
    """The repository's files as a clone holds them (tracked, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [name for name in listed.stdout.splitlines() if (ROOT / name).is_file()]


def copy_repository(target: Path) -> None:
    """The files of a clone, laid out as the package installs them: ``baselines/`` and
    ``cli/`` are ``stratify.baselines`` and ``stratify.cli`` (setup.cfg's package_dir)."""
    for name in tracked_files():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target / name)
    (target / "stratify" / "baselines").symlink_to(target / "baselines")
    (target / "stratify" / "cli").symlink_to(target / "cli")


def add_fedtrim(copy: Path) -> None:
    """The worked example's steps 1 and 2: one file and one registry line."""
    (copy / "baselines" / "fedtrim.py").write_text(step_1_code(), encoding="utf-8")
    registry = copy / "stratify" / "algorithms.py"
    text = registry.read_text(encoding="utf-8")
    start = text.index("ALGORITHMS: dict[str, str] = {")
    end = text.index("}\n", start)
    registry.write_text(text[:end] + REGISTRY_LINE + text[end:], encoding="utf-8")


def run_in(copy: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """``python arguments`` in a fresh process that imports the copy's ``stratify``."""
    environment = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=copy,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )


def stratify_command(copy: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """``stratify arguments`` as the console script runs it, on the copy."""
    return run_in(
        copy, "-c", "import sys; from stratify.cli.main import main; main(sys.argv[1:])", *arguments
    )


@pytest.fixture(scope="module")
def copy_with_fedtrim(tmp_path_factory):
    copy = tmp_path_factory.mktemp("clone")
    copy_repository(copy)
    add_fedtrim(copy)
    imported = run_in(copy, "-c", "import stratify.baselines.fedtrim as m; print(m.__file__)")
    assert imported.returncode == 0, imported.stderr
    assert Path(imported.stdout.strip()).resolve() == (copy / "baselines" / "fedtrim.py")
    # step 3's one generator command
    generated = run_in(copy, "-m", "stratify.cli.docs_tables")
    assert generated.returncode == 0, generated.stderr
    return copy


@pytest.mark.slow
def test_a_method_added_for_real_appears_everywhere_with_no_other_edit(copy_with_fedtrim, tmp_path):
    copy = copy_with_fedtrim
    # the generated docs now hold it, and every table is current
    for check in (("-m", "stratify.cli.docs_tables", "--check"),):
        checked = run_in(copy, *check)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    tables = stratify_command(copy, "tables", "--check")
    assert tables.returncode == 0, tables.stdout + tables.stderr
    methods_md = (copy / "docs" / "methods.md").read_text(encoding="utf-8")
    (row,) = [line for line in methods_md.splitlines() if line.startswith("| `fedtrim` |")]
    assert "`--trim` 0.1" in row and "`--lr` untuned: the dataset's" in row

    # stratify methods
    listed = stratify_command(copy, "methods")
    assert listed.returncode == 0 and "fedtrim" in listed.stdout, listed.stderr

    # stratify train: FedAvg's traffic, 2 transfers per participant and round
    out = tmp_path / "run"
    trained = stratify_command(
        copy,
        "train",
        "--method", "fedtrim", "--trim", "0.25", "--partition", "iid", "--clients", "4",
        "--epochs", "2", "--no-secure", "--out", str(out),
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [record["transfers"] for record in records] == [8, 8]

    # a grid's plan: the paired grid puts it beside its matched comparator
    planned = run_in(
        copy,
        "-c",
        "import sys; from pathlib import Path\n"
        "from stratify.reproduce.grids import GRIDS, Settings, plan_cells\n"
        "settings = Settings(dataset='digits', seeds=(0,), methods=('fedtrim',))\n"
        "cells, notes = plan_cells(GRIDS['paired'], settings, Path(sys.argv[1]))\n"
        "print(sorted({cell.column.label for cell in cells}), notes)\n",
        str(tmp_path / "paired"),
    )
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.strip() == "['FedAvg (matched)', 'FedTrim'] []"

    # the copy's own tests: the conformance suite, the options' effects (its option's
    # probe), the learning rates (it is untuned: no rate grid needed) and the docs tables
    tested = run_in(
        copy,
        "-m",
        "pytest",
        "-v",
        "-p",
        "no:cacheprovider",
        "tests/test_testing.py::test_every_registered_method_conforms",
        "tests/test_option_effects.py",
        "tests/test_own_rates.py",
        "tests/test_readme_defaults.py",
        "-k",
        "fedtrim or own_rates or readme_defaults or every_declared_option",
    )
    assert tested.returncode == 0, tested.stdout[-4000:] + tested.stderr[-2000:]
    passed = [line for line in tested.stdout.splitlines() if "fedtrim" in line]
    assert passed and all("PASSED" in line for line in passed), passed
    # both modes, every conformance check, and its --trim probe
    assert sum("test_every_registered_method_conforms" in line for line in passed) >= 2 * 5
    assert any(
        "test_an_accepted_option_changes_the_run" in line and "trim" in line for line in passed
    )
