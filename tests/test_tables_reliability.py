"""`stratify tables` on damaged inputs (issue 57): every results file and document is read
through the guarded reader and checked before anything is written; a bad one is one line
and exit 2 with every document left as it was, a stale table under --check is exit 1, a bug
exit 3, and a document is replaced whole or not at all."""

from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stratify.cli.main import main
from stratify.reproduce.tables import TABLES

ROOT = Path(__file__).resolve().parents[1]
NAME = "defaults-digits"
#: generous: a subprocess importing torch on a loaded machine; a FIFO waited on never ends
TIMEOUT = 120


def stale_copy(tmp_path: Path, names: tuple[str, ...] = (NAME,)) -> Path:
    """A copy of ``names``' documents and results files under ``tmp_path``, each table
    made stale (a line added to its block), so a command that accepted its input rewrites it."""
    for name in names:
        table = TABLES[name]
        for part in (table.document, table.results):
            (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / part, tmp_path / part)
    for name in names:
        document = tmp_path / TABLES[name].document
        marker = f"<!-- table: {name} -->\n"
        assert marker in document.read_text()
        document.write_text(document.read_text().replace(marker, f"{marker}edited by hand\n"))
    return tmp_path


def run_tables(capsys, *args: str) -> tuple[int, list[str]]:
    """``stratify tables ARGS`` in this process: its exit code and its stderr's lines."""
    try:
        main(["tables", *args])
        code = 0
    except SystemExit as done:
        code = done.code
    return code, capsys.readouterr().err.strip().splitlines()


def header_and_row(results: Path) -> tuple[str, str]:
    lines = results.read_text().splitlines()
    return lines[0], lines[1]


def with_field(results: Path, column: str, value: str) -> bytes:
    header, row = header_and_row(results)
    names = header.split(",")
    fields = row.split(",")  # the first row of defaults-digits.csv quotes no field
    assert len(fields) == len(names)
    fields[names.index(column)] = value
    return f"{header}\n{','.join(fields)}\n".encode()


#: case -> the results file's new bytes (from the committed copy), and what the line says
DAMAGED_RESULTS = {
    "not UTF-8": (
        lambda path: path.read_bytes().replace(b"stratify", b"strat\xffify", 1),
        "not UTF-8",
    ),
    "text in a number column": (
        lambda path: with_field(path, "last_mean_validation_accuracy", "high"),
        "column last_mean_validation_accuracy: 'high' is not a number",
    ),
    "text in an integer column": (
        lambda path: with_field(path, "seed", "0.5"),
        "column seed: '0.5' is not a whole number",
    ),
    "a field over 128 KiB": (
        lambda path: with_field(path, "run_dir", "x" * (129 << 10)),
        "is not CSV (field larger than field limit",
    ),
    "empty": (lambda path: b"", "is empty"),
    "a header only": (lambda path: path.read_bytes().splitlines(keepends=True)[0], "no run"),
    "NaN": (
        lambda path: with_field(path, "last_mean_validation_accuracy", "nan"),
        "'nan' is not a finite number",
    ),
    "1e999": (lambda path: with_field(path, "lr", "1e999"), "'1e999' is not a finite number"),
    "a row cut short": (
        lambda path: path.read_bytes() + b"defaults,lr 0.1\n",
        "has 2 fields, its header 32",
    ),
    "a column missing": (lambda path: b"grid,seed\ndefaults,0\n", "has no column row"),
}


@pytest.mark.parametrize("check", [False, True], ids=["write", "check"])
@pytest.mark.parametrize("case", DAMAGED_RESULTS)
def test_a_damaged_results_file_is_one_line_exit_2_and_the_document_is_kept(
    tmp_path, capsys, case, check
):
    root = stale_copy(tmp_path)
    results, document = root / TABLES[NAME].results, root / TABLES[NAME].document
    damage, said = DAMAGED_RESULTS[case]
    results.write_bytes(damage(results))
    before = document.read_bytes()
    code, err = run_tables(capsys, NAME, "--root", str(root), *(["--check"] if check else []))
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("error: ") and said in err[0], err
    assert str(results) in err[0]
    assert document.read_bytes() == before


def test_a_document_that_is_not_utf8_is_one_line_and_kept(tmp_path, capsys):
    root = stale_copy(tmp_path)
    document = root / TABLES[NAME].document
    document.write_bytes(document.read_bytes().replace(b"edited by hand", b"\xe9dited by hand", 1))
    before = document.read_bytes()
    code, err = run_tables(capsys, NAME, "--root", str(root))
    assert code == 2 and len(err) == 1, err
    byte = before.index(b"\xe9")
    assert err[0] == f"error: {document} is not UTF-8 text (byte {byte})"
    assert document.read_bytes() == before


def test_a_bad_results_file_of_one_table_keeps_every_document_unwritten(tmp_path, capsys):
    # two tables of one document: the first regenerated, the second refused; nothing
    # is written, not even the first's block
    root = stale_copy(tmp_path, (NAME, "fedtan-digits"))
    (root / TABLES["fedtan-digits"].results).write_bytes(b"")
    document = root / TABLES[NAME].document
    before = document.read_bytes()
    code, err = run_tables(capsys, NAME, "fedtan-digits", "--root", str(root))
    assert code == 2 and len(err) == 1 and "is empty" in err[0], err
    assert document.read_bytes() == before


def test_stale_is_exit_1_and_a_bug_exit_3(tmp_path, capsys, monkeypatch):
    root = stale_copy(tmp_path)
    code, err = run_tables(capsys, NAME, "--root", str(root), "--check")
    assert code == 1 and err == [f"{NAME}: differs from {TABLES[NAME].results}"]

    def broken(rows):
        raise RuntimeError("a renderer's bug")

    monkeypatch.setitem(TABLES, NAME, dataclasses.replace(TABLES[NAME], render=broken))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the traceback's file
    for check in ([], ["--check"]):
        code, err = run_tables(capsys, NAME, "--root", str(root), *check)
        assert code == 3, err
        assert len(err) == 1 and "this is a bug in stratify" in err[0], err


def stratify_tables(*args: str, **options) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stratify.cli.main", "tables", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        **options,
    )


@pytest.mark.parametrize("which", ["results", "document"])
def test_a_fifo_as_a_results_file_or_a_document_is_refused_without_waiting(tmp_path, which):
    root = stale_copy(tmp_path)
    fifo = root / getattr(TABLES[NAME], which)
    kept = root / TABLES[NAME].document
    fifo.unlink()
    os.mkfifo(fifo)
    before = kept.read_bytes() if which == "results" else None
    # before the fix the command opened the FIFO and waited for a writer: the timeout
    # fails the test instead of hanging it
    process = stratify_tables(NAME, "--root", str(root))
    assert process.returncode == 2, process.stderr
    assert process.stderr.strip().splitlines() == [f"error: {fifo} is a FIFO, not a regular file"]
    if before is not None:
        assert kept.read_bytes() == before


def test_a_file_size_limit_leaves_the_document_whole(tmp_path):
    names = tuple(name for name, table in TABLES.items() if table.document == "docs/results.md")
    root = stale_copy(tmp_path, names)
    document = root / "docs" / "results.md"
    before = document.read_bytes()
    assert len(before) > 8192  # the limit cuts the new document short

    def limit() -> None:
        # `ulimit -f 8`; Python ignores SIGXFSZ, so the write fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    process = stratify_tables(*names, "--root", str(root), preexec_fn=limit)
    assert process.returncode == 2, process.stderr
    assert process.stderr.strip().splitlines() == [
        f"error: cannot write {document}: File too large (its previous version is kept)"
    ]
    assert document.read_bytes() == before
    assert sorted(path.name for path in document.parent.iterdir()) == ["results", "results.md"]
