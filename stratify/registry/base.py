"""The registry interface shared by the plain and CKKS registries.

A registry takes each client's label counts and returns placeholders: integers
``0..U-1`` assigned at random to the ``U`` unique labels, each client's own
label -> placeholder map (known to that client only), and the global count per
placeholder. The scheduler and selector see only placeholders.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stratify.errors import RegistryError


@dataclass(frozen=True)
class RegistryResult:
    """What a completed registration produces.

    Parameters
    ----------
    num_placeholders : int
        Number of unique labels ``U`` across all clients.
    client_maps : list of dict
        ``client_maps[k][label]`` is the placeholder of ``label`` for client ``k``.
    global_counts : numpy.ndarray
        ``global_counts[p]``: number of samples with placeholder ``p`` over all clients.
    """

    num_placeholders: int
    client_maps: list[dict[Hashable, int]]
    global_counts: np.ndarray

    def client_placeholders(self, client: int) -> set[int]:
        """The placeholders client ``client`` holds: all the server learns of its labels."""
        return set(self.client_maps[client].values())


def assign_placeholders(num_unique: int, seed: int) -> np.ndarray:
    """Placeholder of the i-th discovered unique label: a seeded random permutation.

    Discovery order follows client order, not label values, and the permutation hides
    even that, so placeholders are unlinkable to label values.
    """
    return np.random.default_rng([seed, 0x5EED]).permutation(num_unique)


# client labels are typed Mapping[Any, int]: Mapping is invariant in its key type, so
# Mapping[Hashable, int] would refuse a caller's dict[int, int]
def validate_client_labels(client_labels: Sequence[Mapping[Any, int]]) -> None:
    if len(client_labels) == 0:
        raise RegistryError("no clients to register; give at least one client with labels")
    for client, counts in enumerate(client_labels):
        if len(counts) == 0:
            raise RegistryError(f"client {client} has no labels; drop it or give it data")
        for label, count in counts.items():
            if int(count) != count or count <= 0:
                raise RegistryError(
                    f"client {client}: count {count!r} for label {label!r} "
                    "must be a positive integer"
                )


class LabelRegistry(ABC):
    """Maps real labels to placeholders and computes global counts.

    Subclasses implement :meth:`register`; it either completes and stores
    :attr:`result`, or raises :class:`~stratify.errors.RegistryError` and leaves the
    registry unchanged.

    Parameters
    ----------
    seed : int
        Seed of the placeholder assignment; the same seed gives the same placeholders in
        every registry implementation, so secure and plain runs learn identically.
    """

    name: str = "registry"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.result: RegistryResult | None = None

    @abstractmethod
    def register(
        self, client_labels: Sequence[Mapping[Any, int]], num_classes: int | None = None
    ) -> RegistryResult:
        """Register every client's ``{label: count}``; returns and stores the result.

        Parameters
        ----------
        client_labels : sequence of mapping
            ``client_labels[k]`` maps each label client ``k`` holds to its sample count.
        num_classes : int, optional
            Known number of classes; unique discovery may stop once it is reached.
        """
