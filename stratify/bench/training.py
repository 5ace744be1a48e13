"""What the engine adds to mini-batch training (:func:`bench_batch`, ``stratify bench
batch``), and what one round of each averaging method costs (:func:`bench_rounds`,
``stratify bench rounds``).

``batch`` runs Stratify's batch mode (one epoch's global batches) and a plain centralised
loop over the very same batches from the same weights, and checks that both end with the
same weights. ``rounds`` times whole rounds of the averaging baselines, interleaved so
that a change of machine load hits every method alike.
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from stratify.backend import Timer
from stratify.bench.steps import MATCH_TOLERANCE, BenchmarkError
from stratify.config import TrainConfig
from stratify.data.datasets import Dataset, load_dataset
from stratify.engine import Engine
from stratify.experiment import build_experiment
from stratify.nn.models import check_model_norm, default_model
from stratify.selection import Plan
from stratify.state import State, clone_state, load_into
from stratify.stratify import Stratify
from stratify.validation import check_repeats


def centralised_loop(
    model: nn.Module, x_train, y_train, samples: np.ndarray, starts: np.ndarray, lr: float
) -> None:
    """A plain mini-batch loop over given batches: mean loss, zero_grad, backward, step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    index = torch.as_tensor(samples, device=x_train.device)
    for start, stop in zip(starts[:-1].tolist(), starts[1:].tolist()):
        batch = index[start:stop]
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
        loss.backward()
        optimizer.step()


def batch_engine(
    data: Dataset,
    *,
    spec: str,
    clients: int,
    model_name: str | None,
    norm: str | None,
    batch_labels: int,
    batch_path: str,
    lr: float | None,
) -> Engine:
    config = TrainConfig(
        dataset=data.name,
        partition=spec,
        clients=clients,
        mode="batch",
        model=model_name,
        norm=norm,
        lr=lr,
        seed=0,
        secure=False,
        options={"batch_labels": batch_labels, "batch_path": batch_path},
    )
    return build_experiment(config, dataset=data).engine


def compare_batch_mode(engine: Engine, repeats: int, lr: float) -> dict[str, Any]:
    """Median seconds of planning, of the engine's batch epoch and of the plain loop on the
    same batches, each run ``repeats`` times from the same weights; and their weights."""
    strategy = engine.strategy
    assert isinstance(strategy, Stratify)
    context, device = engine.context, engine.device
    initial: State = clone_state(engine.model.state_dict())
    plain_model = copy.deepcopy(engine.model)
    plan_seconds, engine_seconds, plain_seconds = [], [], []
    plan: Plan | None = None
    for repeat in range(repeats + 1):  # the first pass warms up and is not counted
        with Timer(device) as timer:
            plan = strategy.plan_epoch(context, engine.epoch_rng(1))
        if repeat:
            plan_seconds.append(timer.seconds)
        assert plan.batch_starts is not None
        load_into(engine.model, initial)
        strategy.optimizer.state.clear()
        with Timer(device) as timer:
            strategy.execute_global_batches(context, plan)
        if repeat:
            engine_seconds.append(timer.seconds)
        load_into(plain_model, initial)
        with Timer(device) as timer:
            centralised_loop(
                plain_model, context.x_train, context.y_train, plan.samples, plan.batch_starts, lr
            )
        if repeat:
            plain_seconds.append(timer.seconds)
    assert plan is not None
    engine_state = clone_state(dict(engine.model.named_parameters()))
    plain_state = clone_state(dict(plain_model.named_parameters()))
    difference = max(float((engine_state[k] - plain_state[k]).abs().max()) for k in plain_state)
    moved = max(float((plain_state[k] - initial[k]).abs().max()) for k in plain_state)
    return {
        "batches": plan.steps,
        "samples": len(plan.samples),
        "plan_s": statistics.median(plan_seconds),
        "engine_s": statistics.median(engine_seconds),
        "plain_s": statistics.median(plain_seconds),
        "max_difference": difference,
        "moved": moved,
        "difference_share": difference / max(moved, 1e-30),
    }


def round_engine(data: Dataset, algorithm: str, *, spec: str, clients: int, options) -> Engine:
    config = TrainConfig(
        dataset=data.name,
        partition=spec,
        clients=clients,
        algorithm=algorithm,
        mode="batch",
        seed=0,
        secure=False,
        options=dict(options),
    )
    return build_experiment(config, dataset=data).engine


def time_rounds(engines: dict[str, Engine], rounds: int) -> dict[str, list[float]]:
    """Seconds of rounds 2 .. rounds + 1 of every engine, the methods taking turns round by
    round; round 1 warms up (first calls of every kernel) and is not counted."""
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for round_number in range(1, rounds + 2):
        for name, engine in engines.items():
            with Timer(engine.device) as timer:
                engine.run_epoch(round_number)
            if round_number > 1:
                seconds[name].append(timer.seconds)
    return seconds


@dataclass
class BatchResult:
    """What :func:`bench_batch` measured: median seconds of one epoch's global batches in
    batch mode and in the plain loop, and how far their weights ended apart."""

    dataset: str
    model_name: str
    batch_labels: int
    batch_path: str
    repeat: int
    lr: float
    figures: dict[str, Any]

    @property
    def overhead(self) -> float:
        return self.figures["engine_s"] / self.figures["plain_s"] - 1

    @property
    def overhead_with_planning(self) -> float:
        figures = self.figures
        return (figures["engine_s"] + figures["plan_s"]) / figures["plain_s"] - 1

    @property
    def weights_match(self) -> bool:
        return self.figures["difference_share"] <= MATCH_TOLERANCE

    def to_json(self) -> dict[str, Any]:
        """The figures as ``bench batch --json`` writes them."""
        return {
            **self.figures,
            "lr": self.lr,
            "overhead": self.overhead,
            "overhead_with_planning": self.overhead_with_planning,
            "weights_match": self.weights_match,
        }

    def check(self) -> None:
        """Raise :class:`BenchmarkError` when the two loops ended with other weights."""
        if not self.weights_match:
            raise BenchmarkError(
                "batch mode and the plain loop ended with different weights "
                f"({self.figures['difference_share']:.1e} of the movement): they did not "
                "make the same updates"
            )


def bench_batch(
    dataset: str,
    *,
    data_dir: str | None = None,
    spec: str = "dirichlet:0.5",
    clients: int = 10,
    model_name: str | None = None,
    norm: str | None = None,
    batch_labels: int = 64,
    batch_path: str = "fused",
    lr: float | None = None,
    repeat: int = 3,
) -> BatchResult:
    """Batch mode's overhead: one epoch of global batches against a plain centralised loop
    over the same batches, from the same weights, ``repeat`` times (medians).

    Parameters
    ----------
    dataset, data_dir, spec, clients : str, str or None, str, int
        The data and its split, as ``stratify train`` takes them.
    model_name, norm, lr : str or None, str or None, float or None
        ``None`` takes the library's, as ``stratify train``.
    batch_labels, batch_path : int, str
        Stratify's batch-mode options.
    repeat : int
        Timed passes of each loop (after one warm-up pass).
    """
    check_repeats(repeat, "--repeat")
    check_model_norm(model_name, norm, "batch")  # before the data is loaded
    data = load_dataset(dataset, data_dir=data_dir, device="cpu")
    engine = batch_engine(
        data,
        spec=spec,
        clients=clients,
        model_name=model_name,
        norm=norm,
        batch_labels=batch_labels,
        batch_path=batch_path,
        lr=lr,
    )
    lr = engine.base_lr  # the library's when not given
    return BatchResult(
        dataset=dataset,
        model_name=model_name or default_model(data.input_shape),
        batch_labels=batch_labels,
        batch_path=batch_path,
        repeat=repeat,
        lr=lr,
        figures=compare_batch_mode(engine, repeat, lr),
    )


@dataclass
class RoundResult:
    """One method's timed rounds in :func:`bench_rounds`."""

    method: str
    local_epochs: int | None
    rounds_s: list[float]

    @property
    def round_s(self) -> float:
        return statistics.median(self.rounds_s)

    def to_json(self) -> dict[str, Any]:
        # "algorithm": the key earlier versions wrote, kept for the files already made
        return {
            "algorithm": self.method,
            "local_epochs": self.local_epochs,
            "round_s": self.round_s,
            "rounds_s": self.rounds_s,
        }


@dataclass
class RoundsResult:
    """What :func:`bench_rounds` measured, one entry per method in the order given."""

    dataset: str
    spec: str
    clients: int
    rounds: int
    methods: list[RoundResult]

    def to_json(self) -> list[dict[str, Any]]:
        """The figures as ``bench rounds --json`` writes them."""
        return [method.to_json() for method in self.methods]


def bench_rounds(
    dataset: str,
    methods: list[str],
    *,
    data_dir: str | None = None,
    spec: str = "dirichlet:0.5",
    clients: int = 10,
    rounds: int = 3,
    local_epochs: int | None = None,
) -> RoundsResult:
    """Seconds per round of averaging methods in batch mode, the methods taking turns.

    Parameters
    ----------
    dataset, data_dir, spec, clients : str, str or None, str, int
        The data and its split, as ``stratify train`` takes them.
    methods : list of str
        Registered method names.
    rounds : int
        Timed rounds, after one warm-up round.
    local_epochs : int or None
        Every method's local epochs; ``None`` keeps each method's own.
    """
    check_repeats(rounds, "--rounds")
    if local_epochs is not None:  # each is a pass over every client's data, per round
        check_repeats(local_epochs, "--local-epochs")
    options = {} if local_epochs is None else {"local_epochs": local_epochs}
    data = load_dataset(dataset, data_dir=data_dir, device="cpu")
    engines = {
        name: round_engine(data, name, spec=spec, clients=clients, options=options)
        for name in methods
    }
    seconds = time_rounds(engines, rounds)
    return RoundsResult(
        dataset,
        spec,
        clients,
        rounds,
        [
            RoundResult(name, engine.strategy.options.to_dict().get("local_epochs"), seconds[name])
            for name, engine in engines.items()
        ],
    )
