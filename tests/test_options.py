"""Option fields: per-mode defaults and one-line default overrides in subclasses."""

import dataclasses

import pytest

from stratify.errors import ConfigError
from stratify.options import StrategyOptions, inherit, option
from stratify.validation import check_positive_int


@dataclasses.dataclass
class ParentOptions(StrategyOptions):
    steps: int | None = option(
        None, "Steps.", check=check_positive_int, cli_type=int, per_mode={"batch": 8}
    )
    width: int = option(4, "Width.", check=check_positive_int, modes=("batch",))


@dataclasses.dataclass
class ChildOptions(ParentOptions):
    width: int = inherit(16)
    steps: int | None = inherit(per_mode={"single-sample": 2})


def test_per_mode_default_fills_only_an_unset_value():
    assert ParentOptions().for_mode("batch").steps == 8
    assert ParentOptions().for_mode("single-sample").steps is None
    assert ParentOptions(steps=3).for_mode("batch").steps == 3


def test_inherit_changes_the_default_and_keeps_help_check_and_modes():
    parent = {field.name: field for field in dataclasses.fields(ParentOptions)}
    child = {field.name: field for field in dataclasses.fields(ChildOptions)}
    assert ChildOptions().width == 16 and ParentOptions().width == 4
    for name in ("width", "steps"):
        for key in ("help", "check", "modes", "type", "choices"):
            assert child[name].metadata[key] == parent[name].metadata[key]
    # field order stays the parent's, so positional construction is unchanged
    assert [field.name for field in dataclasses.fields(ChildOptions)] == ["steps", "width"]
    # per_mode merges: the child adds single-sample and keeps the parent's batch default
    assert ChildOptions().for_mode("single-sample").steps == 2
    assert ChildOptions().for_mode("batch").steps == 8
    with pytest.raises(ConfigError, match="--width"):
        ChildOptions(width=0)


def test_inherit_without_a_parent_field_is_a_type_error():
    with pytest.raises(TypeError, match="needs an option of a parent class"):

        @dataclasses.dataclass
        class Orphan(StrategyOptions):
            missing: int = inherit(3)


def test_the_baselines_inherited_defaults_resolve_as_their_papers_set_them():
    from stratify.baselines.fedavg import FedAvgOptions
    from stratify.baselines.fedtan import FedTANOptions
    from stratify.baselines.sfl import SFLOptions

    fedavg = FedAvgOptions().for_mode("batch")
    assert (fedavg.local_epochs, fedavg.local_momentum, fedavg.local_batch_size) == (10, 0.9, 64)
    single = FedAvgOptions().for_mode("single-sample")
    assert (single.local_epochs, single.local_momentum, single.local_batch_size) == (1, 0.0, 1)
    fedtan = FedTANOptions().for_mode("batch")
    assert (fedtan.local_momentum, fedtan.local_weight_decay, fedtan.local_batch_size) == (
        0.9,
        1e-4,
        128,
    )
    assert SFLOptions().for_mode("batch").local_batch_size == 20
    assert SFLOptions().for_mode("single-sample").local_batch_size == 1
