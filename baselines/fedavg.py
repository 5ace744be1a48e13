"""FedAvg (McMahan et al. 2017): broadcast, local SGD, sample-weighted average.

The base class of the averaging baselines. Its hooks, each overridden by one variant:

* :meth:`FedAvg.gradient_hook` — a change of the local gradient before each step
  (FedProx's proximal gradient, SCAFFOLD's drift correction);
* :meth:`FedAvg.client_update` — what a client sends back (SCAFFOLD adds Δc_i);
* :meth:`FedAvg.server_update` — how the averaged parameters become the new global
  parameters (FedAvgM's server momentum);
* :meth:`FedAvg.aggregate_parameters` — the whole parameter aggregation (SCAFFOLD);
* :meth:`FedAvg.local_round` — the clients' local work of a round (FedTAN's lockstep).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from stratify.baselines.common import (
    BN_BUFFER_MODES,
    ClientSamplingOptions,
    participants,
    weighted_average,
)
from stratify.client import GradientHook, LocalResult
from stratify.options import option
from stratify.router import ClientUpdate, Context, Round, RoundStats, Strategy
from stratify.state import State, buffer_names, clone_state, load_into, parameter_names


@dataclass
class FedAvgOptions(ClientSamplingOptions):
    """Options of :class:`FedAvg` and the methods built on it."""

    algorithm = "fedavg"

    bn_buffers: str = option(
        "average",
        "BatchNorm running statistics: averaged like the parameters, or kept by each client.",
        choices=tuple(BN_BUFFER_MODES),
    )


class FedAvg(Strategy):
    """Federated averaging: every round the sampled clients train a copy of the global model
    locally and the server replaces it by the sample-weighted average.

    Options (:class:`FedAvgOptions`): ``local_epochs`` E, ``local_batch_size`` (1 in
    single-sample mode, 64 by default in batch mode), ``client_fraction`` C
    (``max(1, round(C·K))`` clients drawn without replacement each round) and
    ``bn_buffers``. ``average``: BatchNorm running statistics (all non-parameter state)
    are averaged with the clients' sample counts like the parameters
    (``num_batches_tracked`` becomes the rounded weighted mean). ``local``: each client
    keeps its own buffers between rounds (a client taking part for the first time starts
    from the global ones); the global model's buffers, used for evaluation, are the
    sample-weighted average of the latest buffers of every client that has trained so far.

    Notes
    -----
    One epoch of the run is one round. Traffic: each participant downloads and uploads
    the model once per round (2 transfers each). Aggregation weights are the clients'
    sample counts ``n_k``.
    """

    name = "fedavg"
    description = "broadcast, E local epochs of SGD per client, sample-weighted model average"
    options_class = FedAvgOptions
    options: FedAvgOptions

    # -- set-up ---------------------------------------------------------------------------

    def setup(self, context: Context) -> None:
        super().setup(context)
        self.parameter_keys = parameter_names(context.model)
        self.buffer_keys = buffer_names(context.model)
        self.device = context.device
        self.client_buffers: dict[int, State] = {}

    @property
    def bn_buffer_mode(self) -> str:
        return self.options.bn_buffers

    # -- rounds ---------------------------------------------------------------------------

    def configure_rounds(
        self, context: Context, epoch: int, rng: np.random.Generator
    ) -> Iterable[Round]:
        clients = participants(context.federation.num_clients, self.options.client_fraction, rng)
        return [Round(index=0, clients=clients)]

    def fit(self, context: Context, round_: Round, rng: np.random.Generator) -> list[ClientUpdate]:
        assert round_.clients is not None
        return self.local_round(context, [int(client) for client in round_.clients], rng)

    def local_round(
        self, context: Context, clients: list[int], rng: np.random.Generator
    ) -> list[ClientUpdate]:
        """Every participant trains its own copy of the global model, one after another."""
        updates = []
        for client in clients:
            model = self.receive(context, client)
            result = context.trainer.train(
                model,
                context.federation.client_indices[client],
                epochs=self.options.local_epochs,
                batch_size=self.batch_size,
                lr=context.lr,
                rng=rng,
                before_step=self.gradient_hook(context, client),
            )
            updates.append(self.client_update(context, client, model, result))
        return updates

    @property
    def batch_size(self) -> int:
        """The local mini-batch size, resolved for the mode by :meth:`setup`."""
        assert self.options.local_batch_size is not None, "setup() resolves the batch size"
        return self.options.local_batch_size

    def receive(self, context: Context, client: int) -> nn.Module:
        """The client's copy of the global model (with its own buffers in ``local`` mode)."""
        model = context.trainer.receive(context.model)
        if self.bn_buffer_mode == "local" and client in self.client_buffers:
            load_into(model, self.client_buffers[client])
        return model

    def gradient_hook(self, context: Context, client: int) -> GradientHook | None:
        """A change of the local gradient before each step (none for FedAvg)."""
        return None

    def client_update(
        self, context: Context, client: int, model: nn.Module, result: LocalResult
    ) -> ClientUpdate:
        """What the client sends back: its model state and sample count; traffic: the
        model's download and upload."""
        return ClientUpdate(
            client=client,
            num_samples=len(context.federation.client_indices[client]),
            state=model.state_dict(),
            stats=RoundStats(
                steps=result.steps,
                transfers=2,
                loss_sum=result.loss_sum,
                loss_count=result.samples,
            ),
        )

    # -- aggregation ----------------------------------------------------------------------

    def aggregate(
        self, context: Context, round_: Round, updates: list[ClientUpdate]
    ) -> State | None:
        if not updates:
            return None
        new_state = self.aggregate_parameters(context, updates)
        new_state.update(self.aggregate_buffers(context, updates))
        return new_state

    def aggregate_parameters(self, context: Context, updates: list[ClientUpdate]) -> State:
        """Sample-weighted average of the parameters, handed to :meth:`server_update`."""
        states = [self.select(update, self.parameter_keys) for update in updates]
        average = weighted_average(states, [update.num_samples for update in updates])
        return self.server_update(context, average)

    def server_update(self, context: Context, average: State) -> State:
        """FedAvg: the average becomes the global parameters."""
        return average

    def aggregate_buffers(self, context: Context, updates: list[ClientUpdate]) -> State:
        """BN buffers by ``bn_buffers`` (see the class notes)."""
        if not self.buffer_keys:
            return {}
        if self.bn_buffer_mode == "average":
            states = [self.select(update, self.buffer_keys) for update in updates]
            return weighted_average(states, [update.num_samples for update in updates])
        for update in updates:
            assert update.state is not None
            self.client_buffers[update.client] = clone_state(update.state, self.buffer_keys)
        clients = sorted(self.client_buffers)
        sizes = context.federation.client_sizes
        return weighted_average(
            [self.client_buffers[client] for client in clients],
            [int(sizes[client]) for client in clients],
        )

    @staticmethod
    def select(update: ClientUpdate, keys: list[str]) -> State:
        assert update.state is not None, "averaging needs the clients' states"
        return {key: update.state[key] for key in keys}

    # -- checkpoint -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"client_buffers": {k: clone_state(v) for k, v in self.client_buffers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.client_buffers = {
            int(client): clone_state(buffers, device=self.device)
            for client, buffers in state.get("client_buffers", {}).items()
        }
