"""`stratify bench privacy`: a tiny grid end to end, its JSON, and one-line errors."""

from __future__ import annotations

import json

import pytest

import stratify.bench.privacy as bench_module
from stratify.bench.privacy import make_clients, parse_protocols
from stratify.cli.common import parse_int_list
from stratify.cli.main import main
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
        main(["bench", "privacy", *args])
    assert caught.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


def test_tiny_grid_writes_verified_json_and_prints_table_iv(capsys, tmp_path):
    path = tmp_path / "bench.json"
    main(["bench", "privacy", "--classes", "2,10", "--clients", "3", "--json", str(path)])
    captured = capsys.readouterr()
    assert captured.err == ""
    rows = json.loads(path.read_text())
    protocols = ["naive", "packed", "naive-blind", "packed-blind"]  # all four by default
    assert [(r["classes"], r["clients"], r["protocol"]) for r in rows] == [
        (classes, 3, protocol) for classes in (2, 10) for protocol in protocols
    ]
    for row in rows:
        assert FIELDS <= set(row)
        assert row["verified"] is True
        assert min(row["unique_s"], row["mapping_s"], row["aggregation_s"]) > 0
        assert row["max_decryption_error"] < 1e-3
        blinded = row["protocol"].endswith("-blind")
        # a blinded registration blinds each comparison and masks each total it decrypts
        assert row["multiplications"] == (row["subtractions"] if blinded else 0)
        assert (row["maskings"] > 0) == blinded
        assert ("blind_cost" in row) == blinded
    naive_10, packed_10, naive_blind_10, packed_blind_10 = rows[4:]
    assert packed_10["speedup"] > 0 and packed_blind_10["speedup"] > 0
    assert packed_10["subtractions"] < naive_10["subtractions"]
    assert "speedup" not in naive_10 and "speedup" not in naive_blind_10
    assert packed_blind_10["blind_cost"] == packed_blind_10["total_s"] / packed_10["total_s"]
    out = captured.out
    assert "verified" in out and "speed-up" in out and "vs unblinded" in out and "Table IV" in out
    assert "unique + mapping + aggregation" in out and "10 classes" in out and "3 clients" in out
    assert "packed-blind (Table IV layout)" in out


# (unique_s, mapping_s, aggregation_s, setup_s) of each of three registrations per cell
SCRIPTED_TIMINGS = {
    "naive": [(1.0, 2.0, 3.0, 0.03), (10.0, 1.0, 1.0, 0.0), (2.0, 5.0, 2.0, 0.0)],
    "packed": [(0.5, 0.25, 0.25, 0.04), (0.5, 1.0, 1.5, 0.0), (0.25, 0.25, 4.0, 0.0)],
    "naive-blind": [(4.0, 4.0, 4.0, 0.05), (4.0, 4.0, 4.0, 0.0), (4.0, 4.0, 4.0, 0.0)],
    "packed-blind": [(1.0, 1.0, 1.0, 0.05), (2.0, 1.0, 1.0, 0.0), (0.5, 0.5, 0.5, 0.0)],
}


class ScriptedTimingsRegistry(bench_module.CKKSRegistry):
    """The real CKKS registry (results still verified against plain) reporting scripted
    phase times, so that medians, totals and speed-ups can be checked by hand."""

    def register(self, *args, **kwargs):
        result = super().register(*args, **kwargs)
        self.calls = getattr(self, "calls", 0) + 1
        unique, mapping, aggregation, setup = SCRIPTED_TIMINGS[self.protocol][self.calls - 1]
        self.timings = {
            "setup_s": setup,
            "unique_s": unique,
            "mapping_s": mapping,
            "aggregation_s": aggregation,
        }
        return result


def test_phase_medians_totals_and_speedup_from_scripted_timings(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(bench_module, "CKKSRegistry", ScriptedTimingsRegistry)
    path = tmp_path / "scripted.json"
    args = ["--classes", "3", "--clients", "2", "--repeat", "3", "--json", str(path)]
    main(["bench", "privacy", *args, "--protocol", "both"])
    naive, packed = json.loads(path.read_text())
    # naive: phase medians 2, 2, 2; run totals 6, 12, 9 -> total = their median, 9 (not
    # the sum of the phase medians, 6); key generation is the first run's 0.03
    assert (naive["unique_s"], naive["mapping_s"], naive["aggregation_s"]) == (2.0, 2.0, 2.0)
    assert naive["total_s"] == 9.0 and naive["setup_s"] == 0.03
    # packed: medians 0.5, 0.25, 1.5; run totals 1.0, 3.0, 4.5 -> 3.0; speed-up 9 / 3
    assert (packed["unique_s"], packed["mapping_s"], packed["aggregation_s"]) == (0.5, 0.25, 1.5)
    assert packed["total_s"] == 3.0 and packed["setup_s"] == 0.04
    assert packed["speedup"] == 3.0 and "speedup" not in naive
    assert naive["verified"] and packed["verified"] and naive["repeat"] == 3
    out = capsys.readouterr().out
    assert "9.000" in out and "3.000" in out and "3.0x" in out
    assert "2.0s + 2.0s + 2.0s" in out  # Table IV, naive
    assert "500ms + 250ms + 1.5s" in out  # Table IV, packed


def test_blinded_rows_are_compared_with_naive_blind_and_with_their_unblinded_protocol(
    capsys, tmp_path, monkeypatch
):
    monkeypatch.setattr(bench_module, "CKKSRegistry", ScriptedTimingsRegistry)
    path = tmp_path / "scripted.json"
    args = ["--classes", "3", "--clients", "2", "--repeat", "3", "--json", str(path)]
    main(["bench", "privacy", *args, "--protocol", "packed,packed-blind,naive-blind"])
    packed, naive_blind, packed_blind = json.loads(path.read_text())
    # run totals: packed 1.0, 3.0, 4.5 -> 3.0; packed-blind 3.0, 4.0, 1.5 -> 3.0;
    # naive-blind 12 each -> 12. Speed-up over naive-blind 12 / 3; cost over packed 3 / 3
    assert packed_blind["total_s"] == 3.0 and naive_blind["total_s"] == 12.0
    assert packed_blind["speedup"] == 4.0 and packed_blind["blind_cost"] == 1.0
    assert "speedup" not in packed  # no naive in this run
    assert "blind_cost" not in naive_blind  # nor naive to compare it with
    out = capsys.readouterr().out
    assert "4.0x" in out and "1.00x" in out


def test_single_protocol_and_repeats(capsys, tmp_path):
    path = tmp_path / "packed.json"
    main(
        [
            "bench",
            "privacy",
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
        (["--repeat", "0"], "--repeat must be a positive integer, got 0"),
        (["--protocol", "fast"], "--protocol takes comma-separated names of naive, packed"),
        (["--protocol", "packed,"], "got 'packed,'"),
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


def test_parse_protocols():
    assert parse_protocols("packed-blind, naive") == ["naive", "packed-blind"]
    assert parse_protocols("both") == ["naive", "packed"]
    assert parse_protocols("all,packed") == ["naive", "packed", "naive-blind", "packed-blind"]
    with pytest.raises(ConfigError, match="both, all; got 'blind'"):
        parse_protocols("blind")


def test_parse_int_list():
    assert parse_int_list(" 2, 10 ,100,", "--classes") == [2, 10, 100]
    assert parse_int_list("5,5", "--clients") == [5]
    with pytest.raises(ConfigError):
        parse_int_list("1.5", "--classes")


def test_clients_hold_seeded_random_label_subsets():
    clients = make_clients(classes=100, clients=20, seed=0)
    assert clients == make_clients(classes=100, clients=20, seed=0)
    assert clients != make_clients(classes=100, clients=20, seed=1)
    assert len(clients) == 20
    for counts in clients:
        assert 1 <= len(counts) <= 100
        assert all(0 <= label < 100 and 1 <= count <= 1000 for label, count in counts.items())
    assert any(list(counts) != sorted(counts) for counts in clients)  # random mapping order
