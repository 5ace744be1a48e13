"""The configuration of a stream: one dataclass, its defaults written once.

:class:`StreamConfig` is what a stream's ``config.json`` records; the ``stream`` command
generates its flags from the fields, as ``train`` does from
:class:`~stratify.config.TrainConfig` (docs/architecture.md, "Options"). A setting that
``train`` has too (the model's widths, the seed, the registry, the chunk size…) is not
declared again: its field is :func:`~stratify.options.option_of` the one of
:class:`~stratify.common_options.CommonOptions` that ``train`` copies too, with only what
differs for a stream (a default, a help sentence) changed. Nothing this module imports
loads torch (docs/architecture.md, "Options").
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from stratify.common_options import CommonOptions
from stratify.errors import ConfigError
from stratify.nn.catalog import BATCH_STATISTICS_NORMS, MODELS, mlp_weight_count
from stratify.options import RunSettings, option, option_of
from stratify.privacy.accounting import DPOptions, dp_settings_of
from stratify.stream.classifier import NEW_CLASS_ROWS
from stratify.stream.events import MISSING
from stratify.stream.policies import STREAM_ALGORITHMS
from stratify.stream.scaling import SCALES
from stratify.validation import (
    check_fits_in_memory,
    check_momentum,
    check_positive,
    check_positive_int,
    check_widths,
)

# options that may change between a stream and its resumption: where events and test
# samples come from, where files go, how often they are written, and what a divergence
# or an over-long line does
RESUMABLE_STREAM_CHANGES = (
    "source",
    "test",
    "files_root",
    "predictions",
    "out",
    "device",
    "eval_every",
    "checkpoint_every",
    "checkpoint_seconds",
    "on_diverge",
    "max_line_bytes",
)
#: the options of ``--algorithm fedavg-periodic`` and their defaults
FEDAVG_DEFAULTS = {
    "retrain_every": 500,
    "local_epochs": 1,
    "local_batch_size": 32,
    "local_momentum": 0.9,
}
ON_DIVERGE = ("stop", "skip")
#: drift detection on the prequential errors (:mod:`stratify.stream.drift`)
DRIFT_DETECTORS = ("off", "adwin")
#: bytes a buffered sample's bookkeeping takes besides its features: target (8),
#: occupied (1), placeholder, uses, arrival and identity (4 × 8)
SLOT_BYTES = 41


def check_shape(value: object, flag: str) -> tuple[int, ...]:
    """A sample shape: ``"1,28,28"`` or a sequence of positive ints, as a tuple."""
    try:
        return check_widths(value, flag)
    except ConfigError:
        raise ConfigError(
            f"{flag} takes comma-separated positive integers (e.g. 1,28,28), got {value!r}"
        ) from None


#: the most single-sample steps one event schedules, or passes a FedAvg round makes over
#: a buffer: a typo such as ``--steps-per-event 1000000000`` is refused up front instead
#: of making one event run for days (as the benches' ``--repeat``, docs/architecture.md
#: "Streaming")
MAX_UNIT_WORK = 10_000


def check_unit_work(value: object, flag: str) -> int:
    """A positive int of at most :data:`MAX_UNIT_WORK`: how many times a loop inside
    one event runs."""
    count = check_positive_int(value, flag)
    if count > MAX_UNIT_WORK:
        raise ConfigError(
            f"{flag} takes at most {MAX_UNIT_WORK:,} (it repeats work inside every event), "
            f"got {count:,}"
        )
    return count


def check_folder(value: object, flag: str) -> str:
    """An existing folder's name."""
    path = check_path(value, flag)
    if not os.path.isdir(path):
        raise ConfigError(f"{flag} {path} is not a folder; give the folder of the .npy files")
    return path


def check_flag(value: object, flag: str) -> bool:
    """``value`` if it is a boolean."""
    if not isinstance(value, bool):
        raise ConfigError(f"{flag} must be true or false, got {value!r}")
    return value


def check_path(value: object, flag: str) -> str:
    """A file name (or ``-``): a non-empty string."""
    if not isinstance(value, str) or not value or "\0" in value:
        raise ConfigError(f"{flag} must name a file, got {value!r}")
    return value


@dataclass
class StreamConfig(RunSettings):
    """Everything that defines a stream; written to ``config.json``.

    Every field made with :func:`~stratify.options.option` is a flag of ``stratify
    stream`` with that help text. Invalid values are refused on creation, with one line
    (:class:`~stratify.errors.ConfigError`).
    """

    source: str | None = option(
        None, "JSON Lines events: a file, or - for standard input.", check=check_path, cli_type=str
    )
    test: str | None = option(
        None,
        "Held-out samples in the events' format (no client needed), evaluated every "
        "--eval-every events.",
        check=check_path,
        cli_type=str,
    )
    files_root: str | None = option(
        None,
        'The folder events\' "path" entries (.npy files) are read from, and the only one: '
        'a path leading outside it is refused per event [default: none, "path" refused].',
        check=check_folder,
        cli_type=str,
    )
    predictions: str | None = option(
        None,
        "Where events without a label get their prediction, one JSON line each "
        '({"line", "id", "client", "prediction", "probability"}); - for standard output.',
        check=check_path,
        cli_type=str,
    )
    algorithm: str = option(
        "stratify",
        "stratify (single-sample updates after every event) or fedavg-periodic (a FedAvg "
        "round on the same buffers every --retrain-every events).",
        choices=STREAM_ALGORITHMS,
    )
    model: str = option_of(
        CommonOptions,
        "model",
        default="mlp",
        help="Model, sized from the first event's features: mlp | cnn | resnet9 | "
        "resnet18 | resnet20.",
        choices=tuple(MODELS),
        cli_type=str,
    )
    mlp_hidden: tuple[int, ...] | None = option_of(CommonOptions, "mlp_hidden")
    norm: str | None = option_of(
        CommonOptions,
        "norm",
        help="gn | none for the ResNets (one sample has no batch statistics) [default: the "
        "model's own; cnn and mlp have no norm layers].",
        choices=("bn", "gn", "none"),
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
    scale: str = option(
        "running",
        "Standardise every feature by the running mean and deviation of the events so far "
        "(running), or feed the features as they are (none).",
        choices=SCALES,
    )
    new_class: str = option(
        "auto",
        "A class new to the stream gets a classifier row set from its first sample's "
        "last hidden features, scaled to the known classes' rows (imprint), or a random "
        "row (random); auto: imprint for an MLP, random for other models.",
        choices=NEW_CLASS_ROWS,
    )
    missing: str = option(
        "error",
        "A named feature missing from an event (or null), or one new to the stream: the "
        "event is skipped (error), or, as river does, a missing one is read as 0 and a new "
        "one widens an MLP's input (zero; each warned once).",
        choices=MISSING,
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
    max_pending: int = option(
        10000,
        "Unlabeled events with an id kept for their late label; the oldest is dropped beyond it.",
        check=check_positive_int,
    )
    steps_per_event: int = option(
        1,
        f"Single-sample updates the server schedules after each arriving event (at most "
        f"{MAX_UNIT_WORK:,}).",
        check=check_unit_work,
    )
    chunk: int = option_of(CommonOptions, "chunk", modes=("single-sample", "batch"))
    selection: str = option_of(CommonOptions, "selection")
    lr: float = option_of(
        CommonOptions,
        "lr",
        default=0.01,
        help="Learning rate: of the single-sample steps, or the clients' local one for "
        "fedavg-periodic (constant: a stream has no epochs to decay over).",
        cli_type=float,
    )
    momentum: float = option_of(
        CommonOptions, "momentum", help="SGD momentum of the single-sample steps, in [0, 1)."
    )
    retrain_every: int | None = option(
        None,
        "fedavg-periodic: events between two rounds [default: 500].",
        check=check_positive_int,
        cli_type=int,
    )
    local_epochs: int | None = option(
        None,
        f"fedavg-periodic: passes over its buffer a client makes per round, at most "
        f"{MAX_UNIT_WORK:,} [default: 1].",
        check=check_unit_work,
        cli_type=int,
    )
    local_batch_size: int | None = option(
        None,
        "fedavg-periodic: local mini-batch size [default: 32].",
        check=check_positive_int,
        cli_type=int,
    )
    local_momentum: float | None = option(
        None,
        "fedavg-periodic: momentum of the clients' local SGD [default: 0.9].",
        check=check_momentum,
        cli_type=float,
    )
    on_diverge: str = option(
        "stop",
        "A non-finite loss or weight: stop with one line, the last checkpoint kept (stop), "
        "or undo that event's updates, count them and go on (skip).",
        choices=ON_DIVERGE,
    )
    drift: str = option(
        "off",
        "Drift detection on the prequential errors: river's ADWIN (adwin; needs river), "
        "which on a change to more errors evicts the older buffered samples and trains 3 "
        "more rounds per event for 500 events, or none (off).",
        choices=DRIFT_DETECTORS,
    )
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
    checkpoint_seconds: float = option(
        60.0,
        "Seconds after which a checkpoint is written even before --checkpoint-every events.",
        check=check_positive,
    )
    max_line_bytes: int = option(
        1 << 24,
        "A longer source line is read past without being kept, and skipped with a warning.",
        check=check_positive_int,
    )
    seed: int = option_of(
        CommonOptions,
        "seed",
        help="Seeds the schedule, the selection and the model's initial weights.",
    )
    device: str = option_of(
        CommonOptions,
        "device",
        help="Where the model and the buffers live; auto is the CPU for the MLP (NumPy, no "
        "torch), a GPU torch sees for other models.",
    )
    secure: bool = option_of(CommonOptions, "secure", check=check_flag)
    protocol: str = option_of(CommonOptions, "protocol")
    dp_epsilon: float | None = option_of(
        DPOptions,
        "dp_epsilon",
        help="Differential privacy for the updates: every step's gradient clipped to "
        "--dp-clip and noised on the client, the noise calibrated so that each sample's at "
        "most --max-uses steps spend this ε at --dp-delta (Opacus's RDP accountant; needs "
        "the privacy extra and --max-uses). Default: no DP.",
    )
    dp_noise: float | None = option_of(DPOptions, "dp_noise")
    dp_delta: float | None = option_of(DPOptions, "dp_delta")
    dp_clip: float | None = option_of(DPOptions, "dp_clip")
    dp_seed: int | None = option_of(DPOptions, "dp_seed")
    out: str | None = None

    resumable_changes = RESUMABLE_STREAM_CHANGES

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.out is not None:
            self.out = check_path(self.out, "--out")
        if self.algorithm == "stratify":
            given = [name for name in FEDAVG_DEFAULTS if getattr(self, name) is not None]
            if given:
                flags = ", ".join("--" + name.replace("_", "-") for name in given)
                raise ConfigError(f"{flags} applies to --algorithm fedavg-periodic, not stratify")
        if self.mlp_hidden is not None and self.model != "mlp":
            raise ConfigError(f"--mlp-hidden applies to --model mlp, not {self.model!r}")
        check_stream_private(self)
        check_buffer_memory(self.capacity, math.prod(self.input_shape or (1,)))
        if self.model == "mlp" or self.input_shape is not None:
            # the model for the fewest features the stream may have: a lower bound
            check_model_memory(self, self.input_shape or (1,), self.num_classes or 1)

    def fedavg_option(self, name: str) -> int | float:
        """A ``fedavg-periodic`` option, its default when not given."""
        value = getattr(self, name)
        return FEDAVG_DEFAULTS[name] if value is None else value


def check_stream_private(config: StreamConfig) -> None:
    """Refuse, in one line, DP a stream cannot give (docs/architecture.md, "Differential
    privacy"): a sample's uses must be bounded (``--max-uses``) for its ε to be, and only
    the single-sample updates of ``--algorithm stratify`` are clipped per sample."""
    if dp_settings_of(config) is None:
        return
    if config.algorithm != "stratify":
        raise ConfigError(
            f"--dp-epsilon/--dp-noise apply to --algorithm stratify; {config.algorithm}'s "
            "local training is not clipped per sample"
        )
    if config.max_uses is None:
        raise ConfigError(
            "DP needs --max-uses N: the ε of a sample grows with its steps, which a stream "
            "does not bound otherwise"
        )
    if config.norm in BATCH_STATISTICS_NORMS:
        raise ConfigError(
            f"--norm {config.norm} couples samples through batch statistics; with DP use "
            "--norm gn (or none)"
        )
    if config.new_class == "imprint" or (config.new_class == "auto" and config.model == "mlp"):
        raise ConfigError(
            "with DP give --new-class random: imprinting sets a classifier row from one "
            "sample's features, without noise"
        )
    if config.scale != "none":
        raise ConfigError(
            f"with DP give --scale none: --scale {config.scale} standardises by the mean and "
            "deviation of the raw features, without noise"
        )


def check_buffer_memory(capacity: int, features: int) -> None:
    """Refuse a ``--capacity`` whose first client's buffer (allocated whole at the first
    event) would not fit in memory."""
    check_fits_in_memory(
        capacity * (SLOT_BYTES + 4 * features),
        f"one client's buffer of --capacity {capacity:,} samples of {features:,} features",
        "give a smaller --capacity",
    )


def check_model_memory(config: StreamConfig, input_shape: tuple[int, ...], rows: int) -> None:
    """Refuse, before it is built, a model whose weights and gradients would not fit in
    memory: the MLP's size is counted from its widths, another model's on torch's meta
    device, which allocates nothing."""
    if config.model == "mlp":
        weights = mlp_weight_count(input_shape, rows, config.mlp_hidden)
    else:
        # torch only for the models that need it: the default MLP's stream never loads it
        import torch

        from stratify.nn.models import build_model

        with torch.device("meta"):
            model = build_model(
                config.model, input_shape, rows, norm=config.norm, hidden=config.mlp_hidden
            )
        weights = sum(parameter.numel() for parameter in model.parameters())
    shape = ",".join(map(str, input_shape))
    check_fits_in_memory(
        2 * 4 * weights,
        f"--model {config.model} for samples of shape {shape} ({weights:,} weights)",
        "use a smaller model (--mlp-hidden) or fewer features (--input-shape)",
    )
