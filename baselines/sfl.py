"""Sequential federated learning (SFL, Li & Lyu 2023): the model passes client to client."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from baselines.common import check_positive_int, resolve_batch_size
from stratify.router import ClientUpdate, Round, Router, Strategy


class SFL(Strategy):
    """Vanilla sequential FL: each round the global model visits every client once, in a
    random order, and each client trains it on all its data before passing it on.

    Parameters
    ----------
    local_epochs : int
        Passes each client makes over its own data when it holds the model.
    local_batch_size : int, optional
        Local mini-batch size; ``None`` means 1 in ``--mode single-sample`` (the only size
        that mode allows) and 64 in ``--mode batch``.

    Notes
    -----
    The order is a fresh permutation of the clients every round, drawn from the round's
    seeded generator. The global model itself travels, BN buffers included, so there is
    nothing to average. Traffic: one model transfer per hop, the first hop (server or
    previous round's last client → first client) included, as for Stratify's hops.
    """

    name = "sfl"
    description = "sequential model passing in random client order; each trains on all its data"

    def __init__(self, local_epochs: int = 1, local_batch_size: int | None = None) -> None:
        self.local_epochs = check_positive_int(local_epochs, "--local-epochs")
        self.local_batch_size = (
            None
            if local_batch_size is None
            else check_positive_int(local_batch_size, "--local-batch-size")
        )

    def setup(self, router: Router) -> None:
        self.batch_size = resolve_batch_size(self.local_batch_size, router.mode, self.name)

    def configure_rounds(
        self, router: Router, epoch: int, rng: np.random.Generator
    ) -> Iterable[Round]:
        return [Round(index=0, clients=rng.permutation(router.federation.num_clients))]

    def fit(self, router: Router, round_: Round, rng: np.random.Generator) -> list[ClientUpdate]:
        for client in round_.clients.tolist():
            router.count_transfers(1)
            router.local_sgd(
                router.model,
                router.federation.client_indices[client],
                self.local_epochs,
                self.batch_size,
                rng,
            )
        return []
