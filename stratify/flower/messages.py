"""What travels between the server app and the nodes: the message types and how a run's
settings, model states, index arrays and gradients become Flower records
(docs/flower.md, "What each party sees").
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from stratify.algorithms import ALGORITHMS, strategy_class
from stratify.config import TrainConfig
from stratify.errors import ConfigError, CorruptRunError
from stratify.flower.keys import SCHEMES
from stratify.nn.norm_exchange import LayerAdjoint, LayerSums
from stratify.runfiles import parse_json

#: the server asks a node which client it is and has it load that client's data; the
#: reply carries the plain registry's input, the node's {label: count}, or with the
#: encrypted registry its number of labels only (and, from the key holder, the public context)
HELLO = "query.hello"
#: the node's own label -> placeholder map down, the placeholder of each of its samples up
PLACEHOLDERS = "query.placeholders"
#: the encrypted registry (docs/flower.md, "The encrypted registry"): the block size down,
#: the client's encrypted label vectors up
LABELS = "query.labels"
#: which of the client's labels are new to U down, Enc(delta) of their codes up
UNIQUE = "query.unique"
#: to the key holder: the server's (blinded) comparisons down, which slots match up
MATCHES = "query.matches"
#: the index in U of each of the client's labels down; its encrypted counts at its
#: placeholders' slots and the placeholder of each of its samples up
COUNTS = "query.counts"
#: to the key holder: the (masked) total of counts down, its decryption up
TOTAL = "query.total"
#: local training of a copy of the global model (the averaging methods)
TRAIN = "train"
#: the summed loss gradient of the node's share of one global batch (Stratify, batch mode)
GRADIENT = "train.gradient"
#: a hop of the travelling model: one SGD step per sample (Stratify, single-sample mode)
HOP = "train.hop"
#: one exchange of the sum-based BatchNorm's (Stratify, batch mode, --norm sumbn): a
#: layer's sums, a layer's adjoint, or the gradient, of the node's share of a global
#: batch (:mod:`stratify.nn.norm_exchange`)
NORM = "train.norm"


def config_json(config: TrainConfig) -> str:
    """A run's settings as JSON text (a message's, a deployment's run configuration)."""
    return json.dumps(dataclasses.asdict(config))


def config_from_json(text: str) -> TrainConfig:
    """The settings of :func:`config_json` (or any subset of the fields), checked again
    as any configuration is.

    Parameters
    ----------
    text : str
        A JSON object of :class:`~stratify.config.TrainConfig` fields.

    Raises
    ------
    ConfigError
        One line: not strict JSON (nesting past the interpreter's stack included), not an
        object, a field :class:`~stratify.config.TrainConfig` does not have, or a value
        it refuses.
    """
    try:
        values = parse_json(text, "config")
    except CorruptRunError as error:
        raise ConfigError(str(error)) from None
    if not isinstance(values, dict):
        raise ConfigError(f"config must be a JSON object of settings, not {type(values).__name__}")
    unknown = sorted(set(values) - {field.name for field in dataclasses.fields(TrainConfig)})
    if unknown:
        # TrainConfig(**values) would say so as a TypeError, which reads as a bug
        raise ConfigError(f"config has no setting {unknown[0]!r}")
    if values.get("mlp_hidden") is not None:
        if not isinstance(values["mlp_hidden"], list):
            raise ConfigError(
                f"config's mlp_hidden must be a list of widths, got {values['mlp_hidden']!r}"
            )
        values["mlp_hidden"] = tuple(values["mlp_hidden"])
    return TrainConfig(**values)


def config_record(config: TrainConfig) -> ConfigRecord:
    """The run's settings as one JSON text: every node loads its data from them."""
    return ConfigRecord({"config": config_json(config)})


def read_config(content: RecordDict) -> TrainConfig:
    """The settings :func:`config_record` sent."""
    return config_from_json(str(content.config_records["run"]["config"]))


def state_record(state: Mapping[str, torch.Tensor]) -> ArrayRecord:
    """A model state (or any named tensors) as an :class:`~flwr.app.ArrayRecord`, on the CPU."""
    return ArrayRecord({key: value.detach().cpu() for key, value in state.items()})


def read_state(record: ArrayRecord, device: torch.device) -> dict[str, torch.Tensor]:
    """The named tensors of :func:`state_record`, on ``device``."""
    return {key: value.to(device) for key, value in record.to_torch_state_dict().items()}


def index_record(**arrays: np.ndarray) -> ArrayRecord:
    """Integer arrays (sample positions, placeholders) as one record."""
    return ArrayRecord(
        {name: Array(np.ascontiguousarray(a, dtype=np.int64)) for name, a in arrays.items()}
    )


def read_indices(record: ArrayRecord, name: str) -> np.ndarray:
    return np.asarray(record[name].numpy(), dtype=np.int64)


def flower_methods() -> tuple[str, ...]:
    """The registered methods whose card says every read of their training data goes
    through the trainer (:attr:`~stratify.card.MethodCard.flower`), so that a
    :class:`~stratify.flower.server.RemoteTrainer` sends it to the nodes; another method
    could read the server's stand-in data and train on nothing. tests/test_flower.py
    checks each claim: the method's simulated run ends with the in-process weights."""
    return tuple(name for name in ALGORITHMS if strategy_class(name).card.flower)


#: the encrypted registry's protocols whose parties run on their own nodes
SECURE_PROTOCOLS = tuple(SCHEMES)


def check_flower_config(config: TrainConfig) -> None:
    """Refuse the settings a Flower run does not carry (docs/flower.md, "Limits")."""
    if not strategy_class(config.algorithm).card.flower:
        raise ConfigError(
            f"--algorithm {config.algorithm} does not run over Flower yet; choose one of "
            f"{', '.join(flower_methods())}"
        )
    if config.mode != "batch" and config.algorithm != "stratify":
        raise ConfigError(
            f"over Flower --algorithm {config.algorithm} runs in --mode batch only (for now)"
        )
    if config.mode == "single-sample":
        if config.options.get("momentum"):
            raise ConfigError("over Flower Stratify's hops send no momentum: leave --momentum 0")
        if config.options.get("hops") == "direct":
            raise ConfigError(
                "over Flower the model travels through the server: --hops server, not direct"
            )
    if config.secure and config.protocol not in SECURE_PROTOCOLS:
        raise ConfigError(
            f"over Flower the encrypted registry runs --protocol {' or '.join(SECURE_PROTOCOLS)}, "
            f"not {config.protocol}"
        )
    if config.validation:
        raise ConfigError("a Flower run has no validation split: leave --validation at 0")


def norm_records(
    phase: str,
    sums: Sequence[LayerSums],
    adjoints: Mapping[int, LayerAdjoint] | None,
    layer: int | None,
) -> dict[str, ArrayRecord | ConfigRecord]:
    """A BatchNorm exchange's request: the phase, the layer, every layer's sums so far
    and the adjoints so far (per-channel vectors, never a sample)."""
    vectors: dict[str, torch.Tensor] = {}
    for position, layer_sums in enumerate(sums):
        vectors[f"total-{position}"] = layer_sums.total
        vectors[f"squares-{position}"] = layer_sums.squares
    for position, adjoint in (adjoints or {}).items():
        vectors[f"adjoint-total-{position}"] = adjoint.total
        vectors[f"adjoint-squares-{position}"] = adjoint.squares
    settings = ConfigRecord(
        {
            "phase": phase,
            "layer": -1 if layer is None else layer,
            "counts": [layer_sums.count for layer_sums in sums],
            "adjoints": sorted((adjoints or {}).keys()),
        }
    )
    return {"norm": settings, "vectors": state_record(vectors)}


def read_norm_records(
    content: RecordDict,
) -> tuple[str, list[LayerSums], dict[int, LayerAdjoint], int | None]:
    """The phase, sums, adjoints and layer of :func:`norm_records`."""
    settings = content.config_records["norm"]
    vectors = read_state(content.array_records["vectors"], torch.device("cpu"))
    counts = cast(list[int], settings["counts"])
    sums = [
        LayerSums(vectors[f"total-{p}"], vectors[f"squares-{p}"], int(count))
        for p, count in enumerate(counts)
    ]
    adjoints = {
        int(p): LayerAdjoint(vectors[f"adjoint-total-{p}"], vectors[f"adjoint-squares-{p}"])
        for p in cast(list[int], settings["adjoints"])
    }
    layer = int(cast(int, settings["layer"]))
    return str(settings["phase"]), sums, adjoints, None if layer < 0 else layer
