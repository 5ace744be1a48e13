"""A node: one client of the federation as a Flower ``ClientApp``.

The node loads the run's dataset itself, keeps only its own client's samples (the client
is the node's ``partition-id``) and answers the server app's messages with the engine's
own code: local training is :meth:`stratify.client.LocalTrainer.train_eager`, a share of a
global batch :meth:`~stratify.client.LocalTrainer.batch_gradient` (docs/flower.md).
Sample positions are the node's own, ``0..n_k-1``; labels never leave it except as the
plain registry's counts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from stratify.client import GradientHook, GradientOffset, LocalTrainer, ProximalGradient
from stratify.data.datasets import load_dataset
from stratify.errors import ConfigError
from stratify.experiment import partition_clients
from stratify.federation import Federation
from stratify.flower.messages import (
    index_record,
    read_config,
    read_indices,
    read_state,
    state_record,
)
from stratify.nn.models import build_model, default_model
from stratify.state import load_into


@dataclass
class NodeData:
    """What one node holds: its client's samples, a trainer over them and a model to load
    the received states into."""

    client: int
    labels: np.ndarray
    trainer: LocalTrainer
    model: nn.Module

    @property
    def size(self) -> int:
        return len(self.labels)


#: the nodes this process serves, by (partition id, the run's settings): a simulation
#: runs many nodes in one worker, and a node keeps its data across a run's messages
_NODES: dict[tuple[int, str], NodeData] = {}


def partition_id(context: Context) -> int:
    """The client this node is (``--node-config partition-id=K``; the simulation sets it)."""
    if "partition-id" not in context.node_config:
        raise ConfigError("a Stratify node needs its client number: --node-config partition-id=K")
    return int(context.node_config["partition-id"])


def node_data(content: RecordDict, context: Context) -> NodeData:
    """This node's data for the run in ``content``: loaded, partitioned as the in-process
    run partitions, and cut to its own client, once per run."""
    client = partition_id(context)
    key = (client, str(content.config_records["run"]["config"]))
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
        _NODES[key] = NodeData(client, y.numpy(), LocalTrainer(x, y), model)
    return _NODES[key]


def received_model(node: NodeData, content: RecordDict) -> nn.Module:
    """The node's model holding the state the server sent."""
    load_into(node.model, read_state(content.array_records["model"], torch.device("cpu")))
    node.model.train()
    return node.model


def reply(message: Message, **records: ArrayRecord | ConfigRecord) -> Message:
    return Message(RecordDict(dict(records)), reply_to=message)


def hello(message: Message, context: Context) -> Message:
    """The node's client number and sample count, and the plain registry's input: its
    ``{label: count}``, in ascending labels as
    :meth:`~stratify.federation.Federation.label_counts` lists them in-process."""
    node = node_data(message.content, context)
    counts = Federation([np.arange(node.size)], node.labels).label_counts()[0]
    return reply(
        message,
        node=ConfigRecord({"client": node.client, "size": node.size}),
        labels=ConfigRecord({"labels": list(counts), "counts": list(counts.values())}),
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
    model = received_model(node, message.content)
    job = message.content.config_records["job"]
    orders = message.content.array_records["orders"]
    hook: GradientHook | None = None
    if job["term"] == "proximal":
        anchor = [parameter.detach().clone() for parameter in model.parameters()]
        hook = ProximalGradient(anchor, float(job["mu"]))  # type: ignore[arg-type]
    elif job["term"] == "offset":
        offsets = read_state(message.content.array_records["offset"], torch.device("cpu"))
        hook = GradientOffset(list(offsets.values()))
    result = node.trainer.train_eager(
        model,
        [read_indices(orders, str(epoch)) for epoch in range(len(orders))],
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
    model = received_model(node, message.content)
    share = read_indices(message.content.array_records["share"], "positions")
    model.zero_grad(set_to_none=True)
    loss = node.trainer.batch_gradient(
        model, share, np.zeros(len(share), dtype=np.int64), divisor=1
    )
    grads = {
        name: parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)
        for name, parameter in model.named_parameters()
    }
    return reply(message, gradient=state_record(grads), loss=ConfigRecord({"loss_sum": loss}))


def hop(message: Message, context: Context) -> Message:
    """The travelling model's steps on this node: one plain SGD step per sample, in the
    order the server's plan gives (Stratify's single-sample mode)."""
    node = node_data(message.content, context)
    model = received_model(node, message.content)
    steps = read_indices(message.content.array_records["steps"], "positions")
    lr = float(message.content.config_records["hop"]["lr"])  # type: ignore[arg-type]
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = node.trainer.single_sample_steps(model, optimizer, steps.tolist(), lr)
    return reply(
        message,
        model=state_record(model.state_dict()),
        losses=ArrayRecord({"losses": Array(torch.stack(losses).numpy())}),
    )


def client_app() -> ClientApp:
    """The ``ClientApp`` every node runs (simulation and deployment alike)."""
    app = ClientApp()
    app.query("hello")(hello)
    app.query("placeholders")(placeholders)
    app.train()(train)
    app.train("gradient")(gradient)
    app.train("hop")(hop)
    return app
