"""`stratify bench batch` and `stratify bench rounds`: what the engine adds to mini-batch
training, and what one round of each averaging method costs.

``batch`` runs Stratify's batch mode (one epoch's global batches) and a plain centralised
loop over the very same batches from the same weights, and checks that both end with the
same weights. ``rounds`` times whole rounds of the averaging baselines, interleaved so
that a change of machine load hits every method alike.
"""

from __future__ import annotations

import copy
import statistics
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from stratify.backend import Timer
from stratify.config import TrainConfig
from stratify.data.datasets import Dataset
from stratify.engine import Engine
from stratify.experiment import build_experiment
from stratify.selection import Plan
from stratify.state import State, clone_state, load_into
from stratify.stratify import Stratify


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
