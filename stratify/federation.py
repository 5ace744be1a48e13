"""Clients of a simulated federation: their sample indices, label counts and per-label pools."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stratify.errors import PartitionError
from stratify.registry.base import RegistryResult


@dataclass
class Federation:
    """The clients of one run.

    Parameters
    ----------
    client_indices : list of numpy.ndarray
        ``client_indices[k]``: indices into the training split held by client ``k``.
    labels : numpy.ndarray
        Real training labels; each client reads only its own entries.
    """

    client_indices: list[np.ndarray]
    labels: np.ndarray

    def __post_init__(self) -> None:
        self.client_indices = [np.asarray(ix, dtype=np.int64) for ix in self.client_indices]
        for client, indices in enumerate(self.client_indices):
            if len(indices) == 0:
                raise PartitionError(
                    f"client {client} received no samples; use fewer clients or another partition"
                )

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    @property
    def client_sizes(self) -> np.ndarray:
        return np.array([len(ix) for ix in self.client_indices], dtype=np.int64)

    def label_counts(self) -> list[dict[int, int]]:
        """Each client's ``{label: count}``, labels in ascending order: the registry's input."""
        counts = []
        for indices in self.client_indices:
            values, freq = np.unique(self.labels[indices], return_counts=True)
            counts.append({int(v): int(c) for v, c in zip(values, freq)})
        return counts

    def placeholder_counts(self, registry: RegistryResult) -> np.ndarray:
        """``(clients, placeholders)`` matrix of sample counts, from each client's own map."""
        matrix = np.zeros((self.num_clients, registry.num_placeholders), dtype=np.int64)
        for client, counts in enumerate(self.label_counts()):
            for label, count in counts.items():
                matrix[client, registry.client_maps[client][label]] = count
        return matrix

    def sample_placeholders(self, registry: RegistryResult) -> np.ndarray:
        """Placeholder of every training sample (-1 for samples no client holds)."""
        placeholders = np.full(len(self.labels), -1, dtype=np.int64)
        for client, indices in enumerate(self.client_indices):
            mapping = registry.client_maps[client]
            lookup = np.vectorize(lambda label, m=mapping: m[int(label)], otypes=[np.int64])
            placeholders[indices] = lookup(self.labels[indices])
        return placeholders

    def sample_clients(self) -> np.ndarray:
        """Client holding every training sample (-1 for samples no client holds)."""
        owners = np.full(len(self.labels), -1, dtype=np.int64)
        for client, indices in enumerate(self.client_indices):
            owners[indices] = client
        return owners


class SamplePools:
    """Per-client, per-placeholder pools of sample indices, drawn without replacement.

    Built fresh (and shuffled) at the start of every epoch. When every client's pool of a
    placeholder is empty, :meth:`refill` may start a new pass over that placeholder's
    samples (a fresh shuffle of each client's pool), so a scheduled label never has to be
    dropped; samples drawn after a refill count as ``reused``.

    Parameters
    ----------
    federation : Federation
        The clients.
    sample_placeholders : numpy.ndarray
        Placeholder of every training sample.
    num_placeholders : int
        Number of placeholders ``U``.
    rng : numpy.random.Generator
        Shuffles every pool (and every refilled pool).
    refill : bool
        Whether :meth:`refill` starts new passes (``--exhausted refill``) or declines
        (``--exhausted skip``: the entry is dropped and counted as skipped).
    """

    def __init__(
        self,
        federation: Federation,
        sample_placeholders: np.ndarray,
        num_placeholders: int,
        rng: np.random.Generator,
        refill: bool = False,
    ) -> None:
        shape = (federation.num_clients, num_placeholders)
        self.rng = rng
        self.allow_refill = refill
        self.pools: list[list[np.ndarray]] = []
        self.remaining = np.zeros(shape, dtype=np.int64)
        self.passes = np.zeros(num_placeholders, dtype=np.int64)
        self.reused = 0
        for client, indices in enumerate(federation.client_indices):
            by_placeholder = []
            placeholders_of_client = sample_placeholders[indices]
            for placeholder in range(num_placeholders):
                pool = indices[placeholders_of_client == placeholder]
                by_placeholder.append(rng.permutation(pool))
                self.remaining[client, placeholder] = len(pool)
            self.pools.append(by_placeholder)

    def take(self, client: int, placeholder: int) -> int:
        """Draw the next sample of ``placeholder`` from ``client``'s pool."""
        left = self.remaining[client, placeholder]
        pool = self.pools[client][placeholder]
        self.remaining[client, placeholder] = left - 1
        if self.passes[placeholder] > 0:
            self.reused += 1
        return int(pool[len(pool) - left])

    def refill(self, placeholder: int) -> bool:
        """Start a new pass over ``placeholder``'s samples once all of them are used.

        Returns whether the pools now hold samples of it: ``False`` when refilling is
        off, when some pool still has samples, or when no client holds the placeholder.
        """
        if not self.allow_refill or self.remaining[:, placeholder].any():
            return False
        sizes = np.array([len(pools[placeholder]) for pools in self.pools])
        if not sizes.any():
            return False
        for pools in self.pools:
            pools[placeholder] = self.rng.permutation(pools[placeholder])
        self.remaining[:, placeholder] = sizes
        self.passes[placeholder] += 1
        return True
