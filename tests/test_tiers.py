"""The tiers (docs/development.md, "Tests"): tests/tiers.py reads a durations record in
either format and lists the slow tests; tests/conftest.py marks them ``slow`` and keeps
one case per method of a method-wide parametrisation."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import conftest
import pytest
from tiers import durations, main, slow_tests

from stratify.testing import MethodCase


def test_a_record_in_either_format_sums_each_tests_phases():
    record = [
        "============ slowest durations ============",
        "3.50s call     tests/test_a.py::test_x[fedavg-batch]",
        "0.75s setup    tests/test_a.py::test_x[fedavg-batch]",
        "0.01s teardown tests/test_a.py::test_y",
        "2.000 tests/test_b.py::test_z[a b]",  # --durations-file's lines
        "(3 durations < 0.005s hidden.  Use -vv to show these durations.)",
    ]
    times = durations(record)
    assert times == {
        "tests/test_a.py::test_x[fedavg-batch]": 4.25,
        "tests/test_a.py::test_y": 0.01,
        "tests/test_b.py::test_z[a b]": 2.0,
    }
    assert slow_tests(times, threshold=2.0) == [
        "tests/test_a.py::test_x[fedavg-batch]",
        "tests/test_b.py::test_z[a b]",
    ]


def test_the_script_writes_the_list_and_refuses_an_empty_record(tmp_path, capsys):
    record = tmp_path / "durations.txt"
    record.write_text("1.500 tests/test_a.py::test_slow\n0.100 tests/test_a.py::test_quick\n")
    assert main([str(record)]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert listed == ["tests/test_a.py::test_slow"]
    record.write_text("nothing recorded\n")
    assert main([str(record)]) == 2
    assert "records no test durations" in capsys.readouterr().err


@dataclass
class Item:
    """What the collection hook reads of a test item."""

    nodeid: str
    params: dict = field(default_factory=dict)
    markers: list = field(default_factory=list)

    @property
    def callspec(self):
        return SimpleNamespace(params=self.params) if self.params else None

    def add_marker(self, marker):
        self.markers.append(marker.name)


def test_the_fast_tier_keeps_one_case_per_method_and_drops_the_listed(monkeypatch):
    def case(algorithm, mode, check):
        return Item(
            f"tests/test_c.py::test_conforms[{algorithm}-{mode}-{check}]",
            {"case": MethodCase(algorithm, mode), "check": check},
        )

    items = [
        case("fedavg", "batch", "first_epoch"),  # listed slow: the next case is kept
        case("fedavg", "batch", "resume"),
        case("fedavg", "single-sample", "first_epoch"),
        case("fedprox", "batch", "first_epoch"),
        case("fedprox", "batch", "resume"),
        Item("tests/test_d.py::test_plain"),
        Item("tests/test_d.py::test_listed"),
    ]
    listed = {items[0].nodeid, "tests/test_d.py::test_listed"}
    monkeypatch.setattr(conftest, "recorded_slow", lambda: listed)
    conftest.pytest_collection_modifyitems(None, items)
    fast = [item.nodeid for item in items if "slow" not in item.markers]
    assert fast == [
        "tests/test_c.py::test_conforms[fedavg-batch-resume]",
        "tests/test_c.py::test_conforms[fedprox-batch-first_epoch]",
        "tests/test_d.py::test_plain",
    ]


#: two test files for a run on two workers: each test notes which worker ran it
WORKER_NOTING_TEST = """
import os
from pathlib import Path


def test_{name}_{number}():
    Path("{name}-{number}.worker").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


@pytest.mark.slow
def test_a_run_on_two_workers_records_every_test_once(tmp_path):
    """Under pytest-xdist (``make test``'s ``-n``) the record is the whole run's: every
    test of both workers once, not one worker's share, and tests/tiers.py reads it."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # node ids from here: tests/...
    (tmp_path / "tests").mkdir()
    shutil.copy(Path(conftest.__file__), tmp_path / "tests" / "conftest.py")
    for name in ("alpha", "beta"):
        tests = "".join(WORKER_NOTING_TEST.format(name=name, number=n) for n in (1, 2))
        (tmp_path / "tests" / f"test_{name}.py").write_text(tests)
    record = tmp_path / "build" / "durations.txt"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "tests"]
        + ["--durations-file", str(record), "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    workers = {path.read_text() for path in tmp_path.glob("*.worker")}
    assert len(workers) == 2, workers  # the two files ran on two workers
    lines = record.read_text().splitlines()
    nodes = [f"tests/test_{name}.py::test_{name}_{n}" for name in ("alpha", "beta") for n in (1, 2)]
    assert len(lines) == 4 and sorted(durations(lines)) == nodes
