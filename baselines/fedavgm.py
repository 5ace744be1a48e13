"""FedAvgM (Hsu et al. 2019): FedAvg with server momentum on the averaged update."""

from __future__ import annotations

import math
from typing import Any

import torch

from baselines.common import State, check_positive, clone_state, load_into
from baselines.fedavg import FedAvg
from stratify.errors import ConfigError
from stratify.router import Router


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

    Parameters
    ----------
    local_epochs, local_batch_size, client_fraction, bn_buffers
        As :class:`~baselines.fedavg.FedAvg`.
    server_momentum : float
        Server momentum ``β`` in ``[0, 1)``.
    server_lr : float
        Server learning rate ``η > 0``.

    Notes
    -----
    Momentum acts on the trainable parameters; BN buffers follow ``bn_buffers`` as in
    FedAvg (a running statistic has no "update direction" to accelerate). The momentum
    buffer is part of the checkpoint.
    """

    name = "fedavgm"
    description = "FedAvg + server momentum: v ← βv + (x − avg), x ← x − η·v"

    def __init__(
        self,
        local_epochs: int = 1,
        local_batch_size: int | None = None,
        client_fraction: float = 1.0,
        server_momentum: float = 0.9,
        server_lr: float = 1.0,
        bn_buffers: str = "average",
    ) -> None:
        super().__init__(local_epochs, local_batch_size, client_fraction, bn_buffers)
        try:
            server_momentum = float(server_momentum)
        except (TypeError, ValueError):
            server_momentum = math.nan
        if not 0.0 <= server_momentum < 1.0:
            raise ConfigError(f"--server-momentum must be in [0, 1), got {server_momentum}")
        self.server_momentum = server_momentum
        self.server_lr = check_positive(server_lr, "--server-lr")
        self.velocity: State = {}

    def setup(self, router: Router) -> None:
        super().setup(router)
        state = router.model.state_dict()
        self.velocity = {key: torch.zeros_like(state[key]) for key in self.parameter_keys}

    def server_update(self, router: Router, average: State) -> None:
        state = router.model.state_dict()
        current = {key: state[key] for key in self.parameter_keys}
        new_x, self.velocity = server_momentum_step(
            current, average, self.velocity, self.server_momentum, self.server_lr
        )
        load_into(router.model, new_x)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "velocity": clone_state(self.velocity)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "velocity" in state:
            self.velocity = clone_state(state["velocity"], device=getattr(self, "device", None))
