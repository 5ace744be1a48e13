"""stratify.testing: every registered method passes the conformance checks, a method
registered in a test gets all of them, and each check refuses a method that breaks it."""

import pytest

import stratify.run
from stratify.algorithms import ALGORITHMS
from stratify.testing import (
    CHECKS,
    MethodCase,
    check_comparator,
    check_declarations,
    check_method,
    check_resume,
    checks_for,
    forget_runs,
    method_cases,
    parametrize_with_checks,
)


@parametrize_with_checks()
def test_every_registered_method_conforms(case, check):
    check(case)


def test_a_method_is_checked_in_each_mode_it_runs_in():
    cases = [case.id for case in method_cases()]
    assert "stratify-single-sample" in cases and "stratify-batch" in cases
    assert "fedbss-batch" in cases and "fedbss-single-sample" not in cases
    assert {case.algorithm for case in method_cases()} == set(ALGORITHMS)


@pytest.fixture
def register(monkeypatch):
    """Registers a method of tests/toy_methods.py for one test, its runs made afresh."""
    names = []

    def register_toy(name, class_name):
        monkeypatch.setitem(ALGORITHMS, name, f"toy_methods:{class_name}")
        names.append(name)
        forget_runs(names)

    yield register_toy
    forget_runs(names)


def test_a_method_registered_in_a_test_gets_every_check(register):
    register("noisy-fedavg", "NoisyFedAvg")
    done = check_method("noisy-fedavg")
    modes = ("single-sample", "batch")
    # every check but the comparator's: noisy-fedavg inherits FedAvg's "no base to match"
    expected = [check.name for check in CHECKS if check.name != "comparator"]
    assert done == [f"noisy-fedavg-{mode}-{name}" for mode in modes for name in expected]


def test_the_resume_check_needs_the_torch_generator_restored(register, monkeypatch):
    # NoisyFedAvg draws its server noise from torch's generator: a resumed run that
    # does not put the generator back draws the noise of an earlier round again
    register("noisy-fedavg", "NoisyFedAvg")
    monkeypatch.setattr(stratify.run.torch, "set_rng_state", lambda state: None)
    with pytest.raises(AssertionError, match="after a resume"):
        check_resume(MethodCase("noisy-fedavg", "batch"))


#: A broken method (tests/toy_methods.py) for each way of breaking a check: its name, its
#: class (whose base, for the comparator check, is its parent's) and the checks that
#: must refuse it, each with a word of its message. A method drawing from a global
#: generator fails the resume check too: that check's runs start from other generator
#: states as well.
BROKEN = [
    ("idle-fedavg", "IdleFedAvg", {"first_epoch": "no optimizer step"}),
    (
        "global-numpy-fedavg",
        "GlobalNumpyFedAvg",
        {"same_seed": "epoch 1 weights", "resume": "after a resume"},
    ),
    ("private-generator-fedavg", "PrivateGeneratorFedAvg", {"resume": "after a resume"}),
    ("forgetful-fedavgm", "ForgetfulFedAvgM", {"resume": "after a resume"}),
    ("mean-loss-fedavg", "MeanLossFedAvg", {"resume": "method state"}),
    ("one-way-fedavg", "OneWayFedAvg", {"traffic": "copies were received"}),
    ("stale-loss-fedavg", "StaleLossFedAvg", {"state_round_trip": "load_state_dict"}),
    ("unchecked-noisy-fedavg", "UncheckedNoisyFedAvg", {"bad_options": "--noise"}),
    ("double-work-fedprox", "DoubleWorkFedProx", {"comparator": "its comparator's"}),
    ("unplanned-fedprox", "UnplannedFedProx", {"comparator": "plans no"}),
    ("namesake-fedavg", "NamesakeFedAvg", {"declarations": "'FedAvg' is also fedavg's"}),
]


@pytest.mark.parametrize("name, class_name, refused", BROKEN, ids=[entry[0] for entry in BROKEN])
def test_each_broken_method_is_refused_by_the_checks_it_breaks_and_only_those(
    register, name, class_name, refused
):
    register(name, class_name)
    case = MethodCase(name, "batch")
    messages = {}
    for check in checks_for(case):
        try:
            check(case)
        except AssertionError as error:
            messages[check.name] = str(error)
    assert set(messages) == set(refused), messages
    for check_name, word in refused.items():
        assert word in messages[check_name], messages[check_name]


def test_every_check_has_a_broken_method_it_refuses():
    # a check that no broken method fails proves nothing about the methods it passes
    assert {check.name for check in CHECKS} <= {name for *_, refused in BROKEN for name in refused}


def test_the_comparator_check_applies_to_the_methods_with_a_base():
    check_comparator(MethodCase("fedprox", "batch"))
    applies = {check.name: check.applies for check in CHECKS}["comparator"]
    assert applies(MethodCase("fedprox", "batch")) and not applies(MethodCase("sfl", "batch"))


def test_a_method_without_a_card_is_refused(register):
    # the toy has hooks only: no label, no comparator (nor why none), no test options, ...
    register("undeclared", "UndeclaredMethod")
    with pytest.raises(AssertionError, match="declares no card"):
        check_declarations(MethodCase("undeclared", "batch"))


def test_a_card_derived_from_a_parent_method_s_counts(register):
    # NoisyFedAvg's card is FedAvg's with its own identity: FedAvg's decisions are its own
    register("noisy-fedavg", "NoisyFedAvg")
    check_declarations(MethodCase("noisy-fedavg", "batch"))
