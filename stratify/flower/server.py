"""The server app: the in-process engine, with the clients' work sent to Flower nodes.

:func:`run_on_grid` builds the run with :func:`~stratify.experiment.build_experiment`,
as ``stratify train`` does, and runs :meth:`~stratify.engine.Engine.run_epoch` epoch by
epoch. Two parts differ. The server holds no training sample: its dataset carries only
the placeholder of every client position, agreed through the registry's messages
(:class:`AgreedRegistry`). And its trainer is a :class:`RemoteTrainer`, which sends each
local training and each share of a global batch to the node holding the samples, so the
strategies (FedAvg, FedProx, SCAFFOLD, Stratify's batch mode) run unchanged and draw
exactly what they draw in-process (docs/flower.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from torch import nn

from stratify.client import (
    GradientHook,
    GradientOffset,
    LocalResult,
    LocalTrainer,
    LossFunction,
    ProximalGradient,
    cross_entropy_loss,
)
from stratify.compiled import CompileSwitch
from stratify.config import TrainConfig, dp_settings
from stratify.data.datasets import Dataset, load_dataset
from stratify.errors import ConfigError
from stratify.experiment import build_experiment
from stratify.federation import Federation
from stratify.flower.link import ClientLostError, NodeLink, Traffic, send_and_receive
from stratify.flower.messages import (
    GRADIENT,
    HOP,
    NORM,
    PLACEHOLDERS,
    TRAIN,
    check_flower_config,
    index_record,
    norm_records,
    read_indices,
    read_state,
    state_record,
)
from stratify.flower.registry import KEY_HOLDER, SecureRegistration
from stratify.flower.secure_sum import SecAggSettings, SecureBatchSum, check_secagg_config
from stratify.method import EpochStats
from stratify.nn.norm import has_batch_norm
from stratify.nn.norm_exchange import (
    LayerAdjoint,
    LayerSums,
    exchanged_batch_gradient,
    exchanged_layers,
)
from stratify.privacy.accounting import DPSettings, epsilon_spent
from stratify.registry.base import LabelRegistry, RegistryResult
from stratify.registry.plain import PlainRegistry
from stratify.state import load_into
from stratify.stratify import Stratify

#: what a global batch does when a participant is lost after every retry
ON_LOST = ("stop", "drop")

log = logging.getLogger("stratify.flower")


class AgreedRegistry(LabelRegistry):
    """The registry's result as the server holds it after the messages of
    :func:`register_over_flower`: the server's "labels" are already placeholders, so every
    client's map is the identity on its placeholders and the global counts are those the
    plain registry computed."""

    name = "agreed"

    def __init__(self, agreed: RegistryResult) -> None:
        super().__init__()
        self.agreed = agreed

    def register(self, client_labels: Any, num_classes: int | None = None) -> RegistryResult:
        held = [{p: p for p in counts} for counts in client_labels]
        self.result = RegistryResult(self.agreed.num_placeholders, held, self.agreed.global_counts)
        return self.result

    def _discover(self, client: int, label: Any) -> int:
        raise ConfigError("a Flower run registers its clients once, before training")

    def _count(
        self, client: int, placeholder: int, count: int, global_counts: np.ndarray
    ) -> np.ndarray:
        raise ConfigError("a Flower run registers its clients once, before training")


def register_over_flower(
    link: NodeLink, config: TrainConfig, hellos: list[RecordDict], num_classes: int
) -> tuple[RegistryResult, np.ndarray]:
    """The registry as messages; returns the server's result and the placeholder of every
    client position, client after client.

    Encrypted (``config.secure``): :class:`~stratify.flower.registry.SecureRegistration`,
    with the public context the key holder sent with its hello. Plain: the clients'
    ``{label: count}`` came with their hello; the server registers them as
    :class:`~stratify.registry.plain.PlainRegistry` does in-process, sends each client its
    own map and gets back the placeholder of each of its sample positions.
    """
    records = [hello.config_records for hello in hellos]
    if config.secure:
        public = cast(bytes, records[KEY_HOLDER]["context"]["public"])
        numbers = [int(cast(int, record["labels"]["number"])) for record in records]
        registration = SecureRegistration(link, config.protocol, public, numbers, num_classes)
        return registration.register([int(cast(int, r["node"]["size"])) for r in records])
    counts = []
    for record in records:
        pairs = zip(
            cast(list[int], record["labels"]["labels"]), cast(list[int], record["labels"]["counts"])
        )
        counts.append({int(label): int(count) for label, count in pairs})
    clients = range(config.clients)
    result = PlainRegistry(seed=config.seed).register(counts)
    requests = []
    for client in clients:
        mapping = result.client_maps[client]
        own = ConfigRecord(
            {
                # the nodes' labels are integers (node.py reads them back as such)
                "labels": cast(list[int], list(mapping)),
                "placeholders": [int(p) for p in mapping.values()],
            }
        )
        requests.append((client, PLACEHOLDERS, RecordDict({"map": own})))
    replies = link.exchange(requests)
    of_position = [
        read_indices(content.array_records["placeholders"], "placeholders") for content in replies
    ]
    return result, np.concatenate(of_position)


class RemoteTrainer(LocalTrainer):
    """A :class:`~stratify.client.LocalTrainer` whose work runs on the clients' nodes.

    The server's sample indices are client positions laid end to end (client ``k``'s
    ``i``-th sample is ``offsets[k] + i``). :meth:`train` draws the local epochs' orders
    from the strategy's generator exactly as the in-process trainer does, and sends them
    with the model; :meth:`batch_gradient` sends every participant its share of a global
    batch at once and adds up their summed gradients.

    Parameters
    ----------
    link : NodeLink
        The connected nodes.
    sizes : sequence of int
        Every client's number of samples.
    x_train, y_train : torch.Tensor
        The server's stand-ins (no sample values; placeholders as labels).
    on_lost : {"stop", "drop"}
        What a global batch does when a participant is lost after every retry: stop the
        run (:class:`ClientLostError`), or go on without that client (Stratify's batch
        mode; a local training or a hop always stops).
    secure_sum : SecureBatchSum, optional
        Sum every global batch's shares with SecAgg+ (docs/flower.md, "Secure
        aggregation"): the server gets the batch's sum only. A batch with a single
        participant is then not sent (its sum would be that share): its samples are
        counted in :attr:`withheld` and no step is taken.
    clips_on_nodes : bool
        The run's settings ask for DP, so every node trains with a
        :class:`~stratify.client.PrivateTrainer` (docs/flower.md, "Differential
        privacy"): :func:`~stratify.experiment.build_experiment` then accepts this trainer
        and sets :attr:`privacy`, :attr:`uses_per_epoch` and :attr:`noise_multiplier`,
        the σ every training message carries to the nodes.
    """

    #: the samples stay on the nodes: no compiled or vectorised step reads them here
    holds_samples = False

    def __init__(
        self,
        link: NodeLink,
        sizes: Sequence[int],
        x_train: torch.Tensor,
        y_train: torch.Tensor,
        on_lost: str = "stop",
        secure_sum: SecureBatchSum | None = None,
        clips_on_nodes: bool = False,
    ) -> None:
        super().__init__(x_train, y_train)
        if on_lost not in ON_LOST:
            raise ConfigError(f"on-lost must be one of {', '.join(ON_LOST)}, not {on_lost!r}")
        self.link = link
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.on_lost = on_lost
        #: client -> what happened, for every client dropped so far (``on_lost="drop"``)
        self.dropped: dict[int, str] = {}
        self.secure_sum = secure_sum
        #: samples of single-participant batches not sent under SecAgg+
        self.withheld = 0
        self._last_withheld = False
        #: when the link records: every global batch as the server holds it
        recording = getattr(link, "payloads", None) is not None
        self.batches: list[dict[str, Any]] | None = [] if recording else None
        self.clips_on_nodes = clips_on_nodes
        #: the run's DP settings, most uses of a sample per epoch and σ, set by
        #: :func:`~stratify.experiment.build_experiment` when the nodes clip
        self.privacy: object | None = None
        self.uses_per_epoch = 0
        self.noise_multiplier = 0.0
        #: how many training messages each sample has been in, counted here from the
        #: positions the server asks the nodes to use (the in-process trainer's count)
        self.uses = np.zeros(len(y_train), dtype=np.int64)
        self.epoch = 0
        #: every client's noise draws so far this epoch (its shares', steps' and local
        #: mini-batches' noise), counted as the in-process private trainer counts them
        self.draws: dict[int, int] = {}

    def start_epoch(self, epoch: int) -> None:
        """The epoch that keys the nodes' noise (sent with every training message)."""
        self.epoch = int(epoch)
        self.draws = {}

    def noise(self, client: int, draws: int) -> dict[str, float | int] | None:
        """What a training message tells a private node: σ, the epoch and where the
        message's ``draws`` noise draws start among the client's (then counted);
        ``None`` without DP."""
        if not self.clips_on_nodes:
            return None
        first = self.draws.get(client, 0)
        self.draws[client] = first + draws
        return {"noise": float(self.noise_multiplier), "epoch": self.epoch, "draw": first}

    def with_noise(self, content: RecordDict, client: int, draws: int) -> RecordDict:
        """``content`` with the ``dp`` record of :meth:`noise` (unchanged without DP)."""
        noise = self.noise(client, draws)
        if noise is not None:
            content["dp"] = ConfigRecord(
                {"noise": noise["noise"], "epoch": noise["epoch"], "draw": noise["draw"]}
            )
        return content

    def count_uses(self, samples: np.ndarray) -> None:
        """Count one use of each of ``samples`` (repeats counted as often)."""
        np.add.at(self.uses, np.asarray(samples, dtype=np.int64), 1)

    def drop(self, lost: ClientLostError) -> None:
        """Go on without the clients ``lost`` names: their shares of this and every later
        global batch are left out (the run's loop takes their samples out of the
        schedule's pools from the next epoch on)."""
        for client in lost.clients:
            self.dropped[client] = str(lost)
            log.warning("stratify: client %d dropped, the run goes on without it: %s", client, lost)

    def owner(self, indices: np.ndarray) -> int:
        """The client holding every one of ``indices``."""
        clients = np.searchsorted(self.offsets, indices, side="right") - 1
        if len(clients) == 0 or (clients != clients[0]).any():
            raise AssertionError("one local job trains one client's samples")
        return int(clients[0])

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
        """Train ``model`` in place on its client's node; the parameters are those of
        :meth:`stratify.client.LocalTrainer.train`. The node steps eagerly (``compile``
        is not sent)."""
        if loss_fn is not cross_entropy_loss:
            raise ConfigError("over Flower a client's local objective is the cross-entropy")
        orders = self.epoch_orders(indices, epochs, rng)
        client = self.owner(np.concatenate(orders))
        offset = self.offsets[client]
        job: dict[str, Any] = {
            "batch_size": batch_size,
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "term": "none",
        }
        content = RecordDict(
            {
                "model": state_record(model.state_dict()),
                "orders": index_record(
                    **{str(epoch): order - offset for epoch, order in enumerate(orders)}
                ),
            }
        )
        if isinstance(before_step, ProximalGradient):
            # the anchor is the global model the client receives: only μ travels
            job.update(term="proximal", mu=before_step.mu)
        elif isinstance(before_step, GradientOffset):
            names = [name for name, _ in model.named_parameters()]
            content["offset"] = state_record(dict(zip(names, before_step.offset)))
            job["term"] = "offset"
            self.link.traffic.uploads += 1
        elif before_step is not None:
            raise ConfigError("over Flower a client's gradient hook is FedProx's or SCAFFOLD's")
        content["job"] = ConfigRecord(job)
        self.count_uses(np.concatenate(orders))
        # one noise draw per local mini-batch (the last one of an epoch may be short)
        draws = sum(-(-len(order) // batch_size) for order in orders)
        content = self.with_noise(content, client, draws)
        (answer,) = self.link.exchange([(client, TRAIN, content)])
        self.link.traffic.transfers += 2  # the model down and back up
        load_into(model, read_state(answer.array_records["model"], self.x_train.device))
        result = answer.config_records["result"]
        return LocalResult(
            int(result["steps"]),  # type: ignore[arg-type]
            float(result["loss_sum"]),  # type: ignore[arg-type]
            int(result["samples"]),  # type: ignore[arg-type]
        )

    def single_sample_steps(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, indices: list[int], lr: float
    ) -> list[torch.Tensor]:
        """The travelling model's steps, hop by hop: each run of consecutive samples of one
        client goes to that client's node with the model, which comes back trained (two
        transfers a hop, relayed by the server as ``--hops server`` counts them)."""
        if any(group.get("momentum", 0) for group in optimizer.param_groups):
            raise ConfigError("over Flower Stratify's hops send no momentum: leave --momentum 0")
        samples = np.asarray(indices, dtype=np.int64)
        owners = np.searchsorted(self.offsets, samples, side="right") - 1
        losses: list[torch.Tensor] = []
        for run in np.split(np.arange(len(samples)), np.flatnonzero(np.diff(owners)) + 1):
            if len(run) == 0:
                continue
            client = int(owners[run[0]])
            content = RecordDict(
                {
                    "model": state_record(model.state_dict()),
                    "steps": index_record(positions=samples[run] - self.offsets[client]),
                    "hop": ConfigRecord({"lr": lr}),
                }
            )
            self.count_uses(samples[run])
            content = self.with_noise(content, client, len(run))  # a draw per step
            (answer,) = self.link.exchange([(client, HOP, content)])
            self.link.traffic.transfers += 2  # the model to the holder and back
            load_into(model, read_state(answer.array_records["model"], self.x_train.device))
            losses += torch.as_tensor(answer.array_records["losses"]["losses"].numpy()).unbind()
        return losses

    def trained_samples(self, clients: np.ndarray) -> int:
        if self._last_withheld:
            return 0
        return int(np.isin(clients, list(self.dropped), invert=True).sum())

    def secure_batch_gradient(
        self, model: nn.Module, samples: np.ndarray, clients: np.ndarray, scale: int
    ) -> float:
        """A global batch's mean gradient into ``.grad`` through SecAgg+
        (:class:`~stratify.flower.secure_sum.SecureBatchSum`); its summed loss."""
        assert self.secure_sum is not None
        boundaries = np.flatnonzero(np.diff(clients)) + 1
        shares = []
        for segment in np.split(np.arange(len(samples)), boundaries):
            client = int(clients[segment[0]])
            shares.append((self.link.nodes[client], samples[segment] - self.offsets[client]))
        if len(shares) < 2:
            self.withheld += len(samples)
            self._last_withheld = True
            return 0.0
        state = [value.detach().cpu().numpy() for value in model.state_dict().values()]
        self.count_uses(samples)
        if not self.clips_on_nodes:
            gradients, loss_sum = self.secure_sum.sum(shares, state, scale)
        else:
            draws = {}
            for client in np.unique(clients):
                noise = self.noise(int(client), 1)  # one draw per share
                assert noise is not None
                draws[self.link.nodes[int(client)]] = noise["draw"]
            keys = {"noise": float(self.noise_multiplier), "epoch": self.epoch, "draws": draws}
            gradients, loss_sum = self.secure_sum.sum(shares, state, scale, keys)
        if self.batches is not None:
            self.batches[-1]["sum"] = gradients
        self.link.traffic.transfers += len(shares)  # each participant receives the model
        self.link.traffic.uploads += len(shares)  # and sends its masked contribution
        with torch.no_grad():
            for parameter, total in zip(model.parameters(), gradients):
                value = torch.as_tensor(total, dtype=parameter.dtype, device=parameter.device)
                if parameter.grad is None:
                    parameter.grad = value.reshape(parameter.shape).clone()
                else:
                    parameter.grad += value.reshape(parameter.shape)
        return loss_sum

    def batch_gradient(
        self,
        model: nn.Module,
        samples: np.ndarray,
        clients: np.ndarray,
        fused: bool = True,
        divisor: int | None = None,
    ) -> float:
        """Every participant's summed gradient over its share of the global batch, asked
        for in one exchange, added up and divided by the batch size into ``.grad``; with
        sum-based BatchNorm layers, through their exchanges of sums
        (:meth:`norm_batch_gradient`)."""
        self._last_withheld = False
        if self.batches is not None:
            state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
            self.batches.append({"state": state, "samples": samples, "clients": clients})
        normalised = has_batch_norm(model)
        if self.secure_sum is not None:
            if normalised:
                raise ConfigError("secagg does not cover batch-statistics norms: use --norm gn")
            return self.secure_batch_gradient(
                model, samples, clients, len(samples) if divisor is None else divisor
            )
        if normalised:
            exchanged_layers(model)  # torch's BatchNorm or FedTAN's layer: refused now
        boundaries = np.flatnonzero(np.diff(clients)) + 1
        model_record = state_record(model.state_dict())
        requests, shares = [], []
        for segment in np.split(np.arange(len(samples)), boundaries):
            client = int(clients[segment[0]])
            if client in self.dropped:
                continue
            positions = samples[segment] - self.offsets[client]
            share = index_record(positions=positions)
            content = RecordDict({"model": model_record, "share": share})
            content = self.with_noise(content, client, 1)  # one draw per share
            requests.append((client, GRADIENT, content))
            shares.append(len(segment))
        self.link.traffic.transfers += len(requests)  # each participant receives the model
        self.link.traffic.uploads += len(requests)  # and sends its summed gradient
        while True:
            if not requests:
                return 0.0  # every participant was lost: no step
            # the mean over the samples that answered (all of them unless a client dropped)
            scale = sum(shares) if divisor is None else divisor
            buffers = {name: value.clone() for name, value in model.named_buffers()}
            try:
                if normalised:
                    if self.clips_on_nodes:
                        raise ConfigError("DP does not cover sum-based BatchNorm: use --norm gn")
                    return self.norm_batch_gradient(model, requests, scale)
                answers = self.link.exchange(requests)
                self.count_uses(
                    np.concatenate(
                        [
                            samples[clients == client]
                            for client in sorted({c for c, _, _ in requests})
                        ]
                    )
                )
                break
            except ClientLostError as lost:
                if self.on_lost != "drop" or not lost.clients:
                    raise
                self.drop(lost)
                with torch.no_grad():  # the sums' exchange may have folded in statistics
                    for name, value in model.named_buffers():
                        value.copy_(buffers[name])
                kept = [
                    i for i, (client, _, _) in enumerate(requests) if client not in self.dropped
                ]
                requests = [requests[i] for i in kept]
                shares = [shares[i] for i in kept]
        gradients = [read_state(a.array_records["gradient"], self.x_train.device) for a in answers]
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                total = torch.stack([g[name] for g in gradients]).sum(0) / scale
                if parameter.grad is None:
                    parameter.grad = total
                else:
                    parameter.grad += total
        losses = [cast(float, answer.config_records["loss"]["loss_sum"]) for answer in answers]
        return float(sum(float(loss) for loss in losses))

    def norm_batch_gradient(
        self, model: nn.Module, requests: list[tuple[int, str, RecordDict]], scale: int
    ) -> float:
        """A global batch of a model with sum-based BatchNorm: its ``2L + 1`` exchanges
        of per-channel sums, adjoints and gradients (:mod:`stratify.nn.norm_exchange`),
        each a message to every participant with the model and its share (a node keeps
        nothing between messages)."""

        def ask(
            phase: str,
            sums: Sequence[LayerSums],
            adjoints: Mapping[int, LayerAdjoint] | None,
            layer: int | None,
        ) -> list:
            extra = norm_records(phase, sums, adjoints, layer)
            answers = self.link.exchange(
                [
                    (client, NORM, RecordDict({**dict(content), **extra}))
                    for client, _, content in requests
                ]
            )
            device = self.x_train.device
            parts = [
                read_state(a.array_records.get("part", ArrayRecord()), device) for a in answers
            ]
            if phase == "sums":
                return [
                    LayerSums(
                        part["total"],
                        part["squares"],
                        int(cast(int, answer.config_records["count"]["count"])),
                    )
                    for part, answer in zip(parts, answers)
                ]
            if phase == "adjoint":
                return [LayerAdjoint(part["total"], part["squares"]) for part in parts]
            return [
                (
                    read_state(a.array_records["gradient"], device),
                    float(cast(float, a.config_records["loss"]["loss_sum"])),
                )
                for a in answers
            ]

        return exchanged_batch_gradient(model, self.x_train, ask, scale)


@dataclass
class FlowerRun:
    """A finished run of the server app.

    Parameters
    ----------
    config : TrainConfig
        Its settings.
    state : dict
        The final global model state (CPU tensors).
    epochs : list of EpochStats
        Every epoch's counters, as the engine adds them up.
    accuracies : list of float
        Test accuracy after every epoch.
    seconds : list of float
        Wall time of every epoch (the registry's messages not included).
    traffic : Traffic
        What the server sent and received, counted message by message.
    registry : RegistryResult or None
        The registration as the server holds it (encrypted: placeholders only).
    placeholders : numpy.ndarray or None
        The placeholder of every client position, client after client.
    registration_seconds : float
        Wall time of the registry's messages after the hello (with which the nodes load
        their data).
    payloads : list or None
        Every message the server sent and received, when the run recorded them
        (:attr:`NodeLink.payloads`).
    dropped : dict
        Client -> the epoch in which it was lost and why, for every client the run went
        on without (``on_lost="drop"``).
    secagg : bool
        Whether every global batch was summed with SecAgg+.
    withheld : int
        Under SecAgg+, samples of single-participant batches that were not sent.
    batches : list or None
        With recording, every global batch as the server holds it: the model ``state``,
        the ``samples`` (client positions end to end) and their ``clients``, and under
        SecAgg+ the ``sum`` it got (the batch's mean gradients, parameter by parameter).
    privacy : dict or None
        With DP, the (ε, δ) spent, as an in-process run's summary reports it
        (:func:`privacy_report`); ``None`` without.
    """

    config: TrainConfig
    state: dict[str, torch.Tensor]
    epochs: list[EpochStats] = field(default_factory=list)
    accuracies: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    traffic: Traffic = field(default_factory=Traffic)
    registry: RegistryResult | None = None
    placeholders: np.ndarray | None = None
    registration_seconds: float = 0.0
    payloads: list[tuple[str, str, RecordDict]] | None = None
    dropped: dict[int, dict[str, Any]] = field(default_factory=dict)
    secagg: bool = False
    withheld: int = 0
    batches: list[dict[str, Any]] | None = None
    privacy: dict[str, Any] | None = None


class LinkedGrid:
    """``grid`` with every message SecAgg+'s workflow sends and receives kept and counted
    by ``link`` (the workflow talks to the grid itself, not through the link), its replies
    pulled as the link pulls them (:func:`~stratify.flower.link.send_and_receive`)."""

    def __init__(self, grid: Grid, link: NodeLink) -> None:
        self.grid = grid
        self.link = link

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)

    def send_and_receive(self, messages: Sequence[Message], *, timeout: float | None = None):  # type: ignore[no-untyped-def]
        messages = list(messages)
        for message in messages:
            self.link.traffic.messages += 1
            self.link.keep("sent", message.metadata.message_type, message.content)
        replies = send_and_receive(self.grid, messages, timeout)
        for reply in replies:
            if not reply.has_error():
                self.link.keep("received", reply.metadata.message_type, reply.content)
        return replies


def check_secagg(config: TrainConfig, secagg: SecAggSettings, on_lost: str) -> None:
    """Refuse, in one line, a SecAgg+ run this integration does not cover
    (:func:`~stratify.flower.secure_sum.check_secagg_config`) or a lost client it would have
    to drop: a lost participant stops the run."""
    check_secagg_config(config, secagg)
    if on_lost != "stop":
        raise ConfigError("secagg stops on a lost client: leave on-lost at stop")


def server_dataset(loaded: Dataset, sizes: Sequence[int], placeholders: np.ndarray) -> Dataset:
    """The server's dataset: the test split of ``loaded`` (it evaluates the global model)
    and, for the training split, stand-ins that hold no sample: an input of zeros that
    takes no memory and the placeholder of each client position."""
    total = int(sum(sizes))
    stand_in = torch.zeros((1, *loaded.input_shape)).expand(total, *loaded.input_shape)
    return Dataset(
        loaded.name,
        stand_in,
        torch.as_tensor(placeholders),
        loaded.x_test,
        loaded.y_test,
        loaded.num_classes,
        domains_test=loaded.domains_test,
    )


def run_on_grid(
    grid: Grid,
    config: TrainConfig,
    *,
    timeout: float = 120.0,
    retries: int = 1,
    record: bool = False,
    on_lost: str = "stop",
    secagg: SecAggSettings | None = None,
) -> FlowerRun:
    """Run ``config`` with its clients on the nodes of ``grid``.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        The grid the ``ServerApp`` was given.
    config : TrainConfig
        The run (no validation split; the encrypted registry's packed protocols, their
        nodes holding the federation's keys, or the plain registry:
        :func:`check_flower_config`).
    timeout : float
        Seconds to wait for the replies of one exchange (and for the nodes to connect).
    retries : int
        Times an unanswered request is sent again before the client counts as lost.
    record : bool
        Keep every message in :attr:`FlowerRun.payloads`.
    on_lost : {"stop", "drop"}
        A client lost: the run stops with :class:`ClientLostError`, or (Stratify's batch
        mode) goes on without it (:func:`run_over_link`).
    secagg : SecAggSettings, optional
        Sum every global batch's shares with Flower's SecAgg+ (Stratify's batch mode).
    """
    link = NodeLink(grid, config, timeout, retries, record)
    return run_over_link(link, config, on_lost, secagg)


def run_over_link(
    link: NodeLink,
    config: TrainConfig,
    on_lost: str = "stop",
    secagg: SecAggSettings | None = None,
) -> FlowerRun:
    """Run ``config`` through ``link``'s nodes (:func:`run_on_grid`'s body).

    With ``on_lost="drop"`` (Stratify's batch mode only), a client lost after every retry
    is left out of the global batch being computed and of the rest of its epoch, and its
    samples leave the schedule's pools from the next epoch on
    (:meth:`~stratify.stratify.Stratify.drop_clients`); :attr:`FlowerRun.dropped` says
    which client, in which epoch, and why.
    """
    check_flower_config(config)
    if on_lost == "drop" and (config.algorithm != "stratify" or config.mode != "batch"):
        raise ConfigError(
            "on-lost drop goes on without a lost client in Stratify's batch mode only; "
            f"{config.algorithm} in {config.mode} mode stops (on-lost stop)"
        )
    secure_sum = None
    if secagg is not None:
        check_secagg(config, secagg, on_lost)
        secure_sum = SecureBatchSum(
            LinkedGrid(link.grid, link),  # type: ignore[arg-type]
            secagg,
            str(link.run_record["config"]),
            link.timeout,
        )
    loaded = load_dataset(
        config.dataset, data_dir=config.data_dir, seed=config.seed, **config.dataset_options
    )
    hellos = link.connect()
    sizes = [int(cast(int, hello.config_records["node"]["size"])) for hello in hellos]
    start = time.perf_counter()
    agreed, placeholders = register_over_flower(link, config, hellos, loaded.num_classes)
    registration_seconds = time.perf_counter() - start
    dataset = server_dataset(loaded, sizes, placeholders)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    federation = Federation(
        [np.arange(offsets[k], offsets[k + 1]) for k in range(config.clients)], placeholders
    )
    trainer = RemoteTrainer(
        link,
        sizes,
        dataset.x_train,
        dataset.y_train,
        on_lost=on_lost,
        secure_sum=secure_sum,
        clips_on_nodes=dp_settings(config) is not None,
    )
    experiment = build_experiment(
        config,
        dataset=dataset,
        federation=federation,
        registry=AgreedRegistry(agreed),
        trainer=trainer,
    )
    run = FlowerRun(
        config,
        {},
        traffic=link.traffic,
        registry=agreed,
        placeholders=placeholders,
        registration_seconds=registration_seconds,
        payloads=link.payloads,
        secagg=secagg is not None,
    )
    for epoch in range(1, config.epochs + 1):
        start = time.perf_counter()
        trainer.start_epoch(epoch)
        sent = (link.traffic.transfers, link.traffic.uploads)
        stats = experiment.engine.run_epoch(epoch)
        run.seconds.append(time.perf_counter() - start)
        run.epochs.append(stats)
        run.accuracies.append(experiment.engine.test_metrics().accuracy)
        log.info(
            "epoch %d: loss %.4f, accuracy %.4f, %.2f s",
            epoch,
            stats.train_loss,
            run.accuracies[-1],
            run.seconds[-1],
        )
        lost = [client for client in trainer.dropped if client not in run.dropped]
        if lost:
            # the engine counted the epoch's plan, drawn while the lost clients were in it:
            # their shares after the loss were never sent, so the messages' count stands
            stats.transfers = link.traffic.transfers - sent[0]
            stats.uploads = link.traffic.uploads - sent[1]
            stats.bytes_sent = (
                stats.transfers * experiment.engine.model_bytes
                + stats.uploads * experiment.engine.gradient_bytes
                + stats.extra_bytes
            )
            strategy = cast(Stratify, experiment.strategy)
            strategy.drop_clients(experiment.engine.context, lost)
            for client in lost:
                run.dropped[client] = {"epoch": epoch, "reason": trainer.dropped[client]}
    run.withheld = trainer.withheld
    run.batches = trainer.batches
    run.privacy = privacy_report(trainer, config)
    run.state = {
        key: value.detach().cpu().clone() for key, value in experiment.model.state_dict().items()
    }
    return run


def privacy_report(trainer: RemoteTrainer, config: TrainConfig) -> dict[str, Any] | None:
    """The (ε, δ) a Flower run with DP has spent, with the keys of an in-process run's
    ``privacy`` summary: from Opacus's accountant over the most uses of any one sample,
    counted by the server from the positions it sent the nodes (each node adds the noise
    to every message holding them); ``None`` without DP.

    Parameters
    ----------
    trainer : RemoteTrainer
        The run's trainer, after its epochs.
    config : TrainConfig
        The run's settings.
    """
    settings = trainer.privacy
    if not trainer.clips_on_nodes or not isinstance(settings, DPSettings):
        return None
    uses = int(trainer.uses.max(initial=0))
    return {
        "mechanism": "per-sample clipping + Gaussian noise, no subsampling",
        "accountant": "opacus RDP",
        "target_epsilon": settings.epsilon,
        "delta": settings.delta,
        "clip": settings.clip,
        "noise_multiplier": trainer.noise_multiplier,
        "noise_seed": "given (--dp-seed)" if settings.seed is not None else "entropy (each node's)",
        "planned_uses": config.epochs * trainer.uses_per_epoch,
        "uses": uses,
        "uses_counted_by": "server, from the positions it sent the nodes",
        "epsilon": epsilon_spent(trainer.noise_multiplier, settings.delta, uses),
    }
