"""Stratify and its baselines on Flower: a simulated run ends where the in-process run ends.

One Flower simulation (its Ray cluster started once) runs every case one after another
on three nodes, each holding one client's digits; the same configurations then run
in-process with one torch thread, as the simulation's nodes compute.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engines import FEATURES, bn_mlp, mlp, tiny_engine

pytest.importorskip(
    "flwr", reason="the flower extra is not installed (pip install 'stratify[flower]')"
)

from stratify.config import TrainConfig  # noqa: E402
from stratify.errors import ConfigError  # noqa: E402
from stratify.experiment import build_experiment  # noqa: E402
from stratify.flower.messages import check_flower_config  # noqa: E402
from stratify.flower.server import RemoteTrainer  # noqa: E402
from stratify.flower.simulation import simulate  # noqa: E402
from stratify.method import EpochStats  # noqa: E402
from stratify.stratify import Stratify  # noqa: E402

#: every case: digits over three Dirichlet clients, batch mode unless it says otherwise,
#: the plain registry
CASES = {
    "stratify": {"algorithm": "stratify", "epochs": 2, "options": {"batch_labels": 128}},
    # the model hops from holder to holder, relayed by the server, a chunk at most a hop
    "stratify-hops": {
        "algorithm": "stratify",
        "mode": "single-sample",
        "epochs": 1,
        "lr": 0.05,
        "options": {"chunk": 5, "repeat_count": 6},
    },
    "fedavg": {"algorithm": "fedavg", "epochs": 2, "options": {"local_epochs": 1}},
    "fedprox": {"algorithm": "fedprox", "epochs": 1, "options": {"local_epochs": 1, "mu": 0.5}},
    "scaffold": {"algorithm": "scaffold", "epochs": 2, "options": {"local_epochs": 1}},
}
#: float32 sums in another order (one forward per client's share): well below what a
#: wrong sample, step or weight moves (the runs move the weights by 0.03 to 0.5)
TOLERANCE = 1e-5


def config(case: str) -> TrainConfig:
    settings = {
        "dataset": "digits",
        "clients": 3,
        "partition": "dirichlet:0.5",
        "mode": "batch",
        "secure": False,
        "seed": 3,
        "device": "cpu",
    }
    return TrainConfig(**{**settings, **CASES[case]})


def in_process(config: TrainConfig) -> tuple[dict[str, torch.Tensor], list[EpochStats]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        experiment = build_experiment(config)
        stats = [experiment.engine.run_epoch(epoch) for epoch in range(1, config.epochs + 1)]
    finally:
        torch.set_num_threads(threads)
    return experiment.model.state_dict(), stats


@pytest.fixture(scope="module")
def runs() -> dict:
    configs = [config(case) for case in CASES]
    return dict(zip(CASES, simulate(configs, timeout=60)))


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_simulated_run_ends_with_the_in_process_weights(runs: dict, case: str) -> None:
    state, _ = in_process(config(case))
    start = build_experiment(config(case)).model.state_dict()
    flower = runs[case].state
    assert set(flower) == set(state)
    moved = max(float((state[key] - start[key]).abs().max()) for key in state)
    assert moved > 1e-2, "the run must train for the comparison to mean something"
    difference = max(float((state[key] - flower[key]).abs().max()) for key in state)
    assert difference < TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("case", ["stratify", "stratify-hops", "fedavg", "fedprox"])
def test_the_messages_carry_the_transfers_the_engine_counts(runs: dict, case: str) -> None:
    _, stats = in_process(config(case))
    run = runs[case]
    assert run.traffic.transfers == sum(epoch.transfers for epoch in stats) > 0
    assert run.traffic.uploads == sum(epoch.uploads for epoch in stats)
    assert [epoch.transfers for epoch in run.epochs] == [epoch.transfers for epoch in stats]
    assert len(run.seconds) == len(run.accuracies) == config(case).epochs


def test_a_flower_run_refuses_what_it_cannot_carry() -> None:
    with pytest.raises(ConfigError, match="encrypted registry"):
        check_flower_config(TrainConfig(dataset="digits", mode="batch", secure=True))
    with pytest.raises(ConfigError, match="validation"):
        check_flower_config(
            TrainConfig(dataset="digits", mode="batch", secure=False, validation=0.1)
        )
    with pytest.raises(ConfigError, match="batch only"):
        check_flower_config(
            TrainConfig(dataset="digits", algorithm="fedavg", mode="single-sample", secure=False)
        )
    with pytest.raises(ConfigError, match="no momentum"):
        check_flower_config(
            TrainConfig(
                dataset="digits", mode="single-sample", secure=False, options={"momentum": 0.5}
            )
        )
    with pytest.raises(ConfigError, match="fedavgm does not run over Flower"):
        check_flower_config(
            TrainConfig(dataset="digits", algorithm="fedavgm", mode="batch", secure=False)
        )


def test_a_global_batch_of_a_model_with_batch_statistics_is_refused() -> None:
    # the clients' BatchNorm sums are not exchanged: refused before any message is sent
    trainer = RemoteTrainer(None, [2, 2], torch.zeros(4, FEATURES), torch.zeros(4))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="BatchNorm"):
        trainer.batch_gradient(bn_mlp(), np.arange(4), np.array([0, 0, 1, 1]))


def test_hops_through_a_remote_trainer_never_take_the_compiled_or_vectorised_step() -> None:
    # both read the samples on the server, which holds only stand-ins
    engine = tiny_engine(Stratify(compile="on"), mlp(), mode="single-sample")
    strategy, context = engine.strategy, engine.context
    assert isinstance(strategy, Stratify) and strategy.uses_compiled_step(context)
    rounds = strategy.configure_rounds(context, 1, np.random.default_rng(0))
    assert strategy.local_work(context, list(rounds)[0], np.random.default_rng(0))
    context.trainer = RemoteTrainer(None, [3, 5], context.x_train, context.y_train)  # type: ignore[arg-type]
    assert not strategy.uses_compiled_step(context)
    assert strategy.local_work(context, list(rounds)[0], np.random.default_rng(0)) is None
