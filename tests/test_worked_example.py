"""docs/architecture.md's worked example of adding a method, run as written.

The method's file is the code block of the section's step 1, taken from the page; it is
registered with the one line of step 2 and nothing else, and must then appear everywhere
step 3 says: ``stratify methods`` (and its Markdown table, the one in docs/methods.md), the
conformance suite and the paired grid.
"""

import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from stratify.algorithms import ALGORITHMS
from stratify.cli.methods import methods
from stratify.comparison import comparator_for
from stratify.reproduce.grids import GRIDS, Settings, plan_cells
from stratify.testing import CHECKS, MethodCase, check_declarations, checks_for, method_cases

ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
STEP_1 = "**1. The method: `baselines/fedtrim.py`.**"


def step_1_code() -> str:
    """The Python block that follows step 1 of the worked example."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    start = text.index(STEP_1)
    block = re.search(r"```python\n(.*?)```", text[start:], re.DOTALL)
    assert block is not None, "step 1 of the worked example has no Python block"
    return block.group(1)


@pytest.fixture
def fedtrim(tmp_path, monkeypatch):
    """The page's FedTrim as a module of its own, registered as step 2 says."""
    (tmp_path / "fedtrim_example.py").write_text(step_1_code(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(ALGORITHMS, "fedtrim", "fedtrim_example:FedTrim")
    yield "fedtrim"
    sys.modules.pop("fedtrim_example", None)


def test_the_example_method_is_listed_by_stratify_methods(fedtrim):
    listed = CliRunner().invoke(methods, [], terminal_width=200)
    assert listed.exit_code == 0 and "fedtrim" in listed.output
    markdown = CliRunner().invoke(methods, ["--markdown"]).output
    (row,) = [line for line in markdown.splitlines() if line.startswith("| `fedtrim` |")]
    assert "`--trim` 0.1" in row and "single-sample, batch" in row


def test_the_example_method_gets_every_conformance_check(fedtrim):
    cases = [case for case in method_cases() if case.algorithm == fedtrim]
    assert [case.mode for case in cases] == ["single-sample", "batch"]
    # it declares a comparator, so even the comparator's check applies to it
    for case in cases:
        assert [check.name for check in checks_for(case)] == [check.name for check in CHECKS]
    check_declarations(MethodCase(fedtrim, "batch"))


def test_the_example_method_runs_in_the_paired_grid_beside_its_comparator(fedtrim, tmp_path):
    settings = Settings(dataset="digits", seeds=(0,), methods=(fedtrim,))
    cells, notes = plan_cells(GRIDS["paired"], settings, tmp_path)
    assert not notes
    labels = {cell.column.label for cell in cells}
    assert labels == {"FedTrim", "FedAvg (matched)"}
    # its one weighting, equal, reaches the comparator
    assert comparator_for(fedtrim, {})[1]["weighting"] == "equal"
    matched = [cell for cell in cells if cell.column.label == "FedAvg (matched)"]
    assert all(cell.config.options["weighting"] == "equal" for cell in matched)
