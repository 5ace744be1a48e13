"""Pieces shared by the averaging baselines: their options, client sampling, averaging math.

The math lives in pure functions over ``{name: tensor}`` dictionaries so the tests can
check it against hand-computed values without a engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from stratify.errors import ConfigError
from stratify.options import Probe, StrategyOptions, option, option_of
from stratify.state import State
from stratify.stratify import StratifyOptions
from stratify.validation import (
    check_fraction,
    check_momentum,
    check_nonnegative,
    check_positive_int,
)

#: How BatchNorm running statistics (and other buffers) are treated by averaging methods.
BN_BUFFER_MODES: dict[str, str] = {
    "average": "sample-weighted average of the clients' buffers, like the parameters",
    "local": "each client keeps its own buffers; the global model evaluates with their average",
}

#: Aggregation weights of the averaging methods (FedBSS, FedBR and FedDiverse use equal).
WEIGHTINGS = ("samples", "equal")

#: Local mini-batch size of the batch-data setting when ``--local-batch-size`` is not given.
DEFAULT_BATCH_SIZE = 64

LocalOptionsT = TypeVar("LocalOptionsT", bound="LocalTrainingOptions")


@dataclass
class LocalTrainingOptions(StrategyOptions):
    """Options of every method whose clients run local SGD on their own samples."""

    # ``int | None``: methods may leave it to be resolved per mode (FedAvgOptions)
    local_epochs: int | None = option(
        1,
        "Passes E over its own data a client makes per round.",
        check=check_positive_int,
        probe=Probe(2),
    )
    local_batch_size: int | None = option(
        None,
        "Local mini-batch size.",
        check=check_positive_int,
        cli_type=int,
        per_mode={"single-sample": 1, "batch": DEFAULT_BATCH_SIZE},
        probe=Probe(8),
    )
    # FedTAN takes 1 step a round: 2 local epochs let momentum act
    local_momentum: float | None = option(
        0.0,
        "SGD momentum of the clients' local optimizer, in [0, 1).",
        check=check_momentum,
        probe=Probe(0.5, {"options": {"local_epochs": 2}}),
    )
    local_weight_decay: float = option(
        0.0,
        "L2 weight decay of the clients' local optimizer.",
        check=check_nonnegative,
        probe=Probe(0.1),
    )
    compile: str = option_of(StratifyOptions, "compile")

    def for_mode(self: LocalOptionsT, mode: str) -> LocalOptionsT:
        """Single-sample learning trains on batches of one, so only ``None`` or 1 fit it."""
        if mode == "single-sample" and self.local_batch_size not in (None, 1):
            raise ConfigError(
                f"--local-batch-size {self.local_batch_size} does not fit --mode "
                f"single-sample (local updates use one sample); use --mode batch"
            )
        return super().for_mode(mode)


@dataclass
class ClientSamplingOptions(LocalTrainingOptions):
    """Options of the methods that sample a fraction of the clients every round."""

    client_fraction: float = option(
        1.0,
        "Fraction C of the clients taking part in a round, in (0, 1].",
        check=check_fraction,
        probe=Probe(0.67),
    )
    # None: the other choice; FedBSS and FedDiverse sample one of the three clients
    weighting: str = option(
        "samples",
        "Aggregation weights: the clients' sample counts n_k, or equal for every client.",
        choices=WEIGHTINGS,
        probe=Probe(None, {"partition": "dirichlet:1.0", "options": {"client_fraction": 1.0}}),
    )


def client_weights(sizes: Sequence[int], weighting: str) -> list[float]:
    """Aggregation weights of clients with ``sizes`` samples: ``n_k``, or 1 each (equal)."""
    if weighting == "equal":
        return [1.0] * len(sizes)
    return [float(size) for size in sizes]


def participant_count(num_clients: int, fraction: float) -> int:
    """How many clients take part in a round: ``max(1, round(fraction · K))``."""
    return max(1, int(round(fraction * num_clients)))


def participants(num_clients: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """The clients of one round: :func:`participant_count` drawn without replacement.

    With ``fraction = 1`` every client takes part and no random number is drawn.
    Returned in ascending order.
    """
    count = participant_count(num_clients, fraction)
    if count >= num_clients:
        return np.arange(num_clients)
    return np.sort(rng.choice(num_clients, size=count, replace=False))


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
