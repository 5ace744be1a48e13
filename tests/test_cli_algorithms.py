"""`stratify methods` and the train command's refusals of baseline options."""

import json

import pytest

from stratify.algorithms import ALGORITHMS, strategy_class
from stratify.cli.main import main
from stratify.config import TrainConfig
from stratify.errors import ConfigError


def test_methods_lists_every_method_with_its_description(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    main(["methods"])
    out = capsys.readouterr().out
    for name in ALGORITHMS:
        assert name in out
        assert strategy_class(name).card.identity.description in out
    assert "--mu 0.01" in out and "--server-momentum 0.9" in out


def test_every_algorithm_has_a_one_line_description():
    for name in ALGORITHMS:
        description = strategy_class(name).card.identity.description
        assert description and "\n" not in description and len(description) <= 100


DIGITS = ["train", "--dataset", "digits", "--epochs", "1", "--no-secure"]


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--algorithm", "fedsgd"], "unknown --algorithm 'fedsgd'; choose one of stratify, fedavg"),
        (["--mode", "online"], "unknown --mode 'online'; choose one of single-sample, batch"),
        (["--chunk", "3", "--mode", "batch"], "--chunk applies to --mode single-sample, not batch"),
        (["--batch-labels", "8"], "--batch-labels applies to --mode batch, not single-sample"),
        (["--batch-path", "fast", "--mode", "batch"], "unknown --batch-path 'fast'; choose one"),
        (["--chunk", "zero"], "--chunk must be a positive integer, got 'zero'"),
        (["--epochs", "0"], "--epochs must be a positive integer, got 0"),
        (["--lr", "-1"], "--lr must be a positive finite number"),
        (["--no-such-flag"], "No such option '--no-such-flag'"),
        (["--mu", "0.1"], "--mu does not apply to --algorithm stratify"),
        (["--algorithm", "fedavg", "--mu", "0.1"], "--mu does not apply to --algorithm fedavg"),
        (["--algorithm", "sfl", "--bn-buffers", "local"], "--bn-buffers does not apply"),
        (
            ["--algorithm", "fedtan", "--mode", "batch", "--bn-buffers", "local"],
            "--bn-buffers does not apply",
        ),
        (["--algorithm", "fedtan"], "--algorithm fedtan runs in --mode batch, not single-sample"),
        (["--model", "resnet9"], "in --mode single-sample use --norm gn (or none)"),
        (["--algorithm", "fedavg", "--local-epochs", "0"], "--local-epochs must be a positive"),
        (
            ["--algorithm", "fedprox", "--local-batch-size", "-1", "--mode", "batch"],
            "--local-batch-size must be a positive",
        ),
        (["--algorithm", "scaffold", "--client-fraction", "1.5"], "--client-fraction must be in"),
        (["--algorithm", "fedavg", "--local-batch-size", "8"], "does not fit --mode single-sample"),
        (["--algorithm", "fedtan", "--mode", "batch"], "fedtan needs a model with BatchNorm"),
    ],
)
def test_bad_baseline_input_is_one_line(tmp_path, capsys, arguments, message):
    with pytest.raises(SystemExit) as exit_info:
        main([*DIGITS, "--out", str(tmp_path / "run"), *arguments])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


@pytest.mark.parametrize(
    "values, message",
    [
        ({"algorithm": "fedsgd"}, "unknown --algorithm 'fedsgd'; choose one of stratify, fedavg"),
        ({"mode": "online"}, "unknown --mode 'online'; choose one of single-sample, batch"),
        ({"mode": "batch", "options": {"chunk": 3}}, "--chunk applies to --mode single-sample"),
        ({"options": {"mu": 0.1}}, "--mu does not apply to --algorithm stratify; its options"),
        ({"epochs": 0}, "--epochs must be a positive integer, got 0"),
    ],
)
def test_library_refuses_options_with_the_cli_message(values, message):
    with pytest.raises(ConfigError) as error:
        TrainConfig(**values)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_method_registered_at_run_time_is_configured_like_the_built_in_ones(monkeypatch):
    # the registry is read when a configuration is checked, not when TrainConfig is defined
    with pytest.raises(ConfigError, match="unknown --algorithm 'fedavg-copy'"):
        TrainConfig(algorithm="fedavg-copy", mode="batch")
    monkeypatch.setitem(ALGORITHMS, "fedavg-copy", "stratify.baselines.fedavg:FedAvg")
    config = TrainConfig(algorithm="fedavg-copy", mode="batch", options={"local_epochs": 2})
    assert config.algorithm == "fedavg-copy" and config.options == {"local_epochs": 2}


def test_unknown_option_names_the_valid_ones(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([*DIGITS, "--out", str(tmp_path / "run"), "--algorithm", "sfl", "--mu", "1"])
    err = capsys.readouterr().err
    assert "its options are: --local-epochs, --local-batch-size" in err


def test_train_cli_runs_a_baseline(tmp_path, capsys):
    out = tmp_path / "scaffold"
    main(
        [
            *DIGITS[:-3],
            "--epochs",
            "2",
            "--no-secure",
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
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    best = max(rows, key=lambda row: row["test_accuracy"])
    assert summary["algorithm"] == "scaffold" and len(rows) == 2
    assert (summary["best_epoch"], summary["best_accuracy"]) == (
        best["epoch"],
        best["test_accuracy"],
    )
    assert summary["total_transfers"] == 40  # 2 rounds × 10 clients × (download + upload)
    config = json.loads((out / "config.json").read_text())
    assert config["options"] == {"local_batch_size": 32, "server_lr": 1.0}


def test_a_method_default_lr_is_used_when_no_lr_is_given_and_an_lr_overrides_it():
    from stratify.baselines.fedavg import FedAvg
    from stratify.card import Identity, Rates
    from stratify.config import TrainConfig
    from stratify.experiment import build_experiment

    class SlowFedAvg(FedAvg):
        card = FedAvg.card.derive(
            Identity("slow-fedavg", "Slow FedAvg"), rates=Rates(paper_lr=0.002)
        )

    config = TrainConfig(
        dataset="digits", partition="iid", clients=2, secure=False, algorithm="fedavg", mode="batch"
    )
    assert build_experiment(config, strategy=SlowFedAvg()).lr == 0.002
    # FedAvg's own rate on the digits in batch mode (its class declares it; the variant
    # above does not inherit it)
    assert build_experiment(config).lr == FedAvg.card.rates.tuned["digits", "batch"]
    given = TrainConfig(
        dataset="digits",
        partition="iid",
        clients=2,
        secure=False,
        algorithm="fedavg",
        mode="batch",
        lr=0.3,
    )
    assert build_experiment(given, strategy=SlowFedAvg()).lr == 0.3
