"""Clients of a simulated federation: their sample indices, label counts and per-label pools.

Everything here costs time in the number of samples and of (client, label) pairs that hold
samples, never in clients × labels: with thousands of clients most pairs are empty
(docs/architecture.md, "Performance").
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from stratify.errors import PartitionError
from stratify.registry.base import RegistryResult


@dataclass(frozen=True)
class LabelRuns:
    """The training samples held by the clients, grouped by (client, label).

    Parameters
    ----------
    samples : numpy.ndarray
        Every held sample index, client by client and, within a client, label by label
        (ascending); within a group the client's own order is kept.
    run : numpy.ndarray
        For each entry of ``samples``, the number of its (client, label) group.
    clients, labels, counts : numpy.ndarray
        Per group: the client, the real label and the number of samples.
    """

    samples: np.ndarray
    run: np.ndarray
    clients: np.ndarray
    labels: np.ndarray
    counts: np.ndarray


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

    def held_samples(self) -> tuple[np.ndarray, np.ndarray]:
        """Every held sample index, client after client, and the client holding each."""
        samples = np.concatenate(self.client_indices)
        owners = np.repeat(np.arange(self.num_clients, dtype=np.int64), self.client_sizes)
        return samples, owners

    def label_runs(self) -> LabelRuns:
        """The held samples grouped by (client, label), in one sort."""
        samples, owners = self.held_samples()
        labels = np.asarray(self.labels)[samples]
        # owners are already ascending; the sort orders each client's samples by label and
        # keeps the client's own order within a label
        order = np.lexsort((labels, owners))
        samples, owners, labels = samples[order], owners[order], labels[order]
        starts = np.ones(len(samples), dtype=bool)
        starts[1:] = (owners[1:] != owners[:-1]) | (labels[1:] != labels[:-1])
        first = np.flatnonzero(starts)
        counts = np.diff(np.append(first, len(samples)))
        return LabelRuns(samples, np.cumsum(starts) - 1, owners[first], labels[first], counts)

    def label_counts(self) -> list[dict[int, int]]:
        """Each client's ``{label: count}``, labels in ascending order: the registry's input.

        The order reaches no other party: the secure registry's clients encode their labels
        in their own secret random order (docs/architecture.md, "Privacy").
        """
        runs = self.label_runs()
        counts: list[dict[int, int]] = [{} for _ in range(self.num_clients)]
        for client, label, count in zip(
            runs.clients.tolist(), runs.labels.tolist(), runs.counts.tolist()
        ):
            counts[client][int(label)] = count
        return counts

    def run_placeholders(self, placeholders: RegistryResult, runs: LabelRuns) -> np.ndarray:
        """The placeholder of every (client, label) group of ``runs``, from each client's map."""
        maps = placeholders.client_maps
        return np.array(
            [
                maps[client][int(label)]
                for client, label in zip(runs.clients.tolist(), runs.labels.tolist())
            ],
            dtype=np.int64,
        )

    def placeholder_counts(self, placeholders: RegistryResult) -> np.ndarray:
        """``(clients, placeholders)`` matrix of sample counts, from each client's own map."""
        runs = self.label_runs()
        matrix = np.zeros((self.num_clients, placeholders.num_placeholders), dtype=np.int64)
        matrix[runs.clients, self.run_placeholders(placeholders, runs)] = runs.counts
        return matrix

    def sample_placeholders(self, placeholders: RegistryResult) -> np.ndarray:
        """Placeholder of every training sample (-1 for samples no client holds)."""
        runs = self.label_runs()
        of_sample = np.full(len(self.labels), -1, dtype=np.int64)
        of_sample[runs.samples] = self.run_placeholders(placeholders, runs)[runs.run]
        return of_sample

    def sample_clients(self) -> np.ndarray:
        """Client holding every training sample (-1 for samples no client holds)."""
        samples, owners = self.held_samples()
        clients = np.full(len(self.labels), -1, dtype=np.int64)
        clients[samples] = owners
        return clients


class SamplePools:
    """Per-client, per-placeholder pools of sample indices, drawn without replacement.

    Built fresh (and shuffled) at the start of every epoch. When every client's pool of a
    placeholder is empty, :meth:`refill` may start a new pass over that placeholder's
    samples (a fresh shuffle of each client's pool), so a scheduled label never has to be
    dropped; samples drawn after a refill count as ``reused``.

    The pools live in one array, grouped by (client, placeholder); per placeholder the
    pools keep the ascending list of clients that still have a sample of it
    (:attr:`available`), which is all the selection needs to read, so a draw never looks
    at the clients holding nothing of the label.

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
        num_clients = federation.num_clients
        self.num_clients = num_clients
        self.num_placeholders = num_placeholders
        self.rng = rng
        self.allow_refill = refill
        #: per placeholder, the passes started after the first (refills)
        self.passes = [0] * num_placeholders
        self.reused = 0
        samples, owners = federation.held_samples()
        key = owners * num_placeholders + np.asarray(sample_placeholders)[samples]
        # a stable sort keeps each client's own order within a pool
        self.samples = samples[np.argsort(key, kind="stable")]
        keys, sizes = np.unique(key, return_counts=True)
        ends = np.cumsum(sizes)
        # pools are shuffled client by client, placeholder by placeholder, in place (the
        # draws of rng.permutation); a pool of fewer than two samples draws nothing from
        # rng, so skipping those keeps every draw
        for pool in np.flatnonzero(sizes >= 2).tolist():
            rng.shuffle(self.samples[ends[pool] - sizes[pool] : ends[pool]])
        # only the non-empty pools are kept: (client * U + placeholder) -> pool number
        self.pool_of = {key: pool for pool, key in enumerate(keys.tolist())}
        self.sizes: list[int] = sizes.tolist()
        self.ends: list[int] = ends.tolist()
        self.left: list[int] = sizes.tolist()
        by_placeholder = np.argsort(keys % num_placeholders, kind="stable")
        bounds = np.searchsorted(
            (keys % num_placeholders)[by_placeholder], np.arange(num_placeholders + 1)
        )
        #: per placeholder, its non-empty pools in ascending client order
        self.pools_of = [by_placeholder[bounds[p] : bounds[p + 1]] for p in range(num_placeholders)]
        #: per placeholder, the ascending clients holding any sample of it
        self.holders = [keys[pools] // num_placeholders for pools in self.pools_of]
        #: per placeholder, the ascending clients with a sample of it left in this pass
        self.available: list[list[int]] = [holders.tolist() for holders in self.holders]
        #: per placeholder, how often :attr:`available` changed (selection caches read it)
        self.changes = [0] * num_placeholders

    def remaining_of(self, client: int, placeholder: int) -> int:
        """Samples of ``placeholder`` left in ``client``'s pool in this pass."""
        pool = self.pool_of.get(client * self.num_placeholders + placeholder)
        return 0 if pool is None else self.left[pool]

    @property
    def remaining(self) -> np.ndarray:
        """``(clients, placeholders)`` samples left in every pool (built on demand)."""
        matrix = np.zeros((self.num_clients, self.num_placeholders), dtype=np.int64)
        for key, pool in self.pool_of.items():
            matrix[divmod(key, self.num_placeholders)] = self.left[pool]
        return matrix

    def take(self, client: int, placeholder: int) -> int:
        """Draw the next sample of ``placeholder`` from ``client``'s pool."""
        pool = self.pool_of.get(client * self.num_placeholders + placeholder)
        left = 0 if pool is None else self.left[pool]
        if pool is None or left == 0:
            raise IndexError(f"client {client} has no sample of placeholder {placeholder} left")
        self.left[pool] = left - 1
        if self.passes[placeholder] > 0:
            self.reused += 1
        if left == 1:
            available = self.available[placeholder]
            del available[bisect_left(available, client)]
            self.changes[placeholder] += 1
        return int(self.samples[self.ends[pool] - left])

    def refill(self, placeholder: int) -> bool:
        """Start a new pass over ``placeholder``'s samples once all of them are used.

        Returns whether the pools now hold samples of it: ``False`` when refilling is
        off, when some pool still has samples, or when no client holds the placeholder.
        """
        pools = self.pools_of[placeholder]
        if not self.allow_refill or self.available[placeholder] or len(pools) == 0:
            return False
        for pool in pools.tolist():
            size, end = self.sizes[pool], self.ends[pool]
            if size >= 2:  # smaller pools draw nothing (see __init__)
                self.rng.shuffle(self.samples[end - size : end])
            self.left[pool] = size
        self.available[placeholder] = self.holders[placeholder].tolist()
        self.changes[placeholder] += 1
        self.passes[placeholder] += 1
        return True
