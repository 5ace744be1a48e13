"""Dataset loaders declare their options with the option fields of `stratify.options`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from stratify.data.datasets import DATASETS, dataset_options, load_dataset
from stratify.errors import ConfigError, DatasetError
from stratify.options import DatasetOptions, dataset_option, inherit


@dataclass
class Shapes(DatasetOptions):
    size: int = dataset_option(8, "Side in pixels.", minimum=1)
    angles: tuple[float, ...] = dataset_option((0, 90), "Angles.", maximum=360)
    kind: str = dataset_option("square", "Which shape.", choices=("square", "disc"))


@dataclass
class SmallShapes(Shapes):
    size: int = inherit(4)


def test_every_loader_declares_a_dataset_options_class_of_option_fields():
    for name, loader in DATASETS.items():
        assert issubclass(loader.options_class, DatasetOptions), name
        fields = dataclasses.fields(loader.options_class)
        # every field is an option (help, check, choices): no second declaration system
        assert all("help" in field.metadata for field in fields), name
        assert list(dataset_options(name)) == [field.name for field in fields], name


def test_dataset_options_built_in_python_are_converted_and_checked():
    options = Shapes(size="12", angles="0, 45", kind="disc")
    assert (options.size, options.angles, options.kind) == (12, (0.0, 45.0), "disc")
    assert options.to_dict() == {"size": 12, "angles": (0.0, 45.0), "kind": "disc"}
    with pytest.raises(ConfigError) as caught:
        Shapes(size=0)
    assert str(caught.value) == "option size=0 is out of range; size must be >= 1"
    with pytest.raises(ConfigError) as caught:
        Shapes(angles="10,400")
    assert str(caught.value) == "option angles=400.0 is out of range; angles must be <= 360"
    with pytest.raises(ConfigError) as caught:
        Shapes(kind="star")
    assert str(caught.value) == "unknown kind 'star'; choose one of square, disc"


def test_a_subclass_changes_an_inherited_dataset_option_in_one_line():
    assert SmallShapes().size == 4 and Shapes().size == 8
    size = {field.name: field for field in dataclasses.fields(SmallShapes)}["size"]
    assert size.metadata["help"] == "Side in pixels."
    with pytest.raises(ConfigError, match="size must be >= 1"):
        SmallShapes(size=-1)  # the parent's check is kept


def test_none_means_not_given_and_takes_the_default():
    data = load_dataset("synthetic", n_train=40, n_test=None, num_features=3)
    assert len(data.x_train) == 40 and len(data.x_test) == 500  # n_test's default


def test_a_bad_option_is_refused_before_the_loader_runs(monkeypatch):
    loader = DATASETS["colored-mnist"]

    def must_not_run(*args, **kwargs):
        raise AssertionError("the loader ran")

    monkeypatch.setattr(loader, "load", must_not_run)
    with pytest.raises(DatasetError) as caught:
        load_dataset("colored-mnist", data_dir="/nonexistent", correlation="2")
    assert str(caught.value) == (
        "colored-mnist: option correlation=2.0 is out of range; correlation must be in [0, 1]"
    )
