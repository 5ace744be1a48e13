"""`stratify algorithms` and the train command's refusals of baseline options."""

import json

import pytest

from cli.main import main
from stratify.algorithms import ALGORITHMS, strategy_class


def test_algorithms_lists_every_algorithm_with_its_description(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    main(["algorithms"])
    out = capsys.readouterr().out
    for name in ALGORITHMS:
        assert name in out
        assert strategy_class(name).description in out
    assert "--mu 0.01" in out and "--server-momentum 0.9" in out


def test_every_algorithm_has_a_one_line_description():
    for name in ALGORITHMS:
        description = strategy_class(name).description
        assert description and "\n" not in description and len(description) <= 100


DIGITS = ["train", "--dataset", "digits", "--epochs", "1", "--no-secure"]


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--algorithm", "fedsgd"], "unknown algorithm 'fedsgd'"),
        (["--mu", "0.1"], "--mu does not apply to --algorithm stratify"),
        (["--algorithm", "fedavg", "--mu", "0.1"], "--mu does not apply to --algorithm fedavg"),
        (["--algorithm", "sfl", "--bn-buffers", "local"], "--bn-buffers does not apply"),
        (["--algorithm", "fedtan", "--bn-buffers", "local"], "--bn-buffers does not apply"),
        (["--algorithm", "fedavg", "--local-epochs", "0"], "--local-epochs must be a positive"),
        (
            ["--algorithm", "fedprox", "--local-batch-size", "-1", "--mode", "batch"],
            "--local-batch-size must be a positive",
        ),
        (["--algorithm", "scaffold", "--client-fraction", "1.5"], "--client-fraction must be in"),
        (["--algorithm", "fedavg", "--local-batch-size", "8"], "does not fit --mode single-sample"),
        (["--algorithm", "fedtan"], "fedtan needs a model with BatchNorm layers"),
    ],
)
def test_bad_baseline_input_is_one_line(tmp_path, capsys, arguments, message):
    with pytest.raises(SystemExit) as exit_info:
        main([*DIGITS, "--out", str(tmp_path / "run"), *arguments])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_train_cli_runs_a_baseline(tmp_path, capsys):
    out = tmp_path / "scaffold"
    main(
        [
            *DIGITS,
            "--out",
            str(out),
            "--algorithm",
            "scaffold",
            "--mode",
            "batch",
            "--local-batch-size",
            "32",
            "--server-lr",
            "1.0",
        ]
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithm"] == "scaffold" and summary["best_epoch"] == 1
    assert summary["total_transfers"] == 20  # 10 clients × (download + upload)
    config = json.loads((out / "config.json").read_text())
    assert config["options"] == {"local_batch_size": 32, "server_lr": 1.0}
