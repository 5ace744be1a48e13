"""The mutation runner (tests/mutants/run.py) on a toy repository: a planted bug that its
test catches is killed, one that no test sees survives, one whose text has moved is
stale, and the file is back byte for byte afterwards; and it refuses to start when the
code under test would import from another checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).resolve().parent / "mutants" / "run.py"

SOURCE = "def add(a, b):\n    return a + b\n\n\ndef unused():\n    return 1\n"

TEST = "from toy import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def toy_repository(root: Path) -> None:
    (root / "tests" / "mutants").mkdir(parents=True)
    (root / "toy.py").write_text(SOURCE)
    (root / "tests" / "test_toy.py").write_text(TEST)
    (root / "conftest.py").write_text("")  # pytest puts the root on sys.path
    mutants = {
        "killed": ("return a + b", "return a - b"),
        "survives": ("return 1", "return 2"),
        "stale": ("return a * b", "return a / b"),
    }
    for name, (find, replace) in mutants.items():
        mutant = {
            "id": name,
            "description": f"the {name} one",
            "file": "toy.py",
            "find": find,
            "replace": replace,
            "tests": ["tests/test_toy.py::test_add"],
        }
        (root / "tests" / "mutants" / f"{name}.json").write_text(json.dumps(mutant))


def run_runner(
    root: Path, *options: str, package: str = "toy", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(RUNNER), "--root", str(root), "--python", sys.executable]
        + ["--package", package, *options],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_the_runner_reports_killed_survived_and_stale_and_restores_the_file(tmp_path):
    toy_repository(tmp_path)
    before = (tmp_path / "toy.py").stat().st_mtime_ns
    everything = run_runner(tmp_path)
    assert everything.returncode == 1, everything.stderr
    lines = everything.stdout.splitlines()
    status = {lines[i].split(":")[0]: lines[i + 1].split(":")[0].strip() for i in (0, 2, 4)}
    assert status == {"killed": "KILLED", "stale": "STALE", "survives": "SURVIVED"}
    assert lines[-1] == "3 mutant(s): 1 killed, 1 survived, 1 stale, 0 error"
    assert (tmp_path / "toy.py").read_text() == SOURCE
    assert (tmp_path / "toy.py").stat().st_mtime_ns == before

    killed_only = run_runner(tmp_path, "--only", "killed")
    assert killed_only.returncode == 0, killed_only.stdout
    assert killed_only.stdout.splitlines()[-1].startswith("1 mutant(s): 1 killed")
    assert (tmp_path / "toy.py").read_text() == SOURCE

    unknown = run_runner(tmp_path, "--only", "nothing")
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == "error: no mutant with id nothing"


def test_the_runner_refuses_to_start_when_the_code_imports_from_another_checkout(tmp_path):
    # the toy's package exists only in another checkout on the path: the tests would
    # run that code, and every mutant planted here would survive
    root, other = tmp_path / "here", tmp_path / "other"
    toy_repository(root)
    (other / "toypkg").mkdir(parents=True)
    (other / "toypkg" / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(other)}
    refused = run_runner(root, package="toypkg", env=env)
    assert refused.returncode == 2 and refused.stdout == ""
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: toypkg imports from ")
    assert str(other) in lines[0] and f"outside {root}" in lines[0]
    assert (root / "toy.py").read_text() == SOURCE

    # the same package in the checkout itself comes first: the runner starts
    (root / "toypkg").mkdir()
    (root / "toypkg" / "__init__.py").write_text("")
    started = run_runner(root, "--only", "killed", package="toypkg", env=env)
    assert started.returncode == 0, started.stderr
