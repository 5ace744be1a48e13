"""Sequential federated learning (SFL, Li & Lyu 2023): the model passes client to client."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from stratify.baselines.common import LocalTrainingOptions
from stratify.router import ClientUpdate, Context, Round, RoundStats, Strategy


@dataclass
class SFLOptions(LocalTrainingOptions):
    """Local epochs and mini-batch size of the client holding the model."""

    algorithm = "sfl"


class SFL(Strategy):
    """Vanilla sequential FL: each round the global model visits every client once, in a
    random order, and each client trains it on all its data before passing it on.

    Options: :class:`SFLOptions`.

    Notes
    -----
    The order is a fresh permutation of the clients every round, drawn from the round's
    seeded generator. The global model itself travels, BN buffers included, so there is
    nothing to average. Traffic: one model transfer per hop, the first hop (server or
    previous round's last client → first client) included, as for Stratify's hops.
    """

    name = "sfl"
    description = "sequential model passing in random client order; each trains on all its data"
    options_class = SFLOptions
    options: SFLOptions

    def configure_rounds(
        self, context: Context, epoch: int, rng: np.random.Generator
    ) -> Iterable[Round]:
        return [Round(index=0, clients=rng.permutation(context.federation.num_clients))]

    def fit(self, context: Context, round_: Round, rng: np.random.Generator) -> list[ClientUpdate]:
        options = self.options
        assert round_.clients is not None
        assert options.local_epochs is not None and options.local_batch_size is not None
        updates = []
        for client in round_.clients.tolist():
            indices = context.federation.client_indices[client]
            # the travelling global model is trained in place
            result = context.trainer.train(
                context.model,
                indices,
                epochs=options.local_epochs,
                batch_size=options.local_batch_size,
                lr=context.lr,
                rng=rng,
                momentum=options.local_momentum or 0.0,
                weight_decay=options.local_weight_decay,
            )
            stats = RoundStats(
                steps=result.steps, transfers=1, loss_sum=result.loss_sum, loss_count=result.samples
            )
            updates.append(ClientUpdate(client=client, num_samples=len(indices), stats=stats))
        return updates
