"""What a stream is built of, from its settings: where it runs
(:func:`stream_device`), its model (:func:`build_stream_model`, the one place a
:class:`~stratify.stream.model.StreamModel`'s kind is chosen) and its training policy
(:func:`default_policy`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from stratify.errors import ConfigError
from stratify.privacy.accounting import DPSettings, dp_settings_of
from stratify.stream.config import StreamConfig, check_buffer_memory, check_model_memory
from stratify.stream.events import EventError
from stratify.stream.model import StreamModel
from stratify.stream.policies import PeriodicFedAvg, SingleSampleUpdates, StreamPolicy

if TYPE_CHECKING:
    from stratify.stream.features import StreamFeatures


def stream_device(config: StreamConfig, model: object, policy: StreamPolicy) -> str:
    """Where a stream's model and buffers live: ``cpu`` or ``cuda``. ``auto`` is the CPU
    for the default MLP of a policy that trains the NumPy MLP (a single-sample step of it
    is launch-bound on a GPU: docs/architecture.md, "Streaming"), else ``cuda`` when torch
    sees a GPU; torch is loaded only to ask it."""
    if config.device == "cpu" or (
        config.device == "auto" and model is None and config.model == "mlp" and policy.numpy_models
    ):
        return "cpu"
    from stratify.backend import resolve_device

    return resolve_device(config.device).type


def build_stream_model(
    config: StreamConfig,
    input_shape: tuple[int, ...],
    features: StreamFeatures,
    policy: StreamPolicy,
    device: str,
    given: object,
    classes: int,
    rows: int | None = None,
) -> StreamModel:
    """The stream's model for samples of ``input_shape``: the NumPy MLP when none is
    ``given``, ``config.model`` is an MLP on CPU and the policy trains NumPy models, else
    a torch model (``given``, or ``config.model`` built on ``device``).

    Parameters
    ----------
    config : StreamConfig
        The stream's settings (model, widths, seed, memory bound, ``--num-classes``).
    input_shape : tuple of int
        One sample's shape.
    features : StreamFeatures
        The standardisation the model applies to raw samples.
    policy : StreamPolicy
        The training policy (whether it trains NumPy models).
    device : str
        ``cpu`` or ``cuda``.
    given : torch.nn.Module or None
        A model to keep training.
    classes : int
        Classes known now (a given model's rows must cover them).
    rows : int, optional
        Rows of a built model's classifier (default: ``--num-classes``, else one per
        known class, at least one).

    Raises
    ------
    ConfigError
        The model would not fit in memory, cannot learn one sample at a time, or has
        too few rows or not ``--num-classes`` rows.
    """
    if rows is None:
        rows = config.num_classes or max(1, classes)
    model: StreamModel
    if given is None and config.model == "mlp" and device == "cpu" and policy.numpy_models:
        from stratify.stream.mlp import NumpyMLP
        from stratify.stream.numpy_model import NumpyStreamModel

        check_model_memory(config, input_shape, rows)
        network = NumpyMLP.build(math.prod(input_shape), rows, config.mlp_hidden, config.seed)
        model = NumpyStreamModel(network, features)
    else:
        from stratify.stream.torch_model import TorchStreamModel

        model = TorchStreamModel.build(config, given, device, input_shape, rows, features)
    if model.rows < classes or (
        config.num_classes is not None and model.rows != config.num_classes
    ):
        raise ConfigError(
            f"the model's classifier has {model.rows} rows for {classes} known classes "
            f"and --num-classes {config.num_classes}"
        )
    return model


def check_input_growth(
    config: StreamConfig, model: StreamModel, name: object, features: int
) -> None:
    """Refuse to widen the input to ``features`` for the new named feature ``name`` (the
    first of them) where it cannot grow: ``--input-shape`` given, not an MLP, or more
    than the memory holds.

    Raises
    ------
    EventError
        The refusal (the event is skipped).
    """
    if config.input_shape is not None or not model.is_mlp:
        raise EventError(
            f"feature {name!r} is new, and the model's input is fixed (an MLP "
            "sized from the first event grows; give --missing error to refuse such events)"
        )
    try:
        check_buffer_memory(config.capacity, features)
        check_model_memory(config, (features,), model.rows)
    except ConfigError as error:
        raise EventError(str(error)) from None


def default_policy(config: StreamConfig) -> StreamPolicy:
    """The policy of ``config.algorithm`` with ``config``'s settings."""
    if config.algorithm == "fedavg-periodic":
        return PeriodicFedAvg(
            every=int(config.fedavg_option("retrain_every")),
            local_epochs=int(config.fedavg_option("local_epochs")),
            local_batch_size=int(config.fedavg_option("local_batch_size")),
            lr=config.lr,
            local_momentum=float(config.fedavg_option("local_momentum")),
            seed=config.seed,
        )
    privacy = dp_settings_of(config)
    return SingleSampleUpdates(
        steps_per_event=config.steps_per_event,
        chunk=config.chunk,
        selection=config.selection,
        lr=config.lr,
        momentum=config.momentum,
        seed=config.seed,
        **({} if privacy is None else stream_privacy(config, privacy)),
    )


def stream_privacy(config: StreamConfig, privacy: DPSettings) -> dict[str, Any]:
    """The DP arguments of a stream's policy: each sample takes at most ``--max-uses``
    noised steps, so σ is calibrated for that many (docs/architecture.md, "Differential
    privacy")."""
    assert config.max_uses is not None  # StreamConfig refuses DP without it
    return {
        "dp_clip": privacy.clip,
        "dp_noise": privacy.sigma(config.max_uses),
        "dp_seed": privacy.seed,
    }
