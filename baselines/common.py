"""Pieces shared by the averaging baselines: option checks, client sampling, averaging math.

The math lives in pure functions over ``{name: tensor}`` dictionaries so the tests can
check it against hand-computed values without a router.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from stratify.errors import ConfigError

#: How BatchNorm running statistics (and other buffers) are treated by averaging methods.
BN_BUFFER_MODES: dict[str, str] = {
    "average": "sample-weighted average of the clients' buffers, like the parameters",
    "local": "each client keeps its own buffers; the global model evaluates with their average",
}

#: Local mini-batch size of the batch-data setting when ``--local-batch-size`` is not given.
DEFAULT_BATCH_SIZE = 64

State = dict[str, torch.Tensor]


# -- option checks -------------------------------------------------------------------------


def check_positive_int(value: object, flag: str) -> int:
    """``value`` as a positive int, or a ConfigError naming ``flag``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ConfigError(f"{flag} must be a positive integer, got {value!r}")
    return int(value)


def check_fraction(value: object, flag: str = "--client-fraction") -> float:
    """``value`` as a float in ``(0, 1]``."""
    try:
        fraction = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} must be a number in (0, 1], got {value!r}") from None
    if not 0.0 < fraction <= 1.0:
        raise ConfigError(f"{flag} must be in (0, 1], got {value!r}")
    return fraction


def check_positive(value: object, flag: str) -> float:
    """``value`` as a finite float ``> 0``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} must be a positive number, got {value!r}") from None
    if not (math.isfinite(number) and number > 0):
        raise ConfigError(f"{flag} must be a positive number, got {value!r}")
    return number


def check_bn_buffers(value: object) -> str:
    if value not in BN_BUFFER_MODES:
        raise ConfigError(f"unknown --bn-buffers {value!r}; choose {' or '.join(BN_BUFFER_MODES)}")
    return str(value)


def resolve_batch_size(local_batch_size: int | None, mode: str, algorithm: str) -> int:
    """The local mini-batch size of ``mode``.

    Single-sample learning trains on batches of one, so only ``None`` or 1 fit it;
    batch-data learning defaults to :data:`DEFAULT_BATCH_SIZE`.
    """
    if mode == "single-sample":
        if local_batch_size not in (None, 1):
            raise ConfigError(
                f"--local-batch-size {local_batch_size} does not fit --mode single-sample "
                f"(local updates use one sample); use --mode batch with {algorithm}"
            )
        return 1
    return DEFAULT_BATCH_SIZE if local_batch_size is None else local_batch_size


def participants(num_clients: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """The clients of one round: ``max(1, round(fraction · K))`` drawn without replacement.

    With ``fraction = 1`` every client takes part and no random number is drawn.
    Returned in ascending order.
    """
    count = max(1, int(round(fraction * num_clients)))
    if count >= num_clients:
        return np.arange(num_clients)
    return np.sort(rng.choice(num_clients, size=count, replace=False))


# -- state dictionaries --------------------------------------------------------------------


def parameter_names(model: nn.Module) -> list[str]:
    """Names (state-dict keys) of the trainable parameters, in ``model.parameters()`` order."""
    return [name for name, parameter in model.named_parameters() if parameter.requires_grad]


def buffer_names(model: nn.Module) -> list[str]:
    """State-dict keys that are not trainable parameters: BN running statistics and counters."""
    trainable = set(parameter_names(model))
    return [name for name in model.state_dict() if name not in trainable]


def weighted_average(
    states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]
) -> State:
    """``Σ_k w_k s_k / Σ_k w_k`` for every key of the states.

    Parameters
    ----------
    states : sequence of dict
        Client states with the same keys and shapes.
    weights : sequence of float
        Non-negative weights (e.g. client sample counts), not all zero.

    Returns
    -------
    dict
        The average, each tensor in its input dtype. Floating tensors are accumulated in
        float64, then rounded once. Integer tensors (BN's ``num_batches_tracked``) get the
        weighted mean rounded to the nearest integer, so counters stay counters.
    """
    if not states:
        raise ValueError("weighted_average needs at least one state")
    if len(states) != len(weights):
        raise ValueError(f"{len(states)} states but {len(weights)} weights")
    total = float(sum(weights))
    if not total > 0:
        raise ValueError(f"weights must have a positive sum, got {list(weights)}")
    shares = [float(weight) / total for weight in weights]
    average: State = {}
    for key, first in states[0].items():
        accumulator = torch.zeros(first.shape, dtype=torch.float64, device=first.device)
        for share, state in zip(shares, states):
            accumulator += share * state[key].to(torch.float64)
        if first.is_floating_point():
            average[key] = accumulator.to(first.dtype)
        else:
            average[key] = accumulator.round().to(first.dtype)
    return average


def mean_state(states: Sequence[Mapping[str, torch.Tensor]]) -> State:
    """Unweighted mean of states (SCAFFOLD's server average)."""
    return weighted_average(states, [1.0] * len(states))


def clone_state(
    state: Mapping[str, torch.Tensor],
    keys: Sequence[str] | None = None,
    device: torch.device | None = None,
) -> State:
    """Detached copies of ``state`` (of ``keys`` only, if given), moved to ``device`` if given."""
    keys = list(state) if keys is None else keys
    if device is None:
        return {key: state[key].detach().clone() for key in keys}
    return {key: state[key].detach().to(device, copy=True) for key in keys}


@torch.no_grad()
def load_into(model: nn.Module, values: Mapping[str, torch.Tensor]) -> None:
    """Copy ``values`` into the matching parameters/buffers of ``model`` in place."""
    state = model.state_dict()
    for key, value in values.items():
        state[key].copy_(value)
