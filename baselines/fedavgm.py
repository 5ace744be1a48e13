"""FedAvgM (Hsu et al. 2019): FedAvg with server momentum on the averaged update."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from stratify.baselines.fedavg import FedAvg, FedAvgOptions
from stratify.card import Bench, Comparison, Identity, MethodCard, Rates
from stratify.method import Context
from stratify.options import Probe, option
from stratify.state import State, clone_state
from stratify.validation import check_momentum, check_positive


@dataclass
class FedAvgMOptions(FedAvgOptions):
    """FedAvg's options and the server's momentum and learning rate."""

    server_momentum: float = option(
        0.9, "Server momentum β, in [0, 1).", check=check_momentum, probe=Probe(0.5)
    )
    server_lr: float = option(
        1.0, "Server learning rate η > 0.", check=check_positive, probe=Probe(0.5)
    )


def server_momentum_step(
    current: State, average: State, velocity: State, momentum: float, server_lr: float
) -> tuple[State, State]:
    """One server step: ``Δ = x − x̄``, ``v ← βv + Δ``, ``x ← x − η v``.

    Parameters
    ----------
    current : dict
        Global parameters ``x`` before the round.
    average : dict
        Sample-weighted average ``x̄`` of the clients' parameters.
    velocity : dict
        Server momentum buffer ``v`` (zeros at the start).
    momentum, server_lr : float
        ``β`` and ``η``; ``β = 0, η = 1`` gives ``x ← x̄`` (FedAvg).

    Returns
    -------
    tuple of dict
        The new ``x`` and the new ``v``.
    """
    new_x, new_v = {}, {}
    for key, x in current.items():
        delta = x - average[key]
        v = momentum * velocity[key] + delta
        new_v[key] = v
        new_x[key] = x - server_lr * v
    return new_x, new_v


class FedAvgM(FedAvg):
    """FedAvg whose server applies the averaged update with momentum.

    Options: :class:`FedAvgMOptions`.

    Notes
    -----
    Momentum acts on the trainable parameters; BN buffers follow ``bn_buffers`` as in
    FedAvg (a running statistic has no "update direction" to accelerate). The momentum
    buffer is part of the checkpoint.
    """

    card = MethodCard(
        Identity("fedavgm", "FedAvgM", "FedAvg + server momentum: v ← βv + (x − avg), x ← x − η·v"),
        Comparison("fedavg"),
        # chosen by the `defaults` grids (docs/results/defaults-*.csv)
        rates=Rates(
            tuned={
                ("digits", "batch"): 0.1,
                ("digits", "single-sample"): 0.03,
                ("mnist", "batch"): 0.01,
                ("mnist", "single-sample"): 0.01,
            }
        ),
        bench=Bench(
            benchmark_local=True,
            step_size_options=("local_momentum", "server_momentum", "server_lr"),
        ),
    )
    options_class = FedAvgMOptions
    options: FedAvgMOptions

    def setup(self, context: Context) -> None:
        super().setup(context)
        state = context.model.state_dict()
        self.velocity = {key: torch.zeros_like(state[key]) for key in self.parameter_keys}

    def server_update(self, context: Context, average: State) -> State:
        state = context.model.state_dict()
        current = {key: state[key] for key in self.parameter_keys}
        new_x, self.velocity = server_momentum_step(
            current, average, self.velocity, self.options.server_momentum, self.options.server_lr
        )
        return new_x

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "velocity": clone_state(self.velocity)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "velocity" in state:
            self.velocity = clone_state(state["velocity"], device=self.device)
