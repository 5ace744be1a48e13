"""`stratify bench-privacy`: a tiny grid end to end, its JSON, and one-line errors."""

from __future__ import annotations

import json

import pytest

import cli.bench_privacy as bench_module
from cli.bench_privacy import make_clients, parse_positive_ints
from cli.main import main
from stratify.errors import ConfigError

FIELDS = {
    "protocol",
    "classes",
    "clients",
    "unique_s",
    "mapping_s",
    "aggregation_s",
    "total_s",
    "verified",
}


def run_error(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as caught:
        main(["bench-privacy", *args])
    assert caught.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


def test_tiny_grid_writes_verified_json_and_prints_table_iv(capsys, tmp_path):
    path = tmp_path / "bench.json"
    main(["bench-privacy", "--classes", "2,10", "--clients", "3", "--json", str(path)])
    captured = capsys.readouterr()
    assert captured.err == ""
    rows = json.loads(path.read_text())
    assert [(r["classes"], r["clients"], r["protocol"]) for r in rows] == [
        (2, 3, "naive"),
        (2, 3, "packed"),
        (10, 3, "naive"),
        (10, 3, "packed"),
    ]
    for row in rows:
        assert FIELDS <= set(row)
        assert row["verified"] is True
        assert row["total_s"] == pytest.approx(
            row["unique_s"] + row["mapping_s"] + row["aggregation_s"]
        )
        assert min(row["unique_s"], row["mapping_s"], row["aggregation_s"]) > 0
        assert row["max_decryption_error"] < 1e-3
    naive_10, packed_10 = rows[2], rows[3]
    assert packed_10["speedup"] == pytest.approx(naive_10["total_s"] / packed_10["total_s"])
    assert packed_10["subtractions"] < naive_10["subtractions"]
    assert "speedup" not in naive_10
    out = captured.out
    assert "verified" in out and "speed-up" in out and "Table IV" in out
    assert "unique + mapping + aggregation" in out and "10 classes" in out and "3 clients" in out


def test_single_protocol_and_repeats(capsys, tmp_path):
    path = tmp_path / "packed.json"
    main(
        [
            "bench-privacy",
            "--classes",
            "4",
            "--clients",
            "2,3",
            "--protocol",
            "packed",
            "--repeat",
            "2",
            "--seed",
            "5",
            "--json",
            str(path),
        ]
    )
    rows = json.loads(path.read_text())
    assert [(r["protocol"], r["clients"], r["repeat"], r["seed"]) for r in rows] == [
        ("packed", 2, 2, 5),
        ("packed", 3, 2, 5),
    ]
    assert all(r["verified"] and "speedup" not in r for r in rows)
    assert "naive" not in capsys.readouterr().out


def test_a_result_that_differs_from_plain_is_reported_and_fails(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(bench_module, "same_result", lambda first, second: False)
    path = tmp_path / "bad.json"
    line = run_error(
        capsys, "--classes", "2", "--clients", "2", "--protocol", "packed", "--json", str(path)
    )
    assert "differs from the plain registry in: 2x2 packed" in line
    assert json.loads(path.read_text())[0]["verified"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--classes", "2,x"], "--classes takes comma-separated integers, got '2,x'"),
        (["--classes", "0,10"], "--classes takes integers of at least 1"),
        (["--clients", ""], "--clients takes integers of at least 1"),
        (["--clients", "-3"], "--clients takes integers of at least 1"),
        (["--repeat", "0"], "--repeat takes an integer of at least 1, got 0"),
    ],
)
def test_bad_options_give_one_line_errors(capsys, args, message):
    assert message in run_error(capsys, *args)


def test_unwritable_json_is_a_one_line_error(capsys, tmp_path):
    target = tmp_path / "missing" / "out.json"
    line = run_error(
        capsys, "--classes", "1", "--clients", "1", "--protocol", "packed", "--json", str(target)
    )
    assert "cannot write --json" in line


def test_parse_positive_ints():
    assert parse_positive_ints(" 2, 10 ,100,", "--classes") == [2, 10, 100]
    assert parse_positive_ints("5,5", "--clients") == [5]
    with pytest.raises(ConfigError):
        parse_positive_ints("1.5", "--classes")


def test_clients_hold_seeded_random_label_subsets():
    clients = make_clients(classes=100, clients=20, seed=0)
    assert clients == make_clients(classes=100, clients=20, seed=0)
    assert clients != make_clients(classes=100, clients=20, seed=1)
    assert len(clients) == 20
    for counts in clients:
        assert 1 <= len(counts) <= 100
        assert all(0 <= label < 100 and 1 <= count <= 1000 for label, count in counts.items())
    assert any(list(counts) != sorted(counts) for counts in clients)  # random mapping order
