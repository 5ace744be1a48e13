"""`stratify bench`: the checked steps benchmark, planning scale, batch and round costs.

Tiny budgets on digits: these tests check what the benchmarks compute and refuse, not
their timings (the figures are in docs/performance.md)."""

from __future__ import annotations

import json
import queue

import pytest
from conftest import assert_refused_in_one_line

from stratify.bench.plan import PlanCell, cell_process
from stratify.cli.main import main
from stratify.stratify import Stratify

STEPS_KEYS = {
    "eager_steps_per_s",
    "tuned_eager_steps_per_s",
    "engine_steps_per_s",
    "ratio",
    "tuned_ratio",
    "model_steps_per_s",
    "seeds",
    "workers",
    "weights_match",
    "compile_seconds",
}


def one_line_error(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as caught:
        main(list(args))
    assert caught.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    return lines[0]


def test_steps_bench_checks_the_weights_and_writes_the_issue_keys(tmp_path, capsys):
    path = tmp_path / "steps.json"
    main(
        ["bench", "steps", "--steps", "48", "--check-every", "16", "--compile", "off"]
        + ["--json", str(path)]
    )
    result = json.loads(path.read_text())
    assert set(result) == STEPS_KEYS
    assert result["weights_match"] is True
    assert result["compile_seconds"] is None  # nothing compiled
    assert (result["seeds"], result["workers"]) == ([0], 1)
    assert result["model_steps_per_s"] == result["engine_steps_per_s"]
    assert result["ratio"] == pytest.approx(
        result["engine_steps_per_s"] / result["eager_steps_per_s"]
    )
    assert result["tuned_ratio"] == pytest.approx(
        result["engine_steps_per_s"] / result["tuned_eager_steps_per_s"]
    )
    assert "weights match" in capsys.readouterr().out


def test_steps_bench_fails_when_the_engine_does_other_work(tmp_path, capsys, monkeypatch):
    original = Stratify.execute_single_sample

    def skips_a_step(self, context, samples):
        return original(self, context, samples[1:])

    monkeypatch.setattr(Stratify, "execute_single_sample", skips_a_step)
    path = tmp_path / "steps.json"
    message = one_line_error(
        capsys,
        "bench",
        "steps",
        "--steps",
        "48",
        "--check-every",
        "16",
        "--compile",
        "off",
        "--json",
        str(path),
    )
    assert "did not make the same updates" in message
    assert json.loads(path.read_text())["weights_match"] is False


@pytest.mark.slow
def test_steps_bench_runs_seeds_on_worker_processes(tmp_path):
    path = tmp_path / "steps.json"
    main(
        ["bench", "steps", "--steps", "32", "--check-every", "32", "--compile", "off"]
        + ["--seeds", "0..2", "--workers", "2", "--json", str(path)]
    )
    result = json.loads(path.read_text())
    assert (result["seeds"], result["workers"]) == ([0, 1, 2], 2)
    assert result["model_steps_per_s"] > 0
    assert result["model_steps_per_s"] != result["engine_steps_per_s"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--steps", "0"], "--steps"),
        (["--workers", "0"], "--workers"),
        (["--lr", "-1"], "--lr"),
        (["--dataset", "mnist-10k", "--data-dir", "/nonexistent"], "mnist"),
    ],
)
def test_steps_bench_refuses_bad_input_in_one_line(capsys, args, words):
    assert words in one_line_error(capsys, "bench", "steps", *args)


@pytest.mark.slow
def test_plan_bench_measures_each_cell_in_its_own_process(tmp_path, capsys):
    path = tmp_path / "plan.json"
    main(
        ["bench", "plan", "--dataset", "digits", "--partitions", "classes:2"]
        + ["--clients", "20", "--no-train", "--json", str(path)]
    )
    (measured,) = json.loads(path.read_text())
    assert (measured["partition"], measured["clients"]) == ("classes:2", 20)
    assert measured["samples"] == 1437 and measured["entries"] == 1440  # round(N / 10) x 10
    assert measured["pairs"] == 40  # every client holds 2 labels
    assert measured["plan_ms"] > 0 and measured["setup_ms"] > 0
    assert measured["peak_rss_mb"] >= measured["plan_rss_mb"] >= measured["data_rss_mb"] > 0
    assert "epoch_s" not in measured  # --no-train
    assert "classes:2" in capsys.readouterr().out


def test_a_plan_cell_that_cannot_be_built_becomes_a_row_with_the_reason():
    results = queue.Queue()
    cell = PlanCell("digits", None, (), "classes:2", 5000, None, 5, "uniform", False)
    cell_process(cell, results)
    row = results.get_nowait()
    assert row["clients"] == 5000 and "only 1437 samples" in row["error"]


def test_batch_bench_matches_a_plain_loop_on_the_same_batches(tmp_path):
    path = tmp_path / "batch.json"
    main(["bench", "batch", "--repeat", "1", "--json", str(path)])
    result = json.loads(path.read_text())
    assert result["weights_match"] is True and result["moved"] > 0
    assert result["batches"] == -(-result["samples"] // 64)  # ceil: the last batch is short
    assert result["overhead"] == pytest.approx(result["engine_s"] / result["plain_s"] - 1)


def test_rounds_bench_times_every_method_after_a_warm_up_round(tmp_path):
    path = tmp_path / "rounds.json"
    main(["bench", "rounds", "--rounds", "2", "--local-epochs", "1", "--json", str(path)])
    rows = json.loads(path.read_text())
    assert [row["algorithm"] for row in rows] == ["fedavg", "fedprox"]
    for row in rows:
        assert row["local_epochs"] == 1 and len(row["rounds_s"]) == 2
        assert row["round_s"] == pytest.approx(
            sorted(row["rounds_s"])[0] / 2 + sorted(row["rounds_s"])[1] / 2
        )


def test_bench_local_times_the_methods_that_declare_it_and_refuses_the_rest(capsys, tmp_path):
    from stratify.algorithms import ALGORITHMS, strategy_class
    from stratify.bench.local import local_methods

    declared = [name for name in ALGORITHMS if strategy_class(name).card.bench.benchmark_local]
    assert local_methods() == tuple(declared) and "fedavg" in declared
    # FedBSS runs in batch mode only: it has no single-sample jobs to time
    assert "fedbss" not in declared
    assert_refused_in_one_line(
        capsys,
        ["bench", "local", "--method", "fedbss", "--json", str(tmp_path / "b.json")],
        "unknown --method 'fedbss'",
        tmp_path / "b.json",
    )
