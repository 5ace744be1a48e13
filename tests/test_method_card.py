"""A method's card (stratify/card.py) and the small Strategy around it
(docs/architecture.md, "Strategy interface")."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from stratify.algorithms import ALGORITHMS, build_strategy, strategy_class
from stratify.baselines.fedavg import FedAvg
from stratify.card import UNTUNED, Comparison, Identity, MethodCard, Paper, Rates
from stratify.cli.methods import methods
from stratify.method import (
    Budgeted,
    Strategy,
    Vectorizable,
    informative_epochs,
    planned_sample_gradients,
    step_terms,
)

PACKAGE = Path(__file__).resolve().parents[1] / "stratify"
#: the most public members Strategy may have (issue 56)
MOST_MEMBERS = 15


def public_members(cls: type) -> set[str]:
    """``cls``'s public names, inherited from ``object`` left out, annotated class
    attributes without a value (``card: ClassVar[MethodCard]``) counted."""
    names = set(dir(cls)) | set(vars(cls).get("__annotations__", {}))
    return {name for name in names - set(dir(object)) if not name.startswith("_")}


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any level of its source."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_strategy_has_few_public_members():
    members = public_members(Strategy)
    assert len(members) <= MOST_MEMBERS, sorted(members)
    # the counting sees what a method declares: its card and options
    assert {"card", "options_class", "configure_rounds", "fit", "aggregate"} <= members


def test_the_optional_interfaces_are_named_and_outside_strategy():
    members = public_members(Strategy)
    assert not members & (public_members(Vectorizable) | public_members(Budgeted))
    assert issubclass(FedAvg, Vectorizable) and issubclass(FedAvg, Budgeted)
    stratify = strategy_class("stratify")
    assert issubclass(stratify, Vectorizable) and not issubclass(stratify, Budgeted)
    # a method without an interface is answered for: no budget, no job form, one epoch
    strategy = stratify(chunk=2)
    assert planned_sample_gradients(strategy, [10, 20]) is None
    assert informative_epochs(strategy) == 1
    assert step_terms(strategy, "single-sample") is not None
    # FedAvg in batch mode: 3 clients, 10 local epochs over a mean of 32 samples
    fedavg = build_strategy("fedavg", {}, "batch")
    assert planned_sample_gradients(fedavg, [20, 32, 44]) == 3 * 10 * 32


@pytest.mark.parametrize("module", ["method.py", "card.py"])
def test_the_method_api_and_the_card_import_no_data_code(module):
    imported = imported_modules(PACKAGE / module)
    assert not {name for name in imported if name.startswith("stratify.data")}, imported


def test_the_card_imports_no_torch():
    imported = imported_modules(PACKAGE / "card.py")
    assert not {name for name in imported if name.split(".")[0] == "torch"}, imported


def test_every_registered_method_s_card_names_it():
    for name in ALGORITHMS:
        card = strategy_class(name).card
        assert isinstance(card, MethodCard) and card.name == name


def test_a_card_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        FedAvg.card.identity.label = "other"  # type: ignore[misc]


def test_a_card_refuses_a_method_without_a_comparator_or_a_reason():
    with pytest.raises(ValueError, match="no_comparator"):
        Comparison()
    with pytest.raises(ValueError, match="modes"):
        Identity("x", "X", modes=("streaming",))


def test_an_untuned_method_says_so_and_stratify_methods_prints_it():
    fedtan = strategy_class("fedtan")
    assert fedtan.card.rates.tuned is None
    assert fedtan.card.rates.describe() == UNTUNED
    assert fedtan().lr_for("batch", family="digits", dataset="digits") is None
    listed = CliRunner().invoke(methods, ["--markdown"])
    (row,) = [line for line in listed.output.splitlines() if line.startswith("| `fedtan` |")]
    assert "`--lr` untuned: the dataset's" in row
    (fedavg,) = [line for line in listed.output.splitlines() if line.startswith("| `fedavg` |")]
    assert UNTUNED not in fedavg


def test_a_tuned_method_shows_only_its_modes_rates():
    rates = Rates(tuned={("digits", "batch"): 0.1, ("digits", "single-sample"): 0.03})
    assert rates.describe(("batch",)) == "0.1 on digits (batch)"
    assert rates.describe() == "0.1 on digits (batch), 0.03 on digits (single-sample)"
    assert Rates(tuned={("digits", "batch"): 0.1}).describe(("single-sample",)) == UNTUNED
    assert rates.tuned_for("digits", "batch") == 0.1 and rates.tuned_for("mnist", "batch") is None


def test_a_derived_card_keeps_the_parent_s_settings_but_not_its_tuned_rates():
    parent = strategy_class("fedbss").card
    assert parent.rates.tuned and parent.paper.settings
    child = parent.derive(Identity("child", "Child", modes=("batch",)))
    assert child.name == "child" and child.label == "Child"
    assert child.comparison == parent.comparison
    assert child.testing == parent.testing and child.bench == parent.bench
    assert child.rates.tuned is None and child.rates.paper_lr == parent.rates.paper_lr
    assert child.paper.settings == () and not child.flower
    # what the variant gives replaces the parent's
    own = Rates(tuned={("digits", "batch"): 0.2})
    assert parent.derive(Identity("child", "Child"), rates=own).rates == own
    tan = strategy_class("fedtan").card.derive(Identity("child", "Child", modes=("batch",)))
    assert tan.paper == Paper(requires_batch_norm=True)
    assert not FedAvg.card.derive(Identity("child", "Child")).flower and FedAvg.card.flower


def test_a_subclass_without_a_card_of_its_own_is_its_parent_by_the_card():
    class Same(FedAvg):
        pass

    assert Same.card is FedAvg.card
    assert Same().lr_for("batch", family="digits") == FedAvg().lr_for("batch", family="digits")


def test_a_method_setting_what_its_card_holds_is_refused():
    # a class attribute the card replaced would be ignored: FedAvg's rates would win
    with pytest.raises(
        TypeError, match="sets default_lr, label: a method states these on its card"
    ):

        class Slow(FedAvg):
            label = "Slow FedAvg"
            default_lr = 0.002
