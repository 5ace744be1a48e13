"""A node: one client of the federation as a Flower ``ClientApp``.

The node loads the run's dataset itself, keeps only its own client's samples (the client
is the node's ``partition-id``) and answers the server app's messages with the engine's
own code: local training is :meth:`stratify.client.LocalTrainer.train_eager`, a share of a
global batch :meth:`~stratify.client.LocalTrainer.batch_gradient` (docs/flower.md).
Sample positions are the node's own, ``0..n_k-1``; labels never leave it except as the
plain registry's counts. With the encrypted registry they leave it only encrypted
(:class:`~stratify.flower.registry.ClientRegistration`), each node encoding them in the
order of its own order key, and client 0's node is also the key holder.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial, wraps
from pathlib import Path
from typing import cast

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from torch import nn

from stratify.client import (
    GradientHook,
    GradientOffset,
    LocalTrainer,
    PrivateTrainer,
    ProximalGradient,
)
from stratify.config import TrainConfig, dp_settings
from stratify.data.datasets import load_dataset
from stratify.errors import ConfigError
from stratify.experiment import partition_clients
from stratify.federation import Federation
from stratify.flower.keys import FederationKeys, read_federation_keys
from stratify.flower.messages import (
    index_record,
    read_config,
    read_indices,
    read_norm_records,
    read_state,
    state_record,
)
from stratify.flower.registry import KEY_HOLDER, ClientRegistration, values_record
from stratify.flower.secure_sum import contribution, contribution_reply, read_request
from stratify.nn.models import build_model, default_model
from stratify.nn.norm_exchange import Party
from stratify.privacy.accounting import DEFAULT_DELTA, check_delta, check_epsilon
from stratify.privacy.ledger import Ledger, run_key
from stratify.registry.client_secrets import node_order_key
from stratify.state import load_into


@dataclass
class NodeData:
    """What one node holds: its client's samples, a trainer over them and a model to load
    the received states into."""

    client: int
    labels: np.ndarray
    trainer: LocalTrainer
    model: nn.Module
    #: its side of the encrypted registry (a secure run's), made on first use
    registration: ClientRegistration | None = None

    @property
    def size(self) -> int:
        return len(self.labels)


#: the nodes this process serves, by (partition id, the run's settings): a simulation
#: runs many nodes in one worker, and a node keeps its data across a run's messages
_NODES: dict[tuple[int, str], NodeData] = {}
#: the federation key files this process has read, by path
_KEYS: dict[str, FederationKeys] = {}


def partition_id(context: Context) -> int:
    """The client this node is (``--node-config partition-id=K``; the simulation sets it)."""
    if "partition-id" not in context.node_config:
        raise ConfigError("a Stratify node needs its client number: --node-config partition-id=K")
    return int(context.node_config["partition-id"])


def run_text(content: RecordDict) -> str:
    """The run's settings as a message carries them: the key of a node's data and count."""
    return str(content.config_records["run"]["config"])


def node_data(content: RecordDict, context: Context) -> NodeData:
    """This node's data for the run in ``content``: loaded, partitioned as the in-process
    run partitions, and cut to its own client, once per run."""
    client = partition_id(context)
    key = (client, run_text(content))
    if key not in _NODES:
        config = read_config(content)
        data_dir = context.node_config.get("data-dir") or config.data_dir
        data_dir = data_dir or os.environ.get("STRATIFY_DATA_DIR")
        dataset = load_dataset(
            config.dataset,
            data_dir=None if data_dir is None else str(data_dir),
            device="cpu",
            seed=config.seed,
            **config.dataset_options,
        )
        federation = partition_clients(dataset, config)
        if not 0 <= client < federation.num_clients:
            raise ConfigError(
                f"partition-id {client} is not a client of a run with {config.clients} clients"
            )
        own = torch.as_tensor(federation.client_indices[client])
        x, y = dataset.x_train[own], dataset.y_train[own]
        model = build_model(
            config.model or default_model(dataset.input_shape),
            dataset.input_shape,
            dataset.num_classes,
            norm=config.norm,
            hidden=config.mlp_hidden,
        )
        _NODES[key] = NodeData(client, y.numpy(), node_trainer(config, client, x, y), model)
    return _NODES[key]


def node_trainer(
    config: TrainConfig, client: int, x: torch.Tensor, y: torch.Tensor
) -> LocalTrainer:
    """The node's trainer: with DP in the run's settings a :class:`PrivateTrainer` that
    clips every per-sample gradient to ``--dp-clip`` and adds the noise on the node, from
    the node's own entropy unless the run gives ``--dp-seed`` (docs/flower.md,
    "Differential privacy"); σ arrives with each training message (:func:`set_noise`).

    Parameters
    ----------
    config : TrainConfig
        The run's settings.
    client : int
        The node's client: keys its noise generator, as in-process.
    x, y : torch.Tensor
        The node's samples and labels.
    """
    privacy = dp_settings(config)
    if privacy is None:
        return LocalTrainer(x, y)
    return PrivateTrainer(
        x,
        y,
        clip=privacy.clip,
        noise_multiplier=math.nan,  # none until the server's σ arrives: no update leaves
        seed=privacy.seed,
        owners=np.full(len(y), client, dtype=np.int64),
    )


def noise_floor(context: Context) -> float | None:
    """The smallest σ this node trains with (``--node-config dp-min-noise=SIGMA``), set
    by the node's operator, not the server; ``None``: the server's σ is taken as sent.

    Raises
    ------
    ConfigError
        One line: the setting is not a positive number.
    """
    value = context.node_config.get("dp-min-noise")
    if value is None:
        return None
    try:
        floor = float(cast(float, value))
    except (TypeError, ValueError):
        floor = math.nan
    if not math.isfinite(floor) or floor <= 0:
        raise ConfigError(f"--node-config dp-min-noise must be a number above 0, not {value!r}")
    return floor


def node_budget(context: Context) -> Ledger | None:
    """The node's own ε budget (``--node-config "dp-max-epsilon=EPS dp-ledger=PATH"``,
    at ``dp-budget-delta``, default 1e-5), set by the node's operator, counted in the
    ledger file ``PATH`` (:class:`~stratify.privacy.ledger.Ledger`); ``None``: the node
    counts nothing of its own.

    Raises
    ------
    ConfigError
        One line: a setting is not a number in range, or the budget names no ledger (a
        deployed node serves each message in a fresh process: a count in memory would
        start again at every message).
    """
    settings = context.node_config
    if "dp-max-epsilon" not in settings:
        for key in ("dp-ledger", "dp-budget-delta"):
            if key in settings:
                raise ConfigError(f"--node-config {key} goes with dp-max-epsilon")
        return None
    budget = check_epsilon(settings["dp-max-epsilon"], "--node-config dp-max-epsilon")
    delta = check_delta(
        settings.get("dp-budget-delta", DEFAULT_DELTA), "--node-config dp-budget-delta"
    )
    path = settings.get("dp-ledger")
    if not path:
        raise ConfigError(
            "--node-config dp-max-epsilon needs dp-ledger=PATH, the file that counts the "
            "node's uses across the processes serving its messages"
        )
    return Ledger(str(path), budget, delta)


def unbudgeted(why: str) -> ConfigError:
    """The one-line refusal, by a node with a :func:`node_budget`, of an update its
    budget cannot count: one without DP noise."""
    return ConfigError(
        f"this node spends its samples only with DP (--node-config dp-max-epsilon); {why}"
    )


def charge(node: NodeData, run: str, positions: np.ndarray, budget: Ledger | None) -> None:
    """Count the noised uses of the node's samples at ``positions`` (a position twice:
    two uses) that a message asks for in ``run`` (its settings' text), before the update
    leaves, and refuse (one line) the message that would take the node above its
    ``budget``. Nothing to count for a node without a budget."""
    if budget is None:
        return
    trainer = node.trainer
    if not isinstance(trainer, PrivateTrainer):  # refused by set_noise already
        raise unbudgeted("the run has no DP")
    budget.charge(run_key(node.client, run), trainer.noise_multiplier, positions, node.size)


def below_floor(floor: float, why: str) -> ConfigError:
    """The one-line refusal of a node whose :func:`noise_floor` a request does not meet."""
    return ConfigError(
        f"this node trains only with DP noise σ ≥ {floor:g} (--node-config dp-min-noise); {why}"
    )


def set_noise(
    node: NodeData,
    noise: float | None,
    epoch: int,
    draw: int = 0,
    floor: float | None = None,
    budget: Ledger | None = None,
) -> None:
    """Give a private node's trainer the σ, epoch and first noise draw a training message
    carries; refuse (one line) a message without them, so that no update leaves a DP
    run's node un-noised. A node of a run without DP ignores them, unless it has a
    ``floor``: then it refuses to train for a run without DP, or with a smaller σ.

    Parameters
    ----------
    node : NodeData
        The node.
    noise : float or None
        σ, calibrated by the server for the run's planned uses.
    epoch : int
        The epoch: with the draw, keys the noise (:meth:`PrivateTrainer.noise_generator`).
    draw : int
        The client's noise draws in this epoch before this message's (the server counts
        them), so that the noise does not depend on which process serves the node.
    floor : float, optional
        The node's own smallest σ (:func:`noise_floor`): the server chooses the run's
        settings and σ, and a server that sent less noise, or none, is refused.
    budget : Ledger, optional
        The node's own ε budget (:func:`node_budget`): a run without DP is refused; the
        uses are counted by :func:`charge`, once the message's samples are known.
    """
    trainer = node.trainer
    if not isinstance(trainer, PrivateTrainer):
        if floor is not None:
            raise below_floor(floor, "the run has no DP")
        if budget is not None:
            raise unbudgeted("the run has no DP")
        return
    if noise is None or not math.isfinite(noise) or noise < 0:
        raise ConfigError(
            "this run trains with DP: a training message must carry the noise σ (dp record)"
        )
    if floor is not None and noise < floor:
        raise below_floor(floor, f"the message asks for σ = {noise:g}")
    trainer.noise_multiplier = float(noise)
    if epoch != trainer.epoch:
        trainer.start_epoch(epoch)
    trainer.draws = {node.client: int(draw)}


def message_noise(
    node: NodeData, content: RecordDict, floor: float | None = None, budget: Ledger | None = None
) -> None:
    """:func:`set_noise` from a training message's ``dp`` record, with the node's
    ``floor`` and ``budget``."""
    record = content.config_records.get("dp")
    if record is None:
        set_noise(node, None, 0, floor=floor, budget=budget)
        return
    set_noise(
        node,
        float(cast(float, record["noise"])),
        int(cast(int, record["epoch"])),
        int(cast(int, record["draw"])),
        floor,
        budget,
    )


def received_model(node: NodeData, content: RecordDict) -> nn.Module:
    """The node's model holding the state the server sent."""
    load_into(node.model, read_state(content.array_records["model"], torch.device("cpu")))
    node.model.train()
    return node.model


def registration(
    node: NodeData,
    content: RecordDict,
    context: Context,
    keys: str | None,
    order_keys: str | None = None,
) -> ClientRegistration:
    """The node's side of the encrypted registry, with the federation's keys: from
    ``--node-config registry-keys=PATH``, else ``keys`` (the simulation's); and its own
    order key: read from (or drawn and written, mode 0600, to) ``--node-config
    order-key=PATH``, else ``order_keys/client-K.json`` (the simulation's), else drawn
    and held in the node's memory for the run. No message carries it."""
    if node.registration is None:
        path = context.node_config.get("registry-keys") or keys
        if not path:
            raise ConfigError(
                "a secure run's node needs the federation key file: "
                '--node-config registry-keys="PATH" (python -m stratify.flower.keys PATH)'
            )
        if str(path) not in _KEYS:
            _KEYS[str(path)] = read_federation_keys(Path(str(path)))
        order_path = context.node_config.get("order-key")
        if not order_path and order_keys:
            order_path = str(Path(order_keys) / f"client-{node.client}.json")
        protocol = read_config(content).protocol
        node.registration = ClientRegistration(
            _KEYS[str(path)],
            protocol,
            node.client,
            node.labels,
            node_order_key(str(order_path) if order_path else None),
        )
    return node.registration


def reply(message: Message, **records: ArrayRecord | ConfigRecord) -> Message:
    return Message(RecordDict(dict(records)), reply_to=message)


def hello(
    message: Message, context: Context, keys: str | None = None, order_keys: str | None = None
) -> Message:
    """The node's client number and sample count, and the registry's input. Plain: its
    ``{label: count}``, in ascending labels as
    :meth:`~stratify.federation.Federation.label_counts` lists them in-process. Encrypted:
    its number of labels only, and from the key holder the public context."""
    node = node_data(message.content, context)
    records: dict[str, ConfigRecord] = {
        "node": ConfigRecord({"client": node.client, "size": node.size})
    }
    if read_config(message.content).secure:
        own = registration(node, message.content, context, keys, order_keys)
        records["labels"] = ConfigRecord({"number": len(own.codes)})
        if node.client == KEY_HOLDER:
            records["context"] = ConfigRecord({"public": own.key_holder.public_context()})
    else:
        counts = Federation([np.arange(node.size)], node.labels).label_counts()[0]
        records["labels"] = ConfigRecord({"labels": list(counts), "counts": list(counts.values())})
    return reply(message, **records)


def registry_settings(message: Message) -> dict[str, int]:
    """The integers the server sent with an encrypted registry message."""
    record = message.content.config_records["registry"]
    return {key: int(cast(int, value)) for key, value in record.items()}


def labels(
    message: Message, context: Context, keys: str | None = None, order_keys: str | None = None
) -> Message:
    """The node's label vectors, encrypted, at the block size the server asks for."""
    node = node_data(message.content, context)
    own = registration(node, message.content, context, keys, order_keys)
    vectors = own.label_vectors(registry_settings(message)["block_size"])
    return reply(message, labels=ConfigRecord({"vectors": vectors}))


def unique(
    message: Message, context: Context, keys: str | None = None, order_keys: str | None = None
) -> Message:
    """``Enc(delta)``: the node's labels that are new to ``U``, as its next entries."""
    node = node_data(message.content, context)
    own = registration(node, message.content, context, keys, order_keys)
    settings = registry_settings(message)
    positions = read_indices(message.content.array_records["new"], "positions").tolist()
    vector = own.unique_delta(settings["block_size"], positions, settings["first"])
    return reply(message, unique=ConfigRecord({"vector": vector}))


def counts(
    message: Message, context: Context, keys: str | None = None, order_keys: str | None = None
) -> Message:
    """The node's counts encrypted at its placeholders' slots, and the placeholder of each
    of its samples, from the index in ``U`` of each of its labels."""
    node = node_data(message.content, context)
    own = registration(node, message.content, context, keys, order_keys)
    settings = registry_settings(message)
    indices = read_indices(message.content.array_records["indices"], "indices").tolist()
    vector, of_sample = own.counts(settings["block_size"], indices, settings["num_unique"])
    return reply(
        message,
        counts=ConfigRecord({"vector": vector}),
        placeholders=index_record(placeholders=of_sample),
    )


def matches(
    message: Message, context: Context, keys: str | None = None, order_keys: str | None = None
) -> Message:
    """The key holder: which compared slots of the server's comparisons match."""
    node = node_data(message.content, context)
    own = registration(node, message.content, context, keys, order_keys)
    settings = registry_settings(message)
    compared = message.content.config_records["compared"]
    found = own.matches(
        cast(list[bytes], compared["vectors"]),
        cast(list[int], compared["labels"]),
        settings["block_size"],
        settings["num_unique"],
    )
    return reply(message, matched=index_record(matched=found.ravel().astype(np.int64)))


def total(
    message: Message, context: Context, keys: str | None = None, order_keys: str | None = None
) -> Message:
    """The key holder: its decryption of the server's (masked) total of counts."""
    node = node_data(message.content, context)
    own = registration(node, message.content, context, keys, order_keys)
    blob = cast(bytes, message.content.config_records["total"]["vector"])
    return reply(
        message, total=values_record(own.total(blob, registry_settings(message)["num_unique"]))
    )


def placeholders(message: Message, context: Context) -> Message:
    """The placeholder of each of the node's samples, from its own map."""
    node = node_data(message.content, context)
    record = message.content.config_records["map"]
    mapping = dict(zip(cast(list[int], record["labels"]), cast(list[int], record["placeholders"])))
    of_sample = np.array([mapping[int(label)] for label in node.labels], dtype=np.int64)
    return reply(message, placeholders=index_record(placeholders=of_sample))


def train(message: Message, context: Context) -> Message:
    """Local SGD on a copy of the global model, over the epoch orders the server drew."""
    node = node_data(message.content, context)
    budget = node_budget(context)
    message_noise(node, message.content, noise_floor(context), budget)
    job = message.content.config_records["job"]
    orders = message.content.array_records["orders"]
    epoch_orders = [read_indices(orders, str(epoch)) for epoch in range(len(orders))]
    # each mini-batch step uses each of its samples once
    used = np.concatenate(epoch_orders) if epoch_orders else np.zeros(0, dtype=np.int64)
    charge(node, run_text(message.content), used, budget)
    model = received_model(node, message.content)
    hook: GradientHook | None = None
    if job["term"] == "proximal":
        anchor = [parameter.detach().clone() for parameter in model.parameters()]
        hook = ProximalGradient(anchor, float(job["mu"]))  # type: ignore[arg-type]
    elif job["term"] == "offset":
        offsets = read_state(message.content.array_records["offset"], torch.device("cpu"))
        hook = GradientOffset(list(offsets.values()))
    result = node.trainer.train_eager(
        model,
        epoch_orders,
        int(job["batch_size"]),  # type: ignore[arg-type]
        float(job["lr"]),  # type: ignore[arg-type]
        float(job["momentum"]),  # type: ignore[arg-type]
        float(job["weight_decay"]),  # type: ignore[arg-type]
        hook,
    )
    return reply(
        message,
        model=state_record(model.state_dict()),
        result=ConfigRecord(
            {"steps": result.steps, "loss_sum": result.loss_sum, "samples": result.samples}
        ),
    )


def gradient(message: Message, context: Context) -> Message:
    """The gradient of the summed loss over the node's share of a global batch."""
    node = node_data(message.content, context)
    budget = node_budget(context)
    message_noise(node, message.content, noise_floor(context), budget)
    share = read_indices(message.content.array_records["share"], "positions")
    charge(node, run_text(message.content), share, budget)
    model = received_model(node, message.content)
    model.zero_grad(set_to_none=True)
    loss = node.trainer.batch_gradient(
        model, share, np.zeros(len(share), dtype=np.int64), divisor=1
    )
    grads = {
        name: parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)
        for name, parameter in model.named_parameters()
    }
    return reply(message, gradient=state_record(grads), loss=ConfigRecord({"loss_sum": loss}))


def share_sum(node: NodeData, model: nn.Module, share: np.ndarray) -> tuple[list, float]:
    """The gradient of the summed loss over ``share`` (the node's positions), parameter by
    parameter, and that summed loss."""
    model.zero_grad(set_to_none=True)
    loss = node.trainer.batch_gradient(
        model, share, np.zeros(len(share), dtype=np.int64), divisor=1
    )
    grads = [
        parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)
        for parameter in model.parameters()
    ]
    return grads, loss


def secure_share(message: Message, context: Context) -> Message:
    """The node's contribution to a global batch's SecAgg+ sum (:mod:`.secure_sum`), which
    :func:`flwr.client.mod.secaggplus_mod` masks before it leaves the node."""
    request = read_request(message.content)
    node = node_data(RecordDict({"run": ConfigRecord({"config": request.run})}), context)
    budget = node_budget(context)
    set_noise(node, request.noise, request.epoch, request.draw, noise_floor(context), budget)
    charge(node, request.run, request.positions, budget)
    state = dict(zip(node.model.state_dict(), request.model))
    load_into(node.model, {key: torch.as_tensor(value) for key, value in state.items()})
    node.model.train()
    grads, loss = share_sum(node, node.model, request.positions)
    values = contribution(
        [g.detach().numpy() for g in grads], loss, request.scale, request.clipping_range
    )
    return contribution_reply(message, values)


def secagg_only(context: Context) -> bool:
    """Whether this node sends model updates only inside SecAgg+ sums
    (``--node-config secagg-only=true``)."""
    value = context.node_config.get("secagg-only", False)
    return value is True or str(value).lower() == "true"


#: a ClientApp's message handler
Handler = Callable[[Message, Context], Message]


def in_the_clear(handler: Handler) -> Handler:
    """``handler`` (it sends the server one client's update or gradient), refused in one
    line on a node that sends its updates only inside SecAgg+ sums: there the node, not
    the server, decides (docs/flower.md, "Secure aggregation")."""

    @wraps(handler)
    def guarded(message: Message, context: Context) -> Message:
        if secagg_only(context):
            raise ConfigError(
                f"this node is secagg-only: it answers {message.metadata.message_type} "
                "(one client's update in the clear) only without --node-config secagg-only"
            )
        return handler(message, context)

    return guarded


def train_or_share(message: Message, context: Context) -> Message:
    """A ``train`` message: a stage of SecAgg+ (Flower's workflow sends its four stages as
    ``train``), handled by ``secaggplus_mod`` around :func:`secure_share`; else a local
    training (:func:`train`)."""
    if RECORD_KEY_CONFIGS in message.content.config_records:
        return secaggplus_mod(message, context, secure_share)
    return in_the_clear(train)(message, context)


def norm(message: Message, context: Context) -> Message:
    """One exchange of the sum-based BatchNorm over the node's share of a global batch:
    its part of a layer's sums, its term of a layer's adjoint, or its term of the
    gradient with its summed loss (:mod:`stratify.nn.norm_exchange`)."""
    node = node_data(message.content, context)
    if isinstance(node.trainer, PrivateTrainer):
        raise ConfigError("a DP run's node does not send per-share BatchNorm sums")
    floor = noise_floor(context)
    if floor is not None:
        raise below_floor(floor, "per-share BatchNorm sums are never noised")
    if node_budget(context) is not None:
        raise unbudgeted("per-share BatchNorm sums are never noised")
    model = received_model(node, message.content)
    share = torch.as_tensor(read_indices(message.content.array_records["share"], "positions"))
    party = Party(model, node.trainer.x_train[share], node.trainer.y_train[share])
    phase, sums, adjoints, layer = read_norm_records(message.content)
    if phase == "sums" and layer is not None:
        part = party.sums(sums, layer)
        vectors = {"total": part.total, "squares": part.squares}
        return reply(message, part=state_record(vectors), count=ConfigRecord({"count": part.count}))
    if phase == "adjoint" and layer is not None:
        term = party.adjoint(sums, adjoints, layer)
        return reply(message, part=state_record({"total": term.total, "squares": term.squares}))
    if phase == "gradient":
        grads, loss = party.gradient(sums, adjoints)
        return reply(message, gradient=state_record(grads), loss=ConfigRecord({"loss_sum": loss}))
    raise ConfigError(f"unknown BatchNorm exchange {phase!r} (layer {layer})")


def hop(message: Message, context: Context) -> Message:
    """The travelling model's steps on this node: one plain SGD step per sample, in the
    order the server's plan gives (Stratify's single-sample mode)."""
    node = node_data(message.content, context)
    budget = node_budget(context)
    message_noise(node, message.content, noise_floor(context), budget)
    steps = read_indices(message.content.array_records["steps"], "positions")
    charge(node, run_text(message.content), steps, budget)
    model = received_model(node, message.content)
    lr = float(message.content.config_records["hop"]["lr"])  # type: ignore[arg-type]
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = node.trainer.single_sample_steps(model, optimizer, steps.tolist(), lr)
    return reply(
        message,
        model=state_record(model.state_dict()),
        losses=ArrayRecord({"losses": Array(torch.stack(losses).numpy())}),
    )


def client_app(
    keys: str | os.PathLike | None = None, order_keys: str | os.PathLike | None = None
) -> ClientApp:
    """The ``ClientApp`` every node runs (simulation and deployment alike).

    Parameters
    ----------
    keys : path, optional
        The federation key file of a secure run (:mod:`stratify.flower.keys`), where a
        node's ``--node-config registry-keys`` does not name one: the simulation's nodes
        have no node configuration of their own.
    order_keys : path, optional
        A folder of the nodes' order-key files, ``client-K.json`` each (read if there,
        else drawn and written 0600), where a node's ``--node-config order-key`` does not
        name one; default: each node draws its own and keeps it in memory.
    """
    path = None if keys is None else str(keys)
    orders = None if order_keys is None else str(order_keys)
    app = ClientApp()
    app.query("hello")(partial(hello, keys=path, order_keys=orders))
    app.query("placeholders")(placeholders)
    for handler in (labels, unique, counts, matches, total):
        app.query(handler.__name__)(partial(handler, keys=path, order_keys=orders))
    app.train()(train_or_share)
    for update in (gradient, hop, norm):
        app.train(update.__name__)(in_the_clear(update))
    return app
