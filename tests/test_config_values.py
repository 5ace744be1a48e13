"""The library's configuration classes refuse a bad value when they are made, as one
StratifyError line naming the setting, never accept it to fail later or fail with a
Python exception of their own (issue 31, item 10; StreamConfig has its own tests)."""

import math
from pathlib import Path

import pytest

from stratify.algorithms import ALGORITHMS, strategy_class
from stratify.config import TrainConfig
from stratify.errors import StratifyError
from stratify.parallel import LocalBackend, RayBackend, RunSpec
from stratify.reproduce.grids import Settings
from stratify.reproduce.tuning import Tuning


def assert_refused(make, match):
    with pytest.raises(StratifyError) as error:
        make()
    message = str(error.value)
    assert match in message and "\n" not in message, message


TRAIN_CONFIG = [
    ("dataset", 3, "--dataset must be non-empty text, got 3"),
    ("dataset", "", "--dataset must be non-empty text"),
    ("data_dir", 5, "--data-dir must be a path, got 5"),
    ("partition", "stripes", "unknown partition 'stripes'"),
    ("partition", 2, "--partition must be non-empty text, got 2"),
    ("model", "vgg", "unknown --model 'vgg'; choose one of cnn, mlp, resnet9"),
    ("model", 3, "unknown --model 3"),
    ("norm", "layer", "unknown --norm 'layer'; choose one of bn, gn"),
    ("secure", "yes", "--secure must be True or False, got 'yes'"),
    ("secure", 1, "--secure must be True or False, got 1"),
    ("seed", None, "--seed must be given (default 0), got None"),
    ("clients", None, "--clients must be given (default 10), got None"),
    ("epochs", None, "--epochs must be given"),
    ("validation", None, "--validation must be given"),
    ("device", None, "--device must be given"),
    ("protocol", None, "--protocol must be given"),
    ("mlp_hidden", b"x", "--mlp-hidden takes comma-separated positive integers"),
    ("mlp_hidden", {"a": 1}, "--mlp-hidden takes comma-separated positive integers"),
    ("options", None, "options must be a dictionary of option names to values, got None"),
    ("options", [1], "options must be a dictionary"),
    ("options", {1: 2}, "options must be a dictionary"),
    ("dataset_options", "n_train=5", "dataset_options must be a dictionary"),
    ("out", 3, "--out must be a path, got 3"),
    ("out", "", "--out needs a folder name, got an empty one"),
]


@pytest.mark.parametrize("name, value, message", TRAIN_CONFIG)
def test_train_config_refuses_each_bad_value(name, value, message):
    assert_refused(lambda: TrainConfig(**{name: value}), message)


def test_train_config_checks_the_dataset_options_of_a_known_dataset():
    assert_refused(
        lambda: TrainConfig(dataset="synthetic", dataset_options={"nope": 1}),
        "synthetic has no option 'nope'",
    )
    assert_refused(
        lambda: TrainConfig(dataset="synthetic", dataset_options={"n_train": 0}), "n_train=0"
    )
    # a caller's own dataset (a stream's buffers) declares none here: not refused
    TrainConfig(dataset="my-data", dataset_options={"anything": 1})


def test_train_config_takes_paths_and_keeps_valid_values():
    config = TrainConfig(out=Path("runs") / "a", data_dir=Path("data"), secure=False)
    assert (config.out, config.data_dir, config.secure) == ("runs/a", "data", False)
    assert TrainConfig(mlp_hidden=[8, 4], model="mlp").mlp_hidden == (8, 4)


def given_defaults():
    """``(options class, field)`` of every method option whose default is not None."""
    for algorithm in ALGORITHMS:
        options = strategy_class(algorithm).options_class
        for entry in options.option_fields():
            if entry.default is not None:
                yield pytest.param(options, entry.name, id=f"{algorithm}-{entry.name}")


@pytest.mark.parametrize("options, name", list(given_defaults()))
def test_a_method_option_with_a_default_refuses_none(options, name):
    assert_refused(lambda: options(**{name: None}), f"--{name.replace('_', '-')} must be given")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"name": None}, "a run's name must be non-empty text, got None"),
        ({"name": ""}, "a run's name must be non-empty text"),
        ({"config": "x"}, "run a: config must be a TrainConfig, got str"),
        ({"policy": "sometimes"}, "unknown run policy 'sometimes'"),
        ({"keep_corrupt": "yes"}, "run a: keep_corrupt must be True or False"),
    ],
)
def test_run_spec_refuses_each_bad_value(changes, message):
    values = {"name": "a", "config": TrainConfig(out="x"), **changes}
    assert_refused(lambda: RunSpec(**values), message)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"dataset": "nope"}, "unknown dataset 'nope'"),
        ({"dataset": 3}, "--dataset must be non-empty text, got 3"),
        ({"data_dir": 3}, "--data-dir must be a path, got 3"),
        ({"dataset_options": "a=1"}, "dataset options must be a dictionary"),
        ({"epochs": 0}, "--epochs must be a positive integer, got 0"),
        ({"epochs": 1.5}, "--epochs must be a positive integer, got 1.5"),
        ({"seeds": None}, "--seeds takes comma-separated seeds"),
        ({"seeds": (0, 0)}, "--seeds names seed 0 twice"),
        ({"seeds": (-1,)}, "--seeds takes comma-separated seeds"),
        ({"clients": math.nan}, "--clients must be a positive integer, got nan"),
        ({"clients": True}, "--clients must be a positive integer, got True"),
        ({"methods": "fedavg"}, "--methods takes method names, got 'fedavg'"),
        ({"methods": (1,)}, "--methods takes method names"),
        ({"model": "vgg"}, "unknown --model 'vgg'"),
        ({"secure": "no"}, "--secure must be True or False, got 'no'"),
        ({"device": "tpu"}, "unknown --device 'tpu'"),
    ],
)
def test_grid_settings_refuse_each_bad_value(changes, message):
    assert_refused(lambda: Settings(**changes), message)


def test_grid_settings_keep_their_values_typed():
    settings = Settings(seeds="3,1", clients="4", epochs="2", methods=["fedavg"])
    assert (settings.seeds, settings.clients, settings.epochs) == ((3, 1), 4, 2)
    assert settings.methods == ("fedavg",)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"factors": "0.5,2"}, "--tune-factors takes a list of factors, got '0.5,2'"),
        ({"factors": 3}, "--tune-factors takes a list of factors, got 3"),
        ({"factors": b"x"}, "--tune-factors takes a list of factors"),
        ({"factors": (0.5, math.inf)}, "--tune-factors must be a positive finite number"),
        ({"validation": 1.0}, "--validation must be in [0, 1), got 1.0"),
        ({"epochs": 0}, "--tune-epochs must be a positive integer"),
    ],
)
def test_tuning_refuses_each_bad_value(changes, message):
    assert_refused(lambda: Tuning(**changes), message)


@pytest.mark.parametrize("workers", [0, 1.5, math.nan, True, "abc", [2]])
def test_local_backend_refuses_a_worker_count_that_is_not_one(workers):
    assert_refused(lambda: LocalBackend(workers), "--workers must be a positive integer")


@pytest.mark.parametrize(
    "address, message",
    [
        (3, "--address must be text, got 3"),
        ("head", "--address 'head' is not host:port, ray://host:port, auto or local"),
        ("head:99999", "--address 'head:99999' is not host:port"),
        ("ray://:10001", "--address 'ray://:10001' is not host:port"),
    ],
)
def test_ray_backend_refuses_an_address_it_cannot_use(address, message):
    assert_refused(lambda: RayBackend(address), message)
