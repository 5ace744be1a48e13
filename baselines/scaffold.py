"""SCAFFOLD (Karimireddy et al. 2020): control variates correct the clients' drift.

Option II of the paper: after ``K`` local steps of size ``η_l`` a client sets
``c_i⁺ = c_i − c + (x − y_i) / (K η_l)``; the server moves ``x ← x + η_g · mean Δy`` and
``c ← c + (|S|/N) · mean Δc``. Every local step follows the corrected gradient
``g − c_i + c``. The variates start at zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from baselines.common import State, check_positive, clone_state, load_into, mean_state
from baselines.fedavg import FedAvg
from stratify.router import ClientUpdate, Router


def control_variate_update(
    client_variate: State, server_variate: State, start: State, end: State, steps: int, lr: float
) -> State:
    """Option II: ``c_i⁺ = c_i − c + (x − y_i) / (K · η_l)``.

    Parameters
    ----------
    client_variate, server_variate : dict
        ``c_i`` and ``c`` used during the round.
    start, end : dict
        Global parameters ``x`` the client received and its parameters ``y_i`` after
        ``steps`` local steps.
    steps : int
        Local steps ``K`` taken.
    lr : float
        Local learning rate ``η_l``.
    """
    scale = 1.0 / (steps * lr)
    return {
        key: client_variate[key] - server_variate[key] + (start[key] - end[key]) * scale
        for key in client_variate
    }


def scaffold_server_update(
    x: State,
    server_variate: State,
    delta_y: list[State],
    delta_c: list[State],
    server_lr: float,
    num_clients: int,
) -> tuple[State, State]:
    """``x ← x + η_g · mean_S Δy_i`` and ``c ← c + (|S|/N) · mean_S Δc_i``.

    Returns
    -------
    tuple of dict
        New global parameters and new server control variate.
    """
    mean_dy = mean_state(delta_y)
    mean_dc = mean_state(delta_c)
    share = len(delta_c) / num_clients
    new_x = {key: x[key] + server_lr * mean_dy[key] for key in x}
    new_c = {key: server_variate[key] + share * mean_dc[key] for key in server_variate}
    return new_x, new_c


class Scaffold(FedAvg):
    """SCAFFOLD with option-II control variates and a server learning rate.

    Parameters
    ----------
    local_epochs, local_batch_size, client_fraction, bn_buffers
        As :class:`~baselines.fedavg.FedAvg`.
    server_lr : float
        Global step size ``η_g`` (1 in the paper's experiments).

    Notes
    -----
    Control variates cover the trainable parameters; BN buffers follow ``bn_buffers``
    (sample-weighted, as in FedAvg). The server averages ``Δy`` and ``Δc`` uniformly over
    the participants, as in the paper. Traffic: besides the model download and upload,
    every participant downloads ``c`` and uploads ``Δc_i``, two parameter-sized payloads
    counted in ``bytes_sent``. The checkpoint carries ``c`` and every ``c_i``.
    """

    name = "scaffold"
    description = "control variates c, c_i (zero start, option II) correct local drift; server lr"

    def __init__(
        self,
        local_epochs: int = 1,
        local_batch_size: int | None = None,
        client_fraction: float = 1.0,
        server_lr: float = 1.0,
        bn_buffers: str = "average",
    ) -> None:
        super().__init__(local_epochs, local_batch_size, client_fraction, bn_buffers)
        self.server_lr = check_positive(server_lr, "--server-lr")
        self.server_variate: State = {}
        self.client_variates: dict[int, State] = {}

    def setup(self, router: Router) -> None:
        super().setup(router)
        state = router.model.state_dict()
        self.server_variate = {key: torch.zeros_like(state[key]) for key in self.parameter_keys}
        self.client_variates = {}

    def client_variate(self, client: int) -> State:
        if client not in self.client_variates:
            self.client_variates[client] = {
                key: torch.zeros_like(value) for key, value in self.server_variate.items()
            }
        return self.client_variates[client]

    def before_step(
        self, router: Router, client: int, model: nn.Module
    ) -> Callable[[nn.Module], None]:
        c_i = self.client_variate(client)
        correction = [self.server_variate[key] - c_i[key] for key in self.parameter_keys]

        def correct(local: nn.Module) -> None:
            grads = [p.grad for p in local.parameters() if p.requires_grad]
            torch._foreach_add_(grads, correction)

        return correct

    def client_update(
        self, router: Router, client: int, model: nn.Module, steps: int
    ) -> ClientUpdate:
        update = super().client_update(router, client, model, steps)
        global_state = router.model.state_dict()
        start = {key: global_state[key] for key in self.parameter_keys}
        end = {key: update.state[key] for key in self.parameter_keys}
        old = self.client_variate(client)
        new = control_variate_update(old, self.server_variate, start, end, steps, router.lr)
        update.extra["delta_y"] = {key: end[key] - start[key] for key in self.parameter_keys}
        update.extra["delta_c"] = {key: new[key] - old[key] for key in self.parameter_keys}
        self.client_variates[client] = new
        return update

    def count_traffic(self, router: Router, participants: int) -> None:
        # model down + up, plus c down and Δc_i up (parameter-sized payloads)
        router.count_transfers(2 * participants, gradients=2 * participants)

    def aggregate_parameters(self, router: Router, updates: list[ClientUpdate]) -> None:
        global_state = router.model.state_dict()
        x = {key: global_state[key] for key in self.parameter_keys}
        new_x, self.server_variate = scaffold_server_update(
            x,
            self.server_variate,
            [update.extra["delta_y"] for update in updates],
            [update.extra["delta_c"] for update in updates],
            self.server_lr,
            router.federation.num_clients,
        )
        load_into(router.model, new_x)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "server_variate": clone_state(self.server_variate),
            "client_variates": {k: clone_state(v) for k, v in self.client_variates.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "server_variate" in state:
            device = getattr(self, "device", None)
            self.server_variate = clone_state(state["server_variate"], device=device)
            self.client_variates = {
                int(k): clone_state(v, device=device) for k, v in state["client_variates"].items()
            }
