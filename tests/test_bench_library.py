"""The benchmarks as library functions (:mod:`stratify.bench`): settings in, a result
object out, nothing printed; the commands of ``stratify bench`` only draw it."""

from __future__ import annotations

import pytest

from stratify.bench.privacy import PrivacyResult, bench_privacy
from stratify.bench.steps import BenchmarkError, StepsResult, bench_steps
from stratify.bench.training import bench_rounds
from stratify.bench.transfers import bench_transfers
from stratify.errors import ConfigError, RegistryError


def test_transfers_returns_a_row_per_chunk_size_and_prints_nothing(capsys):
    result = bench_transfers("digits", [1, 5], seeds=(0, 1), clients=5)
    assert capsys.readouterr().out == ""
    assert [row["chunk"] for row in result.rows] == [1, 5]
    assert [len(row["runs"]) for row in result.rows] == [2, 2]
    first, second = result.rows
    assert first["reduction"] == 0.0
    assert second["reduction"] == pytest.approx(1 - second["transfers"] / first["transfers"])
    assert second["transfers"] < first["transfers"]  # longer chunks, fewer hand-overs
    assert result.to_json() == result.rows


def test_steps_returns_its_loops_and_the_json_of_the_command(capsys):
    result = bench_steps("digits", steps=32, check_every=16, compile_mode="off", seeds=(3,))
    assert capsys.readouterr().out == ""
    assert isinstance(result, StepsResult) and result.weights_match
    figures = result.to_json()
    assert figures["seeds"] == [3] and figures["workers"] == 1
    assert figures["ratio"] == pytest.approx(
        figures["engine_steps_per_s"] / figures["eager_steps_per_s"]
    )
    result.check()  # the loops agreed: nothing raised
    result.weights_match = False
    with pytest.raises(BenchmarkError, match="did not make the same updates"):
        result.check()


def test_the_library_checks_its_settings_with_the_command_line_s_messages():
    with pytest.raises(ConfigError, match="--seeds takes comma-separated seeds"):
        bench_steps("digits", seeds=(-1,))
    with pytest.raises(ConfigError, match="--steps must be a positive integer"):
        bench_steps("digits", steps=0)
    with pytest.raises(ConfigError, match="--rounds must be a positive integer"):
        bench_rounds("digits", ["fedavg"], rounds=0)
    with pytest.raises(ConfigError, match="--classes takes at most"):
        bench_privacy([10**6], [2], ["naive"])


def test_privacy_returns_verified_rows_and_its_check_fails_on_a_mismatch(monkeypatch):
    calls = []
    result = bench_privacy(
        [2], [2, 3], ["naive", "packed"], on_cell=lambda *cell: calls.append(cell)
    )
    assert isinstance(result, PrivacyResult)
    assert calls == [(2, 2, "naive"), (2, 2, "packed"), (2, 3, "naive"), (2, 3, "packed")]
    assert all(row["verified"] for row in result.rows) and result.failed == []
    assert all("speedup" in row for row in result.rows if row["protocol"] == "packed")
    result.check()
    result.rows[0]["verified"] = False
    with pytest.raises(RegistryError, match="2x2 naive"):
        result.check()
