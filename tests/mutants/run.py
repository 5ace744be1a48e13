"""Plant the team's bugs one at a time and check that the tests named for each one fail.

Every ``tests/mutants/*.json`` describes one planted bug (a mutant)::

    {"id": "...", "description": "...", "file": "path/relative/to/the/repository",
     "find": "exact text occurring once", "replace": "the buggy text",
     "tests": ["tests/test_x.py::test_name", ...]}

For each mutant the runner replaces ``find`` by ``replace`` in ``file``, runs its tests
(``python -m pytest -p no:randomly -x -q TESTS``, with the project's virtual environment)
and puts the file back, byte for byte and with its timestamps, however the run ends
(a failure, Ctrl-C, SIGTERM). A mutant is

- ``killed`` when its tests fail (or run past the timeout),
- ``survived`` when they pass: the bug would get through the suite,
- ``stale`` when ``find`` does not occur exactly once (the code has moved on),
- ``error`` when pytest could not run the tests (a test id that does not exist, ...).

Before the first mutant, the runner checks that the packages under test (``stratify``,
``stratify.baselines`` and ``stratify.cli`` by default) import from the repository it
plants in: a virtual environment installed from another checkout would run that
checkout's code, and every mutant would survive there. It refuses to start otherwise.

The exit code is 0 when every mutant is killed, 1 otherwise, 2 for a bad mutant file or
option, or packages that import from elsewhere. Usage (tests/mutants/README.md)::

    .venv/bin/python tests/mutants/run.py [--only ID ...] [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

#: the fields every mutant file must have, with their types
FIELDS = {
    "id": str,
    "description": str,
    "file": str,
    "find": str,
    "replace": str,
    "tests": list,
}

#: the packages whose code the mutants change: each must import from the repository
PACKAGES = ("stratify", "stratify.baselines", "stratify.cli")

#: prints where each package named on its command line imports from (``__file__``, or
#: a namespace package's first folder)
WHERE_SCRIPT = """\
import importlib, sys
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    print(getattr(module, "__file__", None) or list(module.__path__)[0])
"""

#: pytest's exit codes for "tests ran and some failed" and "all passed"
TESTS_FAILED, TESTS_PASSED = 1, 0


class MutantFileError(Exception):
    """A mutant file that cannot be read as the format above."""


@dataclass(frozen=True)
class Mutant:
    """One planted bug, as read from its JSON file."""

    id: str
    description: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    source: Path


@dataclass(frozen=True)
class Outcome:
    """What planting a mutant gave: its status and one line of detail."""

    mutant: Mutant
    status: str
    detail: str


def read_mutants(folder: Path) -> list[Mutant]:
    """Every ``*.json`` in ``folder``, in name order.

    Parameters
    ----------
    folder : pathlib.Path
        The folder holding the mutant files.

    Raises
    ------
    MutantFileError
        A file that is not a JSON object with the fields of :data:`FIELDS`, or two
        mutants with the same id.
    """
    mutants: list[Mutant] = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise MutantFileError(f"{path.name}: not readable as JSON ({error})") from None
        if not isinstance(data, dict):
            raise MutantFileError(f"{path.name}: not a JSON object")
        for name, kind in FIELDS.items():
            if not isinstance(data.get(name), kind):
                raise MutantFileError(
                    f"{path.name}: field {name!r} missing or not a {kind.__name__}"
                )
        if not data["tests"] or not all(isinstance(test, str) for test in data["tests"]):
            raise MutantFileError(f"{path.name}: 'tests' must list at least one test id")
        if data["find"] == data["replace"]:
            raise MutantFileError(f"{path.name}: 'replace' is the same text as 'find'")
        mutants.append(
            Mutant(
                data["id"],
                data["description"],
                data["file"],
                data["find"],
                data["replace"],
                tuple(data["tests"]),
                path,
            )
        )
    ids = [mutant.id for mutant in mutants]
    duplicates = sorted({mutant_id for mutant_id in ids if ids.count(mutant_id) > 1})
    if duplicates:
        raise MutantFileError(f"mutant id(s) used twice: {', '.join(duplicates)}")
    return mutants


def foreign_imports(root: Path, python: str, packages: tuple[str, ...]) -> str | None:
    """Why the tests would not run ``root``'s code, in one line, or ``None``.

    The packages are imported as pytest imports them (``python`` started in ``root``),
    and each must come from a file below ``root``.

    Parameters
    ----------
    root : pathlib.Path
        The repository the mutants are planted in.
    python : str
        The interpreter that runs pytest.
    packages : tuple of str
        The packages to locate.
    """
    completed = subprocess.run(
        [python, "-c", WHERE_SCRIPT, *packages],
        cwd=root,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if completed.returncode != 0:
        reason = (completed.stderr.strip().splitlines() or [""])[-1]
        return f"{python} cannot import {', '.join(packages)} in {root}: {reason}"
    for name, location in zip(packages, completed.stdout.splitlines()):
        if not Path(location).resolve().is_relative_to(root):
            return (
                f"{name} imports from {location}, outside {root}: the tests would run "
                "another checkout's code (reinstall the virtual environment from this one "
                "or give --python)"
            )
    return None


def run_mutant(mutant: Mutant, root: Path, python: str, timeout: float) -> Outcome:
    """Plant ``mutant`` in its file under ``root``, run its tests, put the file back.

    Parameters
    ----------
    mutant : Mutant
        The bug to plant.
    root : pathlib.Path
        The repository the mutant's file and tests are relative to (pytest runs there).
    python : str
        The interpreter that runs pytest.
    timeout : float
        Seconds the tests may take; a mutant that makes them run longer counts as killed.
    """
    target = root / mutant.file
    try:
        original = target.read_bytes()
        stat = target.stat()
    except OSError as error:
        return Outcome(mutant, "stale", f"cannot read {mutant.file}: {error.strerror}")
    text = original.decode("utf-8")
    found = text.count(mutant.find)
    if found != 1:
        return Outcome(mutant, "stale", f"the 'find' text occurs {found} times in {mutant.file}")
    # no bytecode from the mutated source: a restored file of the same size, written in
    # the same second, could otherwise be served the mutant's cached bytecode
    environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    command = [python, "-m", "pytest", "-p", "no:randomly", "-x", "-q", *mutant.tests]
    started = time.monotonic()
    try:
        target.write_bytes(text.replace(mutant.find, mutant.replace).encode("utf-8"))
        completed = subprocess.run(
            command,
            cwd=root,
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return Outcome(mutant, "killed", f"its tests ran past the {timeout:g} s timeout")
    finally:
        target.write_bytes(original)
        os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    seconds = time.monotonic() - started
    last = (completed.stdout.strip().splitlines() or [""])[-1]
    if completed.returncode == TESTS_FAILED:
        return Outcome(mutant, "killed", f"{last} ({seconds:.0f} s)")
    if completed.returncode == TESTS_PASSED:
        return Outcome(mutant, "survived", f"{last} ({seconds:.0f} s)")
    reason = (completed.stderr.strip() or completed.stdout.strip()).splitlines()
    return Outcome(
        mutant,
        "error",
        f"pytest exit code {completed.returncode}: {reason[-1] if reason else ''}",
    )


def stop_on_sigterm() -> None:
    """SIGTERM as Ctrl-C, so that the ``finally`` restoring a mutated file runs."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def default_python(root: Path) -> str:
    """The project's virtual environment's interpreter, else this one."""
    venv = root / ".venv" / "bin" / "python"
    return str(venv) if venv.is_file() else sys.executable


def main(argv: list[str] | None = None) -> int:
    """Run the mutants; the exit code (0: every one killed)."""
    parser = argparse.ArgumentParser(
        description="Plant each tests/mutants/*.json bug in turn and check its tests fail."
    )
    parser.add_argument("--only", action="append", metavar="ID", help="run this mutant only")
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds per mutant's tests (900)"
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parents[2],
        help="the repository (default: the one holding this script)",
    )
    parser.add_argument("--python", help="interpreter running pytest (default: ROOT/.venv)")
    parser.add_argument(
        "--package",
        action="append",
        metavar="NAME",
        help="a package that must import from ROOT (repeatable; default: "
        + ", ".join(PACKAGES)
        + ")",
    )
    options = parser.parse_args(argv)
    root = options.root.resolve()
    python = options.python or default_python(root)
    try:
        mutants = read_mutants(root / "tests" / "mutants")
    except MutantFileError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if options.only:
        unknown = sorted(set(options.only) - {mutant.id for mutant in mutants})
        if unknown:
            print(f"error: no mutant with id {', '.join(unknown)}", file=sys.stderr)
            return 2
        mutants = [mutant for mutant in mutants if mutant.id in options.only]
    if not mutants:
        print(f"error: no mutant files in {root / 'tests' / 'mutants'}", file=sys.stderr)
        return 2
    foreign = foreign_imports(root, python, tuple(options.package or PACKAGES))
    if foreign is not None:
        print(f"error: {foreign}", file=sys.stderr)
        return 2
    stop_on_sigterm()
    counts: dict[str, int] = {}
    for mutant in mutants:
        print(f"{mutant.id}: {mutant.description}", flush=True)
        try:
            outcome = run_mutant(mutant, root, python, options.timeout)
        except KeyboardInterrupt:
            print(f"interrupted; {mutant.file} is restored", file=sys.stderr)
            return 130
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
        print(f"  {outcome.status.upper()}: {outcome.detail}", flush=True)
    summary = ", ".join(
        f"{counts.get(status, 0)} {status}" for status in ("killed", "survived", "stale", "error")
    )
    print(f"{len(mutants)} mutant(s): {summary}")
    return 0 if counts.get("killed", 0) == len(mutants) else 1


if __name__ == "__main__":
    sys.exit(main())
