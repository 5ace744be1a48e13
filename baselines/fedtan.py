"""FedTAN (Wang et al. 2023): FedAvg whose BatchNorm uses cross-client statistics.

As the authors' code computes them (``nets/Sub_ResNet20.py`` and ``FedTAN.py`` of
wangyanmeng/FedTAN), every BN layer of every participant normalises with shared
statistics built in two exchanges: the clients' batch means are averaged into a global
mean; each client then computes its biased variance *around that global mean*, and those
variances are averaged. For clients with equal batch sizes this is exactly BatchNorm on
the union batch. The gradient flows back through the shared statistics to every client.

Only the first local step of a round exchanges statistics (the official code's
``first_local_updating``); the remaining local steps run on each client alone with its
own batch statistics, as ordinary local training. During the shared step the clients'
forwards run each on its own model copy in its own thread, and their BN layers meet at a
:class:`threading.Barrier` (:class:`StatisticsExchange`). The loss of the step is the sum
of the clients' mean losses; one backward over it (the autograd graph spans the threads)
gives every client its own gradient, including the terms that reach it through the
shared statistics.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from stratify.baselines.common import ClientSamplingOptions
from stratify.baselines.fedavg import FedAvg
from stratify.card import Bench, Comparison, Identity, MethodCard, Paper, Rates
from stratify.client import LocalResult, batch_bounds
from stratify.errors import ConfigError, TrainingError
from stratify.method import ClientUpdate, Context
from stratify.nn.norm import (
    BatchNormLayer,
    has_batch_norm,
    is_batch_norm,
    update_running_stats,
)
from stratify.options import inherit

#: The official code's local mini-batch (args.py of wangyanmeng/FedTAN).
BATCH_SIZE = 128

FedTANOptionsT = TypeVar("FedTANOptionsT", bound="FedTANOptions")

#: Seconds a BN layer waits for the other clients before the step is declared broken.
BARRIER_TIMEOUT = 600.0


@dataclass
class FedTANOptions(ClientSamplingOptions):
    """FedAvg's options without ``bn_buffers`` (the clients' running statistics stay
    equal), with the official code's local SGD: momentum 0.9, weight decay 1e-4 and, in
    batch mode, batch 128 (its 5 local steps per round at lr 0.5 map to ``local_epochs``
    passes and the run's ``--lr`` here)."""

    local_momentum: float | None = inherit(0.9)
    local_weight_decay: float = inherit(1e-4)
    local_batch_size: int | None = inherit(per_mode={"batch": BATCH_SIZE})


class StatisticsExchange:
    """The meeting point of the participants' BN layers during the shared step.

    Parameters
    ----------
    num_clients : int
        Participants; every one of them must reach every BN call of the forward pass.
    timeout : float
        Seconds a layer waits for the others before the barrier breaks.

    Notes
    -----
    Slots are keyed by the BN call's index within a client's forward pass and by the
    phase (mean, then variance), so a fast client writing the next statistic never
    overwrites a slot a slower client still reads. :meth:`reset` clears them between steps.
    """

    def __init__(self, num_clients: int, timeout: float = BARRIER_TIMEOUT) -> None:
        self.num_clients = num_clients
        self.barrier = threading.Barrier(num_clients, timeout=timeout)
        self.lock = threading.Lock()
        self.slots: dict[tuple[int, str], list] = {}

    def reset(self) -> None:
        self.slots = {}

    def average(
        self, key: tuple[int, str], slot: int, value: torch.Tensor, count: int
    ) -> tuple[torch.Tensor, int]:
        """Deposit one client's per-channel statistic, wait for all, return their
        unweighted mean over clients and the clients' total number of values per channel."""
        with self.lock:
            entries = self.slots.setdefault(key, [None] * self.num_clients)
        entries[slot] = (value, count)
        self.barrier.wait()
        mean = torch.stack([entry[0] for entry in entries]).mean(0)
        return mean, sum(entry[1] for entry in entries)

    def abort(self) -> None:
        self.barrier.abort()


class LockstepBatchNorm:
    """Replaces the ``forward`` of one BN layer in one client's model copy.

    In training mode it exchanges the client's batch mean, then its biased variance
    around the resulting global mean (:class:`StatisticsExchange`), normalises with the
    shared statistics and updates the running statistics as ``nn.BatchNorm`` does
    (unbiased variance over all clients' values). Outside training the layer's own
    forward runs unchanged.
    """

    def __init__(self, module: nn.Module, client: _ClientContext) -> None:
        self.module = module
        self.client = client

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        module = self.module
        if not module.training:
            return type(module).forward(module, x)
        assert isinstance(module, BatchNormLayer)  # attach_lockstep wraps only BN layers
        channels = x.shape[1]
        dims = [0, *range(2, x.dim())]
        shape = [1, channels] + [1] * (x.dim() - 2)
        count = x.numel() // channels
        stats_dtype = torch.float32 if x.device.type == "mps" else torch.float64
        values = x.to(stats_dtype)
        call = self.client.calls
        self.client.calls += 1
        exchange, slot = self.client.exchange, self.client.slot
        mean, total = exchange.average((call, "mean"), slot, values.mean(dims), count)
        client_var = (values - mean.view(shape)).square().mean(dims)
        var, _ = exchange.average((call, "var"), slot, client_var, count)
        if total <= exchange.num_clients:
            # every client saw one value per channel: the statistics are meaningless
            raise ConfigError(
                "fedtan: a BatchNorm layer sees one value per channel per client "
                f"(input {tuple(x.shape)}); use --mode batch or a larger --local-batch-size"
            )
        invstd = torch.rsqrt(var + module.eps)
        y = (x - mean.to(x.dtype).view(shape)) * invstd.to(x.dtype).view(shape)
        if module.weight is not None:
            y = y * module.weight.view(shape)
        if module.bias is not None:
            y = y + module.bias.view(shape)
        if module.track_running_stats and module.running_mean is not None:
            update_running_stats(module, mean.detach(), var.detach(), total)
        return y


class _ClientContext:
    """One participant's seat in a lockstep round."""

    def __init__(self, exchange: StatisticsExchange, slot: int) -> None:
        self.exchange = exchange
        self.slot = slot
        self.calls = 0


def attach_lockstep(model: nn.Module, context: _ClientContext) -> int:
    """Route every BN layer of ``model`` through ``context``'s exchange; returns how many."""
    layers = [module for module in model.modules() if is_batch_norm(module)]
    for module in layers:
        module.forward = LockstepBatchNorm(module, context)
    return len(layers)


def detach_lockstep(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), LockstepBatchNorm):
            del module.forward


def batch_stream(
    indices: np.ndarray, batch_size: int, rng: np.random.Generator
) -> Iterator[np.ndarray]:
    """A client's mini-batches, pass after pass, each pass a fresh shuffle; a last batch
    of one sample joins the one before it (BatchNorm cannot normalise one sample)."""
    bounds = batch_bounds(len(indices), batch_size, merge_singleton=True)
    while True:
        order = rng.permutation(indices)
        for start, stop in bounds:
            yield order[start:stop]


class FedTAN(FedAvg):
    """FedAvg whose BatchNorm layers share the clients' batch statistics in the first
    local step of every round.

    Options (:class:`FedTANOptions`): ``local_epochs`` — client k makes
    ``local_epochs × ceil(n_k / B)`` local steps per round; the first is taken by all
    participants together with shared statistics, the others each client alone;
    ``local_batch_size`` (128, the official code's), ``local_momentum`` (0.9),
    ``local_weight_decay`` (1e-4), ``client_fraction``, ``weighting``. It runs in batch
    mode only: a batch of one sample has no batch statistics to share.

    Notes
    -----
    Needs a model with BatchNorm layers (``--model resnet9|resnet18|resnet20`` with
    ``--norm bn`` or ``--norm sumbn-client-mean``); on a model without them FedTAN would
    be FedAvg, so it is refused. The official code counts local *steps* (5, sampled with
    replacement); here they are local epochs of shuffled mini-batches, like the other
    baselines. Its running variance uses the correction ``B / (B − 1)`` with the number of
    images ``B``; here it is torch's, over all values of a channel. Running statistics
    are averaged like the parameters (there is no ``--bn-buffers`` choice to make).
    Traffic: the model download and upload of FedAvg; the statistic exchanges (two
    ``C``-sized vectors per BN layer in the shared step) are not counted as transfers.
    """

    card = MethodCard(
        Identity(
            "fedtan",
            "FedTAN",
            "FedAvg whose BN shares the clients' batch statistics in each round's first step",
            # BatchNorm needs more than one sample: single-sample learning has no place for it
            modes=("batch",),
        ),
        Comparison("fedavg"),
        paper=Paper(requires_batch_norm=True),
        # no `defaults` grid runs it: the grids' simple CNN has no BatchNorm layer
        rates=Rates(tuned=None),
        bench=Bench(step_size_options=("local_momentum",)),
    )
    options_class = FedTANOptions  # type: ignore[assignment]
    options: FedTANOptions  # type: ignore[assignment]

    @property
    def bn_buffer_mode(self) -> str:
        return "average"

    def setup(self, context: Context) -> None:
        super().setup(context)
        if not has_batch_norm(context.model):
            raise ConfigError(
                "fedtan needs a model with BatchNorm layers (e.g. --model resnet20 --norm bn); "
                "without them it is fedavg"
            )

    def local_round(
        self, context: Context, clients: list[int], rng: np.random.Generator
    ) -> list[ClientUpdate]:
        exchange = StatisticsExchange(len(clients))
        models, seats, optimizers, streams = [], [], [], []
        for slot, client in enumerate(clients):
            model = self.receive(context, client)
            model.train()
            seat = _ClientContext(exchange, slot)
            attach_lockstep(model, seat)
            models.append(model)
            seats.append(seat)
            optimizers.append(
                torch.optim.SGD(
                    model.parameters(),
                    lr=context.lr,
                    momentum=self.local_momentum,
                    weight_decay=self.options.local_weight_decay,
                )
            )
            streams.append(
                batch_stream(context.federation.client_indices[client], self.batch_size, rng)
            )
        sizes = [len(context.federation.client_indices[client]) for client in clients]
        steps = [
            self.local_epochs * len(batch_bounds(size, self.batch_size, merge_singleton=True))
            for size in sizes
        ]
        x_train, y_train = context.x_train, context.y_train
        loss_sums = torch.zeros(len(clients), dtype=torch.float64, device=context.device)
        samples = [0] * len(clients)

        def client_loss(slot: int, batch: torch.Tensor) -> torch.Tensor:
            try:
                return F.cross_entropy(models[slot](x_train[batch]), y_train[batch])
            except BaseException:
                exchange.abort()  # release the clients waiting at the barrier
                raise

        def count(slot: int, loss: torch.Tensor, batch: torch.Tensor) -> None:
            loss_sums[slot] += loss.detach() * len(batch)
            samples[slot] += len(batch)

        try:
            # the shared step: every participant at once, BN statistics exchanged
            batches = [torch.as_tensor(next(stream), device=context.device) for stream in streams]
            with ThreadPoolExecutor(max_workers=len(clients)) as pool:
                futures = [
                    pool.submit(client_loss, slot, batch) for slot, batch in enumerate(batches)
                ]
                losses = self._gather(futures)
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=False)
            torch.stack(losses).sum().backward()
            for optimizer in optimizers:
                optimizer.step()
            with torch.no_grad():
                for slot, (loss, batch) in enumerate(zip(losses, batches)):
                    count(slot, loss, batch)
        finally:
            for model in models:
                detach_lockstep(model)
        # the remaining steps: each client alone, with its own batch statistics
        for slot, (model, optimizer, stream) in enumerate(zip(models, optimizers, streams)):
            for _ in range(steps[slot] - 1):
                batch = torch.as_tensor(next(stream), device=context.device)
                loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
                optimizer.zero_grad(set_to_none=False)
                loss.backward()
                optimizer.step()
                with torch.no_grad():
                    count(slot, loss, batch)
        return [
            self.client_update(
                context,
                client,
                model,
                LocalResult(steps[slot], float(loss_sums[slot]), samples[slot]),
            )
            for slot, (client, model) in enumerate(zip(clients, models))
        ]

    @staticmethod
    def _gather(futures: list[Future]) -> list[torch.Tensor]:
        results, errors = [], []
        for future in futures:
            try:
                results.append(future.result())
            except BaseException as error:  # noqa: BLE001 - re-raised below
                errors.append(error)
        if errors:
            primary = next(
                (e for e in errors if not isinstance(e, threading.BrokenBarrierError)), None
            )
            if primary is not None:
                raise primary
            raise TrainingError(
                "fedtan: the clients' BatchNorm layers fell out of lockstep (barrier broken)"
            )
        return results
