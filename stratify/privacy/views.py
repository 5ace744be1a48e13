"""What the server sees of the training messages: a recorder around a client trainer.

The boundary between the clients and the server is the trainer
(:class:`~stratify.client.LocalTrainer`, docs/architecture.md, "Client side"): whatever
its methods hand back is what leaves the clients. :class:`RecordingTrainer` wraps any
trainer with that interface (the in-process one, a differentially private one, Flower's
remote one) and keeps, message by message, exactly what would cross to the server:

- a global batch (``--mode batch``): every client's share's summed-loss gradient, one
  message per share, as a Flower node's ``train.gradient`` reply is (the in-process
  trainer fuses the shares into one tensor; the recorder asks the wrapped trainer share
  by share, so the shares stay separate and their sum is the same gradient);
- a single-sample hop: the travelling model before and after the hop's steps, as the
  relaying server (``--hops server``) holds it;
- a baseline's local round: the model sent and the model returned.

Every message carries the placeholders of its samples' positions, which the server
knows (it scheduled them), never the real labels. The real labels and inputs are kept
apart in :class:`Truth`, for scoring an attack only.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from stratify.client import (
    GradientHook,
    LocalResult,
    LocalTrainer,
    LossFunction,
    cross_entropy_loss,
)
from stratify.compiled import CompileSwitch
from stratify.federation import Federation
from stratify.nn.norm import has_batch_norm
from stratify.registry.base import RegistryResult

#: parameters by name, detached copies
Parameters = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ShareGradient:
    """One client's share of a global batch: the summed-loss gradient it sends.

    Parameters
    ----------
    batch : int
        Index of the global batch in the run (0, 1, ...).
    client : int
        The client (``-1``: a sum over clients, as secure aggregation shows it).
    positions : numpy.ndarray
        The share's sample indices, as the server sent them.
    placeholders : numpy.ndarray
        The placeholder of every position (what the server knows of its label).
    gradient : dict of str to torch.Tensor
        ``∇ Σ_{i ∈ share} loss_i`` per recorded parameter, as it left the client.
    """

    batch: int
    client: int
    positions: np.ndarray
    placeholders: np.ndarray
    gradient: Parameters

    def summed_gradient(self) -> Parameters:
        """The share's summed-loss gradient (the message itself)."""
        return self.gradient


@dataclass(frozen=True)
class HopUpdate:
    """One single-sample hop: the travelling model before and after one client's steps.

    Parameters
    ----------
    client : int
        The client that stepped.
    positions, placeholders : numpy.ndarray
        Its samples, one step each, in order, and their placeholders.
    before, after : dict of str to torch.Tensor
        The recorded parameters as the model left and came back to the server.
    lr : float
        The hop's learning rate (the server sets it).
    """

    client: int
    positions: np.ndarray
    placeholders: np.ndarray
    before: Parameters
    after: Parameters
    lr: float

    def summed_gradient(self) -> Parameters:
        """``(before − after) / lr``: under plain SGD, the sum of the hop's step gradients
        (each at the model its step saw); for a one-step hop exactly that step's gradient."""
        return {name: (self.before[name] - self.after[name]) / self.lr for name in self.before}


@dataclass(frozen=True)
class RoundUpdate:
    """One baseline client's local round: the model sent and the model returned.

    Parameters
    ----------
    client : int
        The client.
    positions, placeholders : numpy.ndarray
        Its training samples and their placeholders.
    before, after : dict of str to torch.Tensor
        The recorded parameters sent and returned.
    lr : float
        Local learning rate.
    epochs, batch_size : int
        Local epochs and mini-batch size.
    """

    client: int
    positions: np.ndarray
    placeholders: np.ndarray
    before: Parameters
    after: Parameters
    lr: float
    epochs: int
    batch_size: int

    def summed_gradient(self) -> Parameters:
        """``(before − after) / lr``: under plain local SGD, the sum of the round's
        mini-batch mean gradients, each at the model its step saw (a method's own terms,
        FedProx's or SCAFFOLD's, are in it too); its head-bias entries are negative at
        the labels the client's samples hold while the model has not fitted them."""
        return {name: (self.before[name] - self.after[name]) / self.lr for name in self.before}


#: a message that carries a gradient (or an update that gives one)
GradientMessage = ShareGradient | HopUpdate | RoundUpdate


@dataclass
class ServerView:
    """Every training message the server received in a run, in order.

    Parameters
    ----------
    num_placeholders : int
        The registry's placeholders ``U``.
    shares, hops, rounds : list
        The messages of each kind (:class:`ShareGradient`, :class:`HopUpdate`,
        :class:`RoundUpdate`).
    """

    num_placeholders: int
    shares: list[ShareGradient] = field(default_factory=list)
    #: global batch -> the model's mean predicted probabilities on the server's public
    #: inputs when that batch was asked for (:class:`RecordingTrainer`'s ``probe``): what
    #: the server computes itself from the model it holds
    predictions: dict[int, np.ndarray] = field(default_factory=dict)
    hops: list[HopUpdate] = field(default_factory=list)
    rounds: list[RoundUpdate] = field(default_factory=list)

    def gradient_messages(self) -> list[GradientMessage]:
        """The shares, the hops and the baselines' rounds: the messages an attack reads a
        gradient from."""
        return [*self.shares, *self.hops, *self.rounds]

    def aggregated(self) -> ServerView:
        """What a server behind secure aggregation sees: each global batch's shares
        summed into one message (``client = -1``), no single share; hops and rounds are
        not aggregated (none of this repository's secure aggregation covers them) and
        are dropped from this view."""
        by_batch: dict[int, list[ShareGradient]] = {}
        for share in self.shares:
            by_batch.setdefault(share.batch, []).append(share)
        summed = [
            ShareGradient(
                batch,
                -1,
                np.concatenate([share.positions for share in shares]),
                np.concatenate([share.placeholders for share in shares]),
                {
                    name: torch.stack([share.gradient[name] for share in shares]).sum(0)
                    for name in shares[0].gradient
                },
            )
            for batch, shares in by_batch.items()
        ]
        return ServerView(self.num_placeholders, shares=summed)


@dataclass(frozen=True)
class Truth:
    """What the server does not know, for scoring an attack.

    Parameters
    ----------
    placeholder_labels : numpy.ndarray
        ``placeholder_labels[p]``: the real label (the model's output row) of placeholder
        ``p``.
    x_train, y_train : torch.Tensor
        The training inputs and real labels, indexed by position.
    """

    placeholder_labels: np.ndarray
    x_train: torch.Tensor
    y_train: torch.Tensor


def placeholder_labels(placeholders: RegistryResult) -> np.ndarray:
    """The real label of every placeholder, from the clients' maps (label → placeholder).

    Parameters
    ----------
    placeholders : RegistryResult
        A registration's result.
    """
    labels = np.full(placeholders.num_placeholders, -1, dtype=np.int64)
    for client_map in placeholders.client_maps:
        for label, placeholder in client_map.items():
            labels[placeholder] = int(label)  # type: ignore[call-overload]
    return labels


def snapshot(model: nn.Module, names: Collection[str] | None = None) -> Parameters:
    """Detached copies of ``model``'s parameters (only ``names`` where given)."""
    return {
        name: parameter.detach().clone()
        for name, parameter in model.named_parameters()
        if names is None or name in names
    }


def runs_of(owners: np.ndarray) -> list[np.ndarray]:
    """Index runs of consecutive equal ``owners`` entries: one hop or one share each.

    Parameters
    ----------
    owners : numpy.ndarray
        The client of every entry.
    """
    if len(owners) == 0:
        return []
    return np.split(np.arange(len(owners)), np.flatnonzero(np.diff(owners)) + 1)


class RecordingTrainer(LocalTrainer):
    """Any trainer, with what leaves its clients recorded as the server sees it.

    Every method is the wrapped trainer's; the recorder only splits a call into the
    messages a deployment sends (a batch into shares, a run of steps into hops) and
    copies what each one hands back. A defence applied inside the wrapped trainer's
    methods (clipping, noise) is therefore in the record.

    Parameters
    ----------
    inner : LocalTrainer
        The trainer whose messages are recorded.
    parameters : collection of str, optional
        Parameter names to record (default: all). Attacks read few (the head's bias, the
        first layer); recording only those keeps long runs in memory.
    probe : torch.Tensor, optional
        Inputs the server holds (its test split): before each global batch the model's
        mean predicted probabilities on them are recorded
        (:attr:`ServerView.predictions`), as the server can compute them; the count
        attack on batch sums reads them (docs/privacy.md, "Threat model").
    """

    #: no compiled or vectorised step may train around the recorder: every single-sample
    #: step goes through :meth:`single_sample_steps`
    holds_samples = False

    def __init__(
        self,
        inner: LocalTrainer,
        parameters: Collection[str] | None = None,
        probe: torch.Tensor | None = None,
    ) -> None:
        super().__init__(inner.x_train, inner.y_train)
        self.inner = inner
        self.parameters = None if parameters is None else set(parameters)
        self.probe = probe
        self.sample_clients: np.ndarray | None = None
        self.sample_placeholders: np.ndarray | None = None
        self.view = ServerView(0)
        self.batches = 0

    def attach(self, federation: Federation, placeholders: RegistryResult) -> None:
        """Learn the run's clients and placeholders (the server's knowledge), once the
        experiment is built and before it trains.

        Parameters
        ----------
        federation : Federation
            The run's clients.
        placeholders : RegistryResult
            The registration's result.
        """
        self.sample_clients = federation.sample_clients()
        self.sample_placeholders = federation.sample_placeholders(placeholders)
        self.view = ServerView(placeholders.num_placeholders)

    def _placeholders(self, positions: np.ndarray) -> np.ndarray:
        if self.sample_placeholders is None:
            raise RuntimeError("RecordingTrainer.attach must be called before training")
        return self.sample_placeholders[positions]

    def single_sample_steps(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, indices: list[int], lr: float
    ) -> list[torch.Tensor]:
        """The wrapped trainer's steps, hop by hop (one run of consecutive samples of one
        client each), the model recorded before and after every hop."""
        if self.sample_clients is None:
            raise RuntimeError("RecordingTrainer.attach must be called before training")
        samples = np.asarray(indices, dtype=np.int64)
        losses: list[torch.Tensor] = []
        for run in runs_of(self.sample_clients[samples]):
            positions = samples[run]
            before = snapshot(model, self.parameters)
            losses += self.inner.single_sample_steps(model, optimizer, positions.tolist(), lr)
            self.view.hops.append(
                HopUpdate(
                    int(self.sample_clients[positions[0]]),
                    positions,
                    self._placeholders(positions),
                    before,
                    snapshot(model, self.parameters),
                    lr,
                )
            )
        return losses

    def batch_gradient(
        self,
        model: nn.Module,
        samples: np.ndarray,
        clients: np.ndarray,
        fused: bool = True,
        divisor: int | None = None,
    ) -> float:
        """The wrapped trainer's gradient of one global batch, asked for share by share
        (each share's summed-loss gradient recorded), added up and divided by the batch
        size into ``.grad`` as the wrapped trainer would. A model with batch-statistics
        norms couples the shares: it runs as one call, and its shares are not recorded
        (their exchange is :mod:`stratify.privacy.batchnorm`'s)."""
        if has_batch_norm(model):
            return self.inner.batch_gradient(model, samples, clients, fused, divisor)
        scale = len(samples) if divisor is None else divisor
        parameters = list(model.named_parameters())
        held = [None if p.grad is None else p.grad.detach().clone() for _, p in parameters]
        total = [torch.zeros_like(p) for _, p in parameters]
        loss = 0.0
        batch = self.batches
        self.batches += 1
        if self.probe is not None:
            with torch.no_grad():
                probabilities = torch.softmax(model(self.probe), dim=1).mean(0)
            self.view.predictions[batch] = probabilities.cpu().numpy().astype(np.float64)
        for run in runs_of(clients):
            for _, parameter in parameters:
                parameter.grad = None
            loss += self.inner.batch_gradient(model, samples[run], clients[run], fused, divisor=1)
            gradient = {
                name: (
                    torch.zeros_like(parameter)
                    if parameter.grad is None
                    else parameter.grad.detach().clone()
                )
                for name, parameter in parameters
            }
            for index, (name, _) in enumerate(parameters):
                total[index] += gradient[name]
            positions = samples[run]
            self.view.shares.append(
                ShareGradient(
                    batch,
                    int(clients[run[0]]),
                    positions,
                    self._placeholders(positions),
                    {
                        name: value
                        for name, value in gradient.items()
                        if self.parameters is None or name in self.parameters
                    },
                )
            )
        with torch.no_grad():
            for (_, parameter), before, summed in zip(parameters, held, total):
                parameter.grad = summed / scale if before is None else before + summed / scale
        return loss

    def trained_samples(self, clients: np.ndarray) -> int:
        return self.inner.trained_samples(clients)

    def epoch_orders(
        self, indices: np.ndarray | Sequence[np.ndarray], epochs: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        return self.inner.epoch_orders(indices, epochs, rng)

    def train(
        self,
        model: nn.Module,
        indices: np.ndarray | Sequence[np.ndarray],
        *,
        epochs: int,
        batch_size: int,
        lr: float,
        rng: np.random.Generator,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        before_step: GradientHook | None = None,
        loss_fn: LossFunction = cross_entropy_loss,
        compile: CompileSwitch | None = None,
    ) -> LocalResult:
        """The wrapped trainer's local round, the model recorded as sent and returned."""
        before = snapshot(model, self.parameters)
        result = self.inner.train(
            model,
            indices,
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            rng=rng,
            momentum=momentum,
            weight_decay=weight_decay,
            before_step=before_step,
            loss_fn=loss_fn,
            compile=compile,
        )
        positions = np.unique(
            np.concatenate([indices] if isinstance(indices, np.ndarray) else list(indices))
        )
        if self.sample_clients is None:
            raise RuntimeError("RecordingTrainer.attach must be called before training")
        self.view.rounds.append(
            RoundUpdate(
                int(self.sample_clients[positions[0]]),
                positions,
                self._placeholders(positions),
                before,
                snapshot(model, self.parameters),
                lr,
                epochs,
                batch_size,
            )
        )
        return result
