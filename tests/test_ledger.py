"""A node's own count of the ε it spends (stratify.privacy.ledger; docs/flower.md, "The
node's own budget"): the composition checked against the Gaussian mechanism's Rényi DP
by hand, the worst case over runs, and the file that processes share."""

from __future__ import annotations

import importlib.util
import json
import math
import multiprocessing
import stat

import numpy as np
import pytest

if importlib.util.find_spec("opacus") is None:
    pytest.skip("Opacus is not installed (the privacy extra)", allow_module_level=True)

from stratify.errors import ConfigError  # noqa: E402
from stratify.privacy.accounting import composed_epsilon, epsilon_spent  # noqa: E402
from stratify.privacy.ledger import Ledger, run_key, worst_case_spent  # noqa: E402

DELTA = 1e-5


def test_one_noise_composes_as_the_runs_accounting():
    assert composed_epsilon({1.1: 7}, DELTA) == epsilon_spent(1.1, DELTA, 7)
    assert composed_epsilon({}, DELTA) == 0.0
    assert composed_epsilon({2.0: 0}, DELTA) == 0.0
    assert composed_epsilon({0.0: 1}, DELTA) == math.inf


def test_mechanisms_at_several_noises_add_their_renyi_divergences():
    # an unsubsampled Gaussian mechanism of multiplier σ has Rényi DP α / (2σ²) at every
    # order α, so n uses at σ weigh n / σ²: 2 uses at σ = 1 and 4 at σ = 2 weigh
    # 2 + 1 = 3, as 3 uses at σ = 1 do
    assert composed_epsilon({1.0: 2, 2.0: 4}, DELTA) == pytest.approx(
        composed_epsilon({1.0: 3}, DELTA), rel=1e-9
    )
    # and more uses at either noise spend more
    assert composed_epsilon({1.0: 2, 2.0: 5}, DELTA) > composed_epsilon({1.0: 3}, DELTA)


def test_the_worst_case_adds_each_runs_most_used_sample_per_noise():
    runs = {
        "a": {"1.0": [2, 0, 1], "2.0": [0, 4, 4]},
        "b": {"1.0": [0, 3, 0]},
    }
    assert worst_case_spent(runs) == {1.0: 5, 2.0: 4}
    assert worst_case_spent({}) == {}


def test_a_charge_counts_each_use_and_refuses_the_one_over_the_budget(tmp_path):
    path = tmp_path / "ledger.json"
    budget = epsilon_spent(1.0, DELTA, 3)  # three uses of a sample at σ = 1, exactly
    ledger = Ledger(path, budget, DELTA)
    run = run_key(0, "the run's settings")
    # two messages over samples 0..3, then one using sample 2 again
    assert ledger.charge(run, 1.0, np.arange(4), 4) == epsilon_spent(1.0, DELTA, 1)
    assert ledger.charge(run, 1.0, np.arange(4), 4) == epsilon_spent(1.0, DELTA, 2)
    assert ledger.charge(run, 1.0, np.array([2]), 4) == pytest.approx(budget, rel=1e-12)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    before = path.read_bytes()
    # a fresh reader (another process's) sees the same count
    assert Ledger(path, budget, DELTA).epsilon() == pytest.approx(budget, rel=1e-12)
    # sample 2 a fourth time is refused, and nothing is counted
    with pytest.raises(ConfigError, match=r"at most ε = .* would take it to") as refused:
        Ledger(path, budget, DELTA).charge(run, 1.0, np.array([1, 2]), 4)
    assert "\n" not in str(refused.value)
    assert path.read_bytes() == before
    # sample 3, used twice, still has room
    Ledger(path, budget, DELTA).charge(run, 1.0, np.array([3]), 4)
    document = json.loads(path.read_text())
    assert document["runs"][run] == {"1.0": [2, 2, 3, 3]}
    assert document["epsilon"] == pytest.approx(budget, rel=1e-12)


def test_another_run_is_counted_as_if_it_used_the_same_samples(tmp_path):
    # the node cannot tell which of its samples another run's positions are: a run that
    # used one sample twice and another that used a different sample twice spend, at
    # worst, four uses of one sample
    ledger = Ledger(tmp_path / "ledger.json", 100.0, DELTA)
    ledger.charge(run_key(0, "run a"), 1.0, np.array([0, 0]), 3)
    spent = ledger.charge(run_key(0, "run b"), 1.0, np.array([1, 1]), 3)
    assert spent == pytest.approx(epsilon_spent(1.0, DELTA, 4), rel=1e-12)
    assert run_key(0, "run a") != run_key(0, "run b") != run_key(1, "run b")


def charge_many(path: str, times: int, start) -> None:
    ledger = Ledger(path, 1e9, DELTA)
    ledger.charge(run_key(0, "run"), 4.0, np.array([0]), 1)  # the accountant imported
    start.wait()  # then both charge at once, whichever process started first
    for _ in range(times - 1):
        ledger.charge(run_key(0, "run"), 4.0, np.array([0]), 1)


def test_processes_charging_at_once_count_every_use(tmp_path):
    # a deployed node serves each message in a fresh process: two charging together must
    # not lose each other's uses (the file is rewritten under a lock)
    path = str(tmp_path / "ledger.json")
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    workers = [context.Process(target=charge_many, args=(path, 15, start)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
        assert worker.exitcode == 0
    assert json.loads(open(path).read())["runs"][run_key(0, "run")] == {"4.0": [30]}


def test_a_damaged_ledger_is_refused_not_taken_as_empty(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = Ledger(path, 10.0, DELTA)
    ledger.charge(run_key(0, "run"), 1.0, np.array([0]), 1)
    for damaged in ("{", "[]", '{"delta": 1e-5}'):
        path.write_text(damaged)
        with pytest.raises(ConfigError, match="cannot read the DP ledger"):
            ledger.charge(run_key(0, "run"), 1.0, np.array([0]), 1)
        assert path.read_text() == damaged
