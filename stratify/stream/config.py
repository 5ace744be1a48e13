"""The configuration of a stream: one dataclass, its defaults written once.

:class:`StreamConfig` is what a stream's ``config.json`` records; the ``stream`` command
generates its flags from the fields, as ``train`` does from
:class:`~stratify.config.TrainConfig` (docs/architecture.md, "Options").
"""

from __future__ import annotations

from dataclasses import dataclass

from stratify.backend import DEVICES
from stratify.config import PROTOCOLS
from stratify.errors import ConfigError
from stratify.options import RunSettings, option
from stratify.selection import SELECTIONS
from stratify.validation import (
    check_momentum,
    check_positive,
    check_positive_int,
    check_seed,
    check_widths,
)

# options that may change between a stream and its resumption: where events and test
# samples come from, where files go, and how often they are written
RESUMABLE_STREAM_CHANGES = ("source", "test", "out", "device", "eval_every", "checkpoint_every")


def check_shape(value: object, flag: str) -> tuple[int, ...]:
    """A sample shape: ``"1,28,28"`` or a sequence of positive ints, as a tuple."""
    try:
        return check_widths(value, flag)
    except ConfigError:
        raise ConfigError(
            f"{flag} takes comma-separated positive integers (e.g. 1,28,28), got {value!r}"
        ) from None


@dataclass
class StreamConfig(RunSettings):
    """Everything that defines a stream; written to ``config.json``.

    Every field made with :func:`~stratify.options.option` is a flag of ``stratify
    stream`` with that help text. Invalid values are refused on creation.
    """

    source: str | None = option(
        None, "JSON Lines events: a file, or - for standard input.", cli_type=str
    )
    test: str | None = option(
        None,
        "Held-out samples in the events' format (no client needed), evaluated every "
        "--eval-every events.",
        cli_type=str,
    )
    model: str = option(
        "mlp",
        "Model, sized from the first event's features: mlp | cnn | resnet9 | resnet18 | resnet20.",
    )
    mlp_hidden: tuple[int, ...] | None = option(
        None,
        "Hidden-layer widths of --model mlp, comma-separated [default: 200,200].",
        check=check_widths,
        cli_type=str,
    )
    norm: str | None = option(
        None,
        "gn | none for the ResNets (one sample has no batch statistics) [default: the "
        "model's own; cnn and mlp have no norm layers].",
        cli_type=str,
    )
    input_shape: tuple[int, ...] | None = option(
        None,
        "Shape of one sample, e.g. 1,28,28 for flat MNIST rows and --model cnn "
        "[default: the first event's].",
        check=check_shape,
        cli_type=str,
    )
    num_classes: int | None = option(
        None,
        "A classifier of this many classes [default: one that grows as labels arrive].",
        check=check_positive_int,
        cli_type=int,
    )
    capacity: int = option(
        100,
        "Samples each client's buffer holds; a new one evicts the client's oldest.",
        check=check_positive_int,
    )
    max_uses: int | None = option(
        None,
        "Training steps a sample may take before it leaves its buffer [default: no limit].",
        check=check_positive_int,
        cli_type=int,
    )
    max_clients: int = option(
        100,
        "Clients registered on their first event; a further new client's events are skipped.",
        check=check_positive_int,
    )
    steps_per_event: int = option(
        1,
        "Single-sample updates the server schedules after each arriving event.",
        check=check_positive_int,
    )
    chunk: int = option(
        5,
        "Chunk size CS: consecutive schedule entries that may stay with one client.",
        check=check_positive_int,
    )
    selection: str = option(
        "uniform", "How a client is chosen among those holding the label.", choices=SELECTIONS
    )
    lr: float = option(0.01, "Learning rate of the single-sample steps.", check=check_positive)
    momentum: float = option(0.0, "SGD momentum, in [0, 1).", check=check_momentum)
    window: int = option(
        500,
        "Events in the sliding window of the prequential accuracy.",
        check=check_positive_int,
    )
    eval_every: int = option(
        1000,
        "Events between two metrics lines (each with the held-out accuracy, given --test).",
        check=check_positive_int,
    )
    checkpoint_every: int = option(
        5000,
        "Events between two checkpoints (one more is written when the source ends).",
        check=check_positive_int,
    )
    seed: int = option(
        0, "Seeds the schedule, the selection and the model's initial weights.", check=check_seed
    )
    device: str = option("auto", "Where the model and the buffers live.", choices=DEVICES)
    secure: bool = option(True, "CKKS placeholder registry, or the plain one.")
    protocol: str = option("packed", "CKKS protocol of the secure registry.", choices=PROTOCOLS)
    out: str | None = None

    resumable_changes = RESUMABLE_STREAM_CHANGES
