"""`--model` and `--norm` are choices, checked (with their compatibility) before any data
is read."""

from __future__ import annotations

import time

import click
import pytest

from stratify.cli.main import main
from stratify.config import TrainConfig
from stratify.data.datasets import DATASETS
from stratify.errors import ConfigError, DatasetError

#: seconds the monkeypatched loader takes before it gives up
SLOW = 2.0


@pytest.fixture
def slow_loader(monkeypatch):
    """``synthetic`` made a loader that takes seconds and records that it ran."""
    calls = []

    def load(*args, **kwargs):
        calls.append(time.perf_counter())
        time.sleep(SLOW)
        raise DatasetError("the slow loader ran to its end")

    monkeypatch.setattr(DATASETS["synthetic"], "load", load)
    return calls


def train(tmp_path, capsys, *arguments: str) -> tuple[str, float]:
    started = time.perf_counter()
    with pytest.raises(SystemExit) as caught:
        main(["train", "--dataset", "synthetic", "--out", str(tmp_path / "run"), *arguments])
    elapsed = time.perf_counter() - started
    assert caught.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0], elapsed


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--model", "nope"], "unknown --model 'nope'; choose one of cnn, mlp, resnet9"),
        (["--norm", "ln"], "unknown --norm 'ln'; choose one of bn, gn, sumbn"),
        (["--model", "cnn", "--norm", "bn"], "model 'cnn' has no normalisation layers"),
        (["--norm", "sumbn", "--mode", "batch"], "the default model (cnn for images"),
        (["--model", "resnet9"], "in --mode single-sample use --norm gn (or none)"),
        (["--model", "resnet20", "--norm", "sumbn"], "normalises with batch statistics"),
    ],
)
def test_a_bad_model_or_norm_fails_at_once_loading_nothing(
    tmp_path, capsys, slow_loader, arguments, message
):
    line, elapsed = train(tmp_path, capsys, *arguments)
    assert message in line
    assert slow_loader == [] and elapsed < SLOW
    assert not (tmp_path / "run").exists()


def test_a_good_model_and_norm_reach_the_slow_loader(tmp_path, capsys, slow_loader):
    # the control: the same command with a valid model does load (and pays for it)
    line, elapsed = train(tmp_path, capsys, "--model", "resnet9", "--norm", "gn")
    assert line == "error: the slow loader ran to its end"
    assert len(slow_loader) == 1 and elapsed >= SLOW


@pytest.mark.parametrize(
    "values, message",
    [
        ({"model": "vgg"}, "unknown --model 'vgg'; choose one of cnn, mlp, resnet9"),
        ({"norm": "layer"}, "unknown --norm 'layer'; choose one of bn, gn"),
        ({"model": "mlp", "norm": "gn"}, "model 'mlp' has no normalisation layers"),
        ({"model": "resnet18"}, "model 'resnet18' with norm 'bn' normalises with batch"),
    ],
)
def test_train_config_refuses_them_with_the_cli_s_line(values, message):
    with pytest.raises(ConfigError) as caught:
        TrainConfig(**values)
    assert message in str(caught.value)


def test_valid_pairs_are_accepted():
    assert TrainConfig(model="resnet9", norm="gn").norm == "gn"
    assert TrainConfig(model="resnet9", mode="batch").norm is None  # bn, the model's own
    assert TrainConfig(model="cnn", norm="none").model == "cnn"


def test_train_help_lists_the_choices():
    from stratify.cli.train import train as command

    options = {parameter.name: parameter for parameter in command.params}
    for name in ("model", "norm"):
        assert isinstance(options[name].type, click.Choice), name
    assert list(options["model"].type.choices) == ["cnn", "mlp", "resnet9", "resnet18", "resnet20"]


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["steps", "--model", "nope"], "unknown --model 'nope'"),
        (["steps", "--model", "resnet9"], "in --mode single-sample use --norm gn"),
        (["batch", "--model", "cnn", "--norm", "bn"], "model 'cnn' has no normalisation"),
    ],
)
def test_bench_refuses_them_before_loading(capsys, slow_loader, arguments, message):
    with pytest.raises(SystemExit) as caught:
        main(["bench", *arguments, "--dataset", "synthetic"])
    assert caught.value.code == 2
    assert message in capsys.readouterr().err
    assert slow_loader == []
