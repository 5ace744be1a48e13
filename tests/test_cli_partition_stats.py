"""`stratify data stats` (formerly `partition-stats`): tables on digits and mnist-10k,
one-line errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from stratify.cli.main import main

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def run_ok(capsys, *args: str) -> str:
    main(["data", "stats", *args])
    captured = capsys.readouterr()
    assert captured.err == ""
    return captured.out


def run_error(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as caught:
        main(["data", "stats", *args])
    assert caught.value.code != 0
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


def client_rows(output: str) -> list[list[int]]:
    """The per-client rows of the counts table: [client, count per label..., total]."""
    rows = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0].isdigit():
            rows.append([0 if c == "·" else int(c) for c in cells])
    return rows


def metric(output: str, name: str) -> tuple[str, str]:
    line = next(line for line in output.splitlines() if name in line)
    cells = [c.strip() for c in line.split("│")[1:-1]]
    return cells[1], cells[2]


def test_digits_iid_table_and_metrics(capsys):
    output = run_ok(capsys, "--dataset", "digits", "--partition", "iid", "--clients", "5")
    rows = client_rows(output)
    assert [row[0] for row in rows] == [0, 1, 2, 3, 4]
    assert all(len(row) == 12 and sum(row[1:11]) == row[11] for row in rows)
    assert sum(row[11] for row in rows) == 1437  # digits' training split
    assert "samples per client and label" in output and "heterogeneity" in output
    global_ci, client_ci = metric(output, "ΔCI")
    assert float(global_ci) < 0.01 and float(client_ci) < 0.05
    assert metric(output, "ΔAI") == ("n/a", "n/a") and metric(output, "ΔSC") == ("n/a", "n/a")


def test_digits_classes_one_reports_dropped_labels(capsys):
    output = run_ok(capsys, "--dataset", "digits", "--partition", "classes:1", "--clients", "3")
    rows = client_rows(output)
    assert [sum(1 for count in row[1:11] if count) for row in rows] == [1, 1, 1]
    assert re.search(r"\d+ samples of labels \[3, 4, 5, 6, 7, 8, 9\] are held by no client", output)
    assert float(metric(output, "ΔCI")[1]) == pytest.approx(1.0)


def test_output_is_deterministic_for_a_seed(capsys):
    args = ("--dataset", "digits", "--partition", "dirichlet:0.3", "--clients", "6", "--seed", "4")
    assert run_ok(capsys, *args) == run_ok(capsys, *args)


@pytest.mark.data
def test_mnist_10k_dirichlet(capsys, shared_data_dir):
    output = run_ok(
        capsys,
        "--dataset",
        "mnist-10k",
        "--data-dir",
        shared_data_dir,
        "--partition",
        "dirichlet:0.5",
        "--clients",
        "10",
    )
    rows = client_rows(output)
    assert len(rows) == 10 and sum(row[-1] for row in rows) == 8000
    assert min(row[-1] for row in rows) >= 10
    assert float(metric(output, "ΔCI")[1]) > float(metric(output, "ΔCI")[0])


@pytest.mark.data
def test_colored_mnist_uses_colour_as_attribute(capsys, shared_data_dir, monkeypatch):
    monkeypatch.setenv("STRATIFY_DATA_DIR", shared_data_dir)  # --data-dir from the environment
    output = run_ok(
        capsys,
        "--dataset",
        "colored-mnist",
        "--partition",
        "domains:1",
        "--clients",
        "4",
        "-o",
        "correlation=1",
    )
    global_sc, client_sc = metric(output, "ΔSC")
    assert 0.45 < float(global_sc) < 0.48
    assert float(metric(output, "ΔAI")[1]) == pytest.approx(1.0)  # one colour per client


@pytest.mark.parametrize(
    "args, message",
    [
        (("--dataset", "nope"), "unknown dataset 'nope'"),
        (("--partition", "classes:x"), "classes needs a whole number"),
        (("--partition", "dirichlet:-1"), "positive concentration"),
        (("--partition", "stripes:2"), "unknown partition 'stripes:2'"),
        (("--partition", "classes:11"), "data has only 10"),
        (("--clients", "0"), "--clients must be a positive integer, got 0"),
        (("--clients", "5000"), "5000 clients but only 1437 samples"),
        (("--partition", "domains:1"), "this dataset has none"),
        (("--dataset", "mnist-10k", "--data-dir", "/nonexistent/data"), "missing t10k-images"),
        (("--dataset", "cifar10", "--data-dir", "/nonexistent/data"), "does not exist"),
        (("-o", "correlation"), "not KEY=VALUE"),
    ],
)
def test_bad_input_is_one_line_on_stderr(capsys, args, message):
    assert message in run_error(capsys, *args)


@pytest.mark.slow
def test_console_script_end_to_end():
    command = [
        sys.executable,
        "-m",
        "stratify.cli.main",
        "data",
        "stats",
        "--dataset",
        "digits",
        "--partition",
        "shards:2",
        "--clients",
        "4",
    ]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(client_rows(done.stdout)) == 4
    failed = subprocess.run(
        command[:-4] + ["--partition", "dirichlet:abc"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failed.returncode == 2
    assert failed.stderr.strip().count("\n") == 0 and "Traceback" not in failed.stderr
