"""stratify.testing: every registered method passes the conformance checks, a method
registered in a test gets all of them, and each check refuses a method that breaks it."""

import pytest

import stratify.run
from stratify.algorithms import ALGORITHMS
from stratify.testing import (
    CHECKS,
    MethodCase,
    check_comparator,
    check_method,
    check_resume,
    check_same_seed,
    check_traffic,
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
    # every check but the comparator's: noisy-fedavg has no base registered to match
    expected = [check.name for check in CHECKS if check.name != "comparator"]
    assert done == [f"noisy-fedavg-{mode}-{name}" for mode in modes for name in expected]


def test_the_resume_check_needs_the_torch_generator_restored(register, monkeypatch):
    # NoisyFedAvg draws its server noise from torch's generator: a resumed run that
    # does not put the generator back draws the noise of an earlier round again
    register("noisy-fedavg", "NoisyFedAvg")
    monkeypatch.setattr(stratify.run.torch, "set_rng_state", lambda state: None)
    with pytest.raises(AssertionError, match="after a resume"):
        check_resume(MethodCase("noisy-fedavg", "batch"))


def test_the_resume_check_needs_every_part_of_a_methods_state(register):
    register("forgetful-fedavgm", "ForgetfulFedAvgM")  # its velocity is not checkpointed
    with pytest.raises(AssertionError, match="after a resume"):
        check_resume(MethodCase("forgetful-fedavgm", "batch"))


def test_the_same_seed_check_refuses_a_method_drawing_from_numpys_global_generator(register):
    register("global-numpy-fedavg", "GlobalNumpyFedAvg")
    with pytest.raises(AssertionError, match="epoch 1 weights"):
        check_same_seed(MethodCase("global-numpy-fedavg", "batch"))


def test_the_traffic_check_refuses_a_method_that_leaves_out_the_downloads(register):
    register("one-way-fedavg", "OneWayFedAvg")
    with pytest.raises(AssertionError, match="copies were received"):
        check_traffic(MethodCase("one-way-fedavg", "batch"))


def test_the_comparator_check_refuses_a_method_whose_local_work_its_comparator_misses(
    register, monkeypatch
):
    from stratify.reproduce import paired

    register("double-work-fedprox", "DoubleWorkFedProx")
    monkeypatch.setitem(paired.BASES, "double-work-fedprox", "fedavg")
    with pytest.raises(AssertionError, match="its comparator's"):
        check_comparator(MethodCase("double-work-fedprox", "batch"))
    # the real FedProx passes, and the check applies to the methods with a base only
    check_comparator(MethodCase("fedprox", "batch"))
    applies = {check.name: check.applies for check in CHECKS}["comparator"]
    assert applies(MethodCase("fedprox", "batch")) and not applies(MethodCase("sfl", "batch"))
