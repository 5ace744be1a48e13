"""Sequential federated learning (SFL, Li & Lyu 2023): the model passes client to client."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from stratify.baselines.common import LocalTrainingOptions
from stratify.card import Bench, Comparison, Identity, MethodCard, Rates
from stratify.client import LocalJob, LocalResult
from stratify.compiled import CompileSwitch, StepTerms
from stratify.method import (
    Budgeted,
    ClientUpdate,
    Context,
    LocalWork,
    Round,
    RoundStats,
    Strategy,
    Vectorizable,
)
from stratify.options import Probe, inherit, option
from stratify.selection import HOPS, chain_transfers

#: The SFL paper's local mini-batch (its code's ``--batch-size 20`` in every reported run).
BATCH_SIZE = 20
#: The SFL paper's local weight decay (its code's ``--weight-decay`` default).
WEIGHT_DECAY = 1e-4

SFLOptionsT = TypeVar("SFLOptionsT", bound="SFLOptions")


@dataclass
class SFLOptions(LocalTrainingOptions):
    """Local training of the client holding the model, as the SFL paper trains it.

    Li & Lyu's experiments (their public code, ``main_cwt.py``) use plain SGD (momentum
    0) with weight decay 1e-4, mini-batches of 20 and a constant rate picked on a grid
    (0.01–0.03 for LeNet-5 on MNIST, so the run's default 0.01 is kept). Each client
    trains one pass over all its data, the "vanilla SFL" the Stratify paper compares with
    (the SFL paper itself runs K mini-batch steps per client and clips gradients at norm
    50, which a pass over the data at lr 0.01 never reaches on these models).
    """

    local_weight_decay: float = inherit(WEIGHT_DECAY)
    local_batch_size: int | None = inherit(per_mode={"batch": BATCH_SIZE})
    hops: str = option(
        "server",
        "How the model moves between two clients: relayed by the server (an upload and a "
        "download, two transfers) or sent client to client (one).",
        choices=HOPS,
        probe=Probe("direct"),
    )


class SFL(Strategy, Vectorizable, Budgeted):
    """Vanilla sequential FL: each round the global model visits every client once, in a
    random order, and each client trains it on all its data before passing it on.

    Options: :class:`SFLOptions`.

    Notes
    -----
    The order is a fresh permutation of the clients every round, drawn from the round's
    seeded generator. The global model itself travels, BN buffers included, so there is
    nothing to average. Traffic, as for Stratify's hops
    (:func:`~stratify.selection.chain_transfers`): the server sends the model to the first
    client and receives it from the last; between two clients it is relayed by the server
    (two transfers, ``--hops server``) or sent directly (one, ``--hops direct``): ``2K``
    or ``K + 1`` transfers a round for ``K`` clients.
    """

    card = MethodCard(
        Identity(
            "sfl",
            "SFL",
            "sequential model passing in random client order; each trains on all its data",
        ),
        Comparison(
            no_comparator="sfl has no base to match (its model passes through every client in turn)"
        ),
        # chosen by the `defaults` grids (docs/results/defaults-*.csv)
        rates=Rates(
            tuned={
                ("digits", "batch"): 0.1,
                ("digits", "single-sample"): 0.03,
                ("mnist", "batch"): 0.03,
                ("mnist", "single-sample"): 0.003,
            }
        ),
        bench=Bench(benchmark_local=True, step_size_options=("local_momentum",)),
    )
    options_class = SFLOptions
    options: SFLOptions

    def setup(self, context: Context) -> None:
        super().setup(context)
        self.compile_switch = CompileSwitch(
            self.options.compile if context.mode == "single-sample" else "off"
        )

    def configure_rounds(
        self, context: Context, epoch: int, rng: np.random.Generator
    ) -> Iterable[Round]:
        return [Round(clients=rng.permutation(context.federation.num_clients))]

    def planned_sample_gradients(self, client_sizes: list[int]) -> float | None:
        """Every client's ``E · n_k``: each trains on all its data, every round."""
        assert self.options.local_epochs is not None
        return float(self.options.local_epochs * sum(client_sizes))

    def fit(self, context: Context, round_: Round, rng: np.random.Generator) -> list[ClientUpdate]:
        options = self.options
        assert round_.clients is not None
        assert options.local_epochs is not None and options.local_batch_size is not None
        updates = []
        for client in round_.clients.tolist():
            # the travelling global model is trained in place
            result = context.trainer.train(
                context.model,
                context.federation.client_indices[client],
                epochs=options.local_epochs,
                batch_size=options.local_batch_size,
                lr=context.lr,
                rng=rng,
                momentum=options.local_momentum or 0.0,
                weight_decay=options.local_weight_decay,
                compile=self.compile_switch,
            )
            updates.append(self.hop_update(context, client, result))
        self.count_chain(updates)
        self.compile_switch.count(sum(update.stats.steps for update in updates))
        return updates

    @staticmethod
    def hop_update(context: Context, client: int, result: LocalResult) -> ClientUpdate:
        """A hop's counters: the client's local training (the chain's transfers are
        counted once for the round, :meth:`count_chain`)."""
        stats = RoundStats(
            steps=result.steps,
            loss_sum=result.loss_sum,
            loss_count=result.samples,
            sample_gradients=result.samples,
        )
        return ClientUpdate(
            client=client, num_samples=len(context.federation.client_indices[client]), stats=stats
        )

    def count_chain(self, updates: list[ClientUpdate]) -> None:
        """The round's chain, from the server through every client and back
        (:func:`~stratify.selection.chain_transfers`), on its first update."""
        if updates:
            updates[0].stats.transfers = chain_transfers(len(updates), self.options.hops)

    def step_terms(self, mode: str) -> StepTerms | None:
        """Single-sample hops as jobs: the local momentum and weight decay."""
        if mode != "single-sample":
            return None
        options = self.options.for_mode(mode)
        return StepTerms(
            momentum=(options.local_momentum or 0.0) > 0,
            weight_decay=options.local_weight_decay > 0,
        )

    def local_work(
        self, context: Context, round_: Round, rng: np.random.Generator
    ) -> LocalWork | None:
        """Each client's pass as one job on the travelling model, in the round's order
        (each continues from the one before; a fresh optimizer each, as in :meth:`fit`)."""
        if context.mode != "single-sample" or any(True for _ in context.model.buffers()):
            return None
        options = self.options
        assert round_.clients is not None and options.local_epochs is not None
        clients = round_.clients.tolist()
        jobs: list[LocalJob] = [
            context.trainer.job(
                context.model,
                context.federation.client_indices[client],
                epochs=options.local_epochs,
                lr=context.lr,
                rng=rng,
                momentum=options.local_momentum or 0.0,
                weight_decay=options.local_weight_decay,
            )
            for client in clients
        ]

        def finish() -> list[ClientUpdate]:
            updates = [
                self.hop_update(context, client, job.result()) for client, job in zip(clients, jobs)
            ]
            self.count_chain(updates)
            self.compile_switch.count(sum(update.stats.steps for update in updates))
            return updates

        return LocalWork(jobs, finish)

    def state_dict(self) -> dict[str, Any]:
        return self.compile_switch.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.compile_switch.load_state_dict(state)
