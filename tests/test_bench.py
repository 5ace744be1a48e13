"""`stratify bench`: the checked steps benchmark, planning scale, batch and round costs.

Tiny budgets on digits: these tests check what the benchmarks compute and refuse, not
their timings (the figures are in the README)."""

from __future__ import annotations

import json

import pytest

from stratify.cli.main import main
from stratify.strategy import Stratify

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
    assert (result["seeds"], result["workers"]) == (1, 1)
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


def test_steps_bench_runs_seeds_on_worker_processes(tmp_path):
    path = tmp_path / "steps.json"
    main(
        ["bench", "steps", "--steps", "32", "--check-every", "32", "--compile", "off"]
        + ["--seeds", "3", "--workers", "2", "--json", str(path)]
    )
    result = json.loads(path.read_text())
    assert (result["seeds"], result["workers"]) == (3, 2)
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
