"""FedTAN (Wang et al. 2023): FedAvg whose BatchNorm uses cross-client statistics in lockstep.

In every local step, each BN layer of every participating client normalises with the
*mean of the clients' batch statistics* (mean of the per-client means, mean of the
per-client biased variances: the ``client-mean`` combine mode of
:class:`stratify.nn.norm.SumBatchNorm`), and the gradient flows back through those
shared statistics to every client. The clients' weights diverge during the local steps,
so one forward over the union batch would not be exact; instead each client runs its
forward on its own model copy in its own thread, and its BN layers meet the other
clients' at a :class:`threading.Barrier` to exchange statistics
(:class:`StatisticsExchange`). The loss of the step is the sum of the clients' mean
losses; one backward over it (the autograd graph spans the threads) gives every client
its own gradient, including the terms that reach it through the shared statistics.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from stratify.baselines.common import ClientSamplingOptions
from stratify.baselines.fedavg import FedAvg
from stratify.client import LocalResult
from stratify.errors import ConfigError, TrainingError
from stratify.nn.norm import (
    BatchNormLayer,
    has_batch_norm,
    is_batch_norm,
    update_running_stats,
)
from stratify.router import ClientUpdate, Context

#: Seconds a BN layer waits for the other clients before the step is declared broken.
BARRIER_TIMEOUT = 600.0


@dataclass
class FedTANOptions(ClientSamplingOptions):
    """FedAvg's options without ``bn_buffers``: the clients' running statistics stay equal."""

    algorithm = "fedtan"


def client_mean_statistics(
    means: torch.Tensor, variances: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """FedTAN's global statistics: the unweighted mean over clients of ``(K, C)`` means and
    biased variances."""
    return means.mean(0), variances.mean(0)


class StatisticsExchange:
    """The meeting point of the participants' BN layers during one lockstep step.

    Parameters
    ----------
    num_clients : int
        Participants; every one of them must reach every BN call of the forward pass.
    timeout : float
        Seconds a layer waits for the others before the barrier breaks.

    Notes
    -----
    Slots are keyed by the index of the BN call within a client's forward pass, so a fast
    client writing the next layer's statistics never overwrites a slot a slower client
    still reads. :meth:`reset` clears them between steps.
    """

    def __init__(self, num_clients: int, timeout: float = BARRIER_TIMEOUT) -> None:
        self.num_clients = num_clients
        self.barrier = threading.Barrier(num_clients, timeout=timeout)
        self.lock = threading.Lock()
        self.slots: dict[int, list] = {}

    def reset(self) -> None:
        self.slots = {}

    def exchange(
        self, call: int, slot: int, mean: torch.Tensor, var: torch.Tensor, count: int
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Deposit one client's statistics, wait for all, return the combined ones.

        Returns
        -------
        tuple
            Mean over clients of the means, of the biased variances, and the total number
            of values per channel (for the unbiased running variance).
        """
        with self.lock:
            entries = self.slots.setdefault(call, [None] * self.num_clients)
        entries[slot] = (mean, var, count)
        self.barrier.wait()
        mean, var = client_mean_statistics(
            torch.stack([entry[0] for entry in entries]),
            torch.stack([entry[1] for entry in entries]),
        )
        return mean, var, sum(entry[2] for entry in entries)

    def abort(self) -> None:
        self.barrier.abort()


class LockstepBatchNorm:
    """Replaces the ``forward`` of one BN layer in one client's model copy.

    In training mode it computes the client's batch mean and biased variance per
    channel, exchanges them, normalises with the clients' mean statistics and updates the
    running statistics as ``nn.BatchNorm`` does (unbiased variance over all clients'
    values). Outside training the layer's own forward runs unchanged.
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
        client_mean = values.mean(dims)
        client_var = (values - client_mean.view(shape)).square().mean(dims)
        call = self.client.calls
        self.client.calls += 1
        mean, var, total = self.client.exchange.exchange(
            call, self.client.slot, client_mean, client_var, count
        )
        if total <= self.client.exchange.num_clients:
            # every client saw one value per channel: all client variances are zero
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
    """A client's mini-batches, pass after pass, each pass a fresh shuffle."""
    while True:
        order = rng.permutation(indices)
        for start in range(0, len(order), batch_size):
            yield order[start : start + batch_size]


class FedTAN(FedAvg):
    """FedAvg whose BatchNorm layers share the clients' mean batch statistics in lockstep.

    Options (:class:`FedTANOptions`): ``local_epochs`` — all participants step together,
    so a round has ``local_epochs × max_k ceil(n_k / B)`` lockstep steps: the largest
    client makes ``local_epochs`` passes and smaller clients continue with fresh shuffles
    of their data until the round ends; ``local_batch_size`` — 1 in single-sample mode
    (BN then normalises over the spatial positions of one image per client), 64 by
    default in batch mode; ``client_fraction``.

    Notes
    -----
    Needs a model with BatchNorm layers (``--model resnet9|resnet18|resnet20`` with
    ``--norm bn`` or ``--norm sumbn-client-mean``); on a model without them FedTAN would
    be FedAvg, so it is refused. Because every client normalises with the same
    statistics, their running statistics stay identical and are simply averaged like the
    parameters (there is no ``--bn-buffers`` choice to make). Traffic: the model
    download and upload of FedAvg; the per-layer statistic exchanges (a few ``C``-sized
    vectors per layer and step) are not counted as model transfers.
    """

    name = "fedtan"
    description = "FedAvg whose BN uses the mean of client batch statistics, in lockstep steps"
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
        steps = self.local_epochs * max(math.ceil(size / self.batch_size) for size in sizes)
        x_train, y_train = context.x_train, context.y_train
        loss_sums = torch.zeros(len(clients), dtype=torch.float64, device=context.device)
        samples = [0] * len(clients)

        def client_loss(slot: int, batch: torch.Tensor) -> torch.Tensor:
            try:
                return F.cross_entropy(models[slot](x_train[batch]), y_train[batch])
            except BaseException:
                exchange.abort()  # release the clients waiting at the barrier
                raise

        try:
            with ThreadPoolExecutor(max_workers=len(clients)) as pool:
                for _ in range(steps):
                    batches = [
                        torch.as_tensor(next(stream), device=context.device) for stream in streams
                    ]
                    exchange.reset()
                    for seat in seats:
                        seat.calls = 0
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
                            loss_sums[slot] += loss.detach() * len(batch)
                            samples[slot] += len(batch)
        finally:
            for model in models:
                detach_lockstep(model)
        return [
            self.client_update(
                context, client, model, LocalResult(steps, float(loss_sums[slot]), samples[slot])
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
