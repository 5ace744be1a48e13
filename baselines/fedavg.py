"""FedAvg (McMahan et al. 2017): broadcast, local SGD, sample-weighted average.

The base class of the averaging baselines. Its hooks, each overridden by one variant:

* :meth:`FedAvg.penalty` — an extra local loss term (FedProx);
* :meth:`FedAvg.before_step` — a gradient correction before each local step (SCAFFOLD);
* :meth:`FedAvg.client_update` — what a client sends back (SCAFFOLD adds Δc_i);
* :meth:`FedAvg.server_update` — how the averaged parameters become the new global
  model (FedAvgM's server momentum);
* :meth:`FedAvg.aggregate_parameters` — the whole parameter aggregation (SCAFFOLD);
* :meth:`FedAvg.local_round` — the clients' local work of a round (FedTAN's lockstep).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from baselines.common import (
    State,
    buffer_names,
    check_bn_buffers,
    check_fraction,
    check_positive_int,
    clone_state,
    load_into,
    parameter_names,
    participants,
    resolve_batch_size,
    weighted_average,
)
from stratify.router import ClientUpdate, Round, Router, Strategy


class FedAvg(Strategy):
    """Federated averaging: every round the sampled clients train a copy of the global model
    locally and the server replaces it by the sample-weighted average.

    Parameters
    ----------
    local_epochs : int
        Passes over its own data each client makes per round (``E``).
    local_batch_size : int, optional
        Local mini-batch size; ``None`` means 1 in ``--mode single-sample`` (the only
        size that mode allows) and 64 in ``--mode batch``.
    client_fraction : float
        Fraction ``C`` of the clients taking part in a round, in ``(0, 1]``;
        ``max(1, round(C·K))`` clients are drawn without replacement each round.
    bn_buffers : {"average", "local"}
        BatchNorm running statistics (all non-parameter state). ``average``: averaged with
        the clients' sample counts like the parameters (``num_batches_tracked`` becomes the
        rounded weighted mean). ``local``: each client keeps its own buffers between
        rounds (a client taking part for the first time starts from the global ones); the
        global model's buffers, used for evaluation, are the sample-weighted average of
        the latest buffers of every client that has trained so far.

    Notes
    -----
    One epoch of the run is one round. Traffic: each participant downloads and uploads
    the model once per round (2 transfers each). Aggregation weights are the clients'
    sample counts ``n_k``.
    """

    name = "fedavg"
    description = "broadcast, E local epochs of SGD per client, sample-weighted model average"

    def __init__(
        self,
        local_epochs: int = 1,
        local_batch_size: int | None = None,
        client_fraction: float = 1.0,
        bn_buffers: str = "average",
    ) -> None:
        self.local_epochs = check_positive_int(local_epochs, "--local-epochs")
        self.local_batch_size = (
            None
            if local_batch_size is None
            else check_positive_int(local_batch_size, "--local-batch-size")
        )
        self.client_fraction = check_fraction(client_fraction)
        self.bn_buffers = check_bn_buffers(bn_buffers)
        self.client_buffers: dict[int, State] = {}

    # -- set-up ---------------------------------------------------------------------------

    def setup(self, router: Router) -> None:
        self.batch_size = resolve_batch_size(self.local_batch_size, router.mode, self.name)
        self.parameter_keys = parameter_names(router.model)
        self.buffer_keys = buffer_names(router.model)
        self.device = router.device
        self.client_buffers = {}

    # -- rounds ---------------------------------------------------------------------------

    def configure_rounds(
        self, router: Router, epoch: int, rng: np.random.Generator
    ) -> Iterable[Round]:
        clients = participants(router.federation.num_clients, self.client_fraction, rng)
        return [Round(index=0, clients=clients)]

    def fit(self, router: Router, round_: Round, rng: np.random.Generator) -> list[ClientUpdate]:
        updates = self.local_round(router, [int(client) for client in round_.clients], rng)
        self.count_traffic(router, len(updates))
        return updates

    def local_round(
        self, router: Router, clients: list[int], rng: np.random.Generator
    ) -> list[ClientUpdate]:
        """Every participant trains its own copy of the global model, one after another."""
        updates = []
        for client in clients:
            model = self.receive(router, client)
            indices = router.federation.client_indices[client]
            steps = router.local_sgd(
                model,
                indices,
                self.local_epochs,
                self.batch_size,
                rng,
                penalty=self.penalty(router, client, model),
                before_step=self.before_step(router, client, model),
            )
            updates.append(self.client_update(router, client, model, steps))
        return updates

    def receive(self, router: Router, client: int) -> nn.Module:
        """The client's copy of the global model (with its own buffers in ``local`` mode)."""
        model = router.client_copy()
        if self.bn_buffers == "local" and client in self.client_buffers:
            load_into(model, self.client_buffers[client])
        return model

    def count_traffic(self, router: Router, participants: int) -> None:
        """Each participant downloads and uploads the model."""
        router.count_transfers(2 * participants)

    # -- local-objective hooks ------------------------------------------------------------

    def penalty(
        self, router: Router, client: int, model: nn.Module
    ) -> Callable[[nn.Module], torch.Tensor] | None:
        """Extra term of the local loss (none for FedAvg)."""
        return None

    def before_step(
        self, router: Router, client: int, model: nn.Module
    ) -> Callable[[nn.Module], None] | None:
        """Gradient correction before each local step (none for FedAvg)."""
        return None

    def client_update(
        self, router: Router, client: int, model: nn.Module, steps: int
    ) -> ClientUpdate:
        """What the client sends back: its model state and sample count."""
        return ClientUpdate(
            client=client,
            num_samples=len(router.federation.client_indices[client]),
            state=model.state_dict(),
            extra={"steps": steps},
        )

    # -- aggregation ----------------------------------------------------------------------

    def aggregate(self, router: Router, round_: Round, updates: list[ClientUpdate]) -> None:
        if not updates:
            return
        self.aggregate_parameters(router, updates)
        self.aggregate_buffers(router, updates)

    def aggregate_parameters(self, router: Router, updates: list[ClientUpdate]) -> None:
        """Sample-weighted average of the parameters, handed to :meth:`server_update`."""
        states = [{key: update.state[key] for key in self.parameter_keys} for update in updates]
        average = weighted_average(states, [update.num_samples for update in updates])
        self.server_update(router, average)

    def server_update(self, router: Router, average: State) -> None:
        """FedAvg: the average becomes the global model."""
        load_into(router.model, average)

    def aggregate_buffers(self, router: Router, updates: list[ClientUpdate]) -> None:
        """BN buffers by ``bn_buffers`` (see the class notes)."""
        if not self.buffer_keys:
            return
        if self.bn_buffers == "average":
            states = [{key: update.state[key] for key in self.buffer_keys} for update in updates]
            load_into(router.model, weighted_average(states, [u.num_samples for u in updates]))
            return
        for update in updates:
            self.client_buffers[update.client] = clone_state(update.state, self.buffer_keys)
        clients = sorted(self.client_buffers)
        sizes = router.federation.client_sizes
        load_into(
            router.model,
            weighted_average(
                [self.client_buffers[client] for client in clients],
                [int(sizes[client]) for client in clients],
            ),
        )

    # -- checkpoint -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"client_buffers": {k: clone_state(v) for k, v in self.client_buffers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        device = getattr(self, "device", None)
        self.client_buffers = {
            int(client): clone_state(buffers, device=device)
            for client, buffers in state.get("client_buffers", {}).items()
        }
