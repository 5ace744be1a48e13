"""The benchmarks take their defaults from the library instead of restating them."""

from __future__ import annotations

import json

import click

from stratify.cli.bench import bench
from stratify.cli.bench_privacy import privacy
from stratify.cli.main import main
from stratify.config import TrainConfig, resolve_lr
from stratify.options import option_default
from stratify.stratify import StratifyOptions

#: bench flags that deliberately differ from `stratify train`'s, with the reason
DELIBERATE = {
    # planning and speed figures are measured on a Dirichlet split, not the #C=1 default
    "partition",
    # the engine is timed compiled: `auto` would stay eager over a benchmark's few steps
    "compile",
}
#: benchmarks that measure on mnist-10k (planning cost, transfers) rather than digits
MEASURED_ON = {("transfers", "dataset"), ("plan", "dataset")}
#: `bench local` times a table1 cell (FedAvg on mnist-10k): a baseline's local training,
#: which Stratify (train's default) has not
MEASURED_ON |= {("local", "algorithm"), ("local", "dataset")}


def flag_defaults(command: click.Command) -> dict[str, object]:
    return {
        parameter.name: parameter.default
        for parameter in command.params
        if isinstance(parameter, click.Option) and parameter.name
    }


def test_every_bench_flag_named_like_a_library_option_has_its_default_or_none():
    library = {entry.name: entry.default for entry in TrainConfig.flag_fields()}
    library.update((entry.name, entry.default) for entry in StratifyOptions.option_fields())
    assert isinstance(bench, click.Group)
    checked = []
    for name, command in bench.commands.items():
        for flag, default in flag_defaults(command).items():
            if flag not in library or flag in DELIBERATE or (name, flag) in MEASURED_ON:
                continue
            # None: resolved by the library as in `stratify train` (lr, model, norm)
            assert default in (library[flag], None), (name, flag, default, library[flag])
            checked.append((name, flag))
    # the flags this test exists for are among those compared
    for pair in [
        ("plan", "chunk"),
        ("plan", "selection"),
        ("batch", "batch_labels"),
        ("batch", "batch_path"),
        ("batch", "lr"),
        ("steps", "lr"),
        ("steps", "clients"),
        ("steps", "device"),
    ]:
        assert pair in checked
    assert flag_defaults(bench.commands["batch"])["model_name"] is None
    assert flag_defaults(bench.commands["steps"])["device"] == "auto"


def test_option_default_reads_the_declared_default_and_the_mode_s_one():
    from stratify.baselines.fedavg import FedAvgOptions

    assert option_default(StratifyOptions, "chunk") == 5
    assert option_default(TrainConfig, "clients") == 10
    # FedAvg's local epochs: NIID-Bench's 10 in batch mode, one pass in single-sample mode
    assert option_default(FedAvgOptions, "local_epochs", "batch") == 10
    assert option_default(FedAvgOptions, "local_epochs", "single-sample") == 1


def test_bench_privacy_offers_the_registry_s_protocols():
    from stratify.bench.privacy import parse_protocols
    from stratify.registry.base import PROTOCOLS

    protocol = next(p for p in privacy.params if p.name == "protocol_text")
    assert protocol.default == "all"
    assert parse_protocols("all") == list(PROTOCOLS)


def test_batch_bench_without_lr_trains_at_the_library_s_rate_for_the_dataset(tmp_path, capsys):
    # the rate a batch-mode Stratify run on the digits resolves (its own, from the defaults
    # grid), not the 0.01 the bench used to hard-code
    rate = resolve_lr(TrainConfig(algorithm="stratify", mode="batch", secure=False))
    assert rate != 0.01
    path = tmp_path / "batch.json"
    main(["bench", "batch", "--repeat", "1", "--json", str(path)])
    result = json.loads(path.read_text())
    assert result["lr"] == rate
    assert f"lr {rate:g}" in capsys.readouterr().out
    main(["bench", "batch", "--repeat", "1", "--lr", "0.02", "--json", str(path)])
    assert json.loads(path.read_text())["lr"] == 0.02


def test_steps_bench_without_lr_or_model_uses_the_library_s(capsys):
    main(["bench", "steps", "--steps", "16", "--check-every", "16", "--compile", "off"])
    out = capsys.readouterr().out
    # single-sample on digits: the rate a run of Stratify resolves (its own, from the card)
    rate = resolve_lr(TrainConfig(dataset="digits", mode="single-sample"))
    assert f"digits · cnn · lr {rate:g}" in out
