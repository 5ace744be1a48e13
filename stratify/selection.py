"""The label-aware router: each schedule entry goes to a client holding that label.

It turns an epoch's schedule into a precomputed :class:`Plan` (which client trains on
which sample, in what order). Planning loops over the schedule once per epoch in Python;
Stratify then walks the plan's index arrays without any per-step bookkeeping over
clients (docs/architecture.md, "Stratify").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from stratify.errors import ConfigError
from stratify.federation import SamplePools
from stratify.options import MODES

SELECTIONS = ("uniform", "weighted")


@dataclass(frozen=True)
class Plan:
    """One epoch's work: which sample each step uses and which client holds it.

    Parameters
    ----------
    mode : {"single-sample", "batch"}
        Single-sample plans take one optimizer step per entry; batch plans one per global
        batch, delimited by ``batch_starts``.
    samples : numpy.ndarray
        Training-sample index of every executed schedule entry, in order.
    clients : numpy.ndarray
        Client that trains on each entry.
    skipped : int
        Schedule entries dropped because no client had a sample of the label left.
    reused : int
        Entries trained on a sample already used this epoch (a refilled label).
    batch_starts : numpy.ndarray, optional
        Batch plans only (required there): offsets of each global batch into ``samples``
        (``len = batches + 1``).
    """

    mode: str
    samples: np.ndarray
    clients: np.ndarray
    skipped: int
    reused: int = 0
    batch_starts: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"a plan's mode is one of {MODES}, not {self.mode!r}")
        if (self.mode == "batch") != (self.batch_starts is not None):
            raise ValueError("batch plans, and only they, have batch_starts")

    @property
    def steps(self) -> int:
        """Optimizer steps: one per sample, or one per global batch."""
        if self.batch_starts is None:
            return len(self.samples)
        return len(self.batch_starts) - 1

    @property
    def holders(self) -> int:
        """Single-sample: how many times the model arrives at a client along the plan (1
        + the changes of holder; the first arrival of an epoch counts). Batch: the
        participants of every global batch, summed."""
        if len(self.clients) == 0:
            return 0
        if self.batch_starts is None:
            return 1 + int(np.count_nonzero(self.clients[1:] != self.clients[:-1]))
        return sum(
            len(np.unique(self.clients[start:stop]))
            for start, stop in zip(self.batch_starts[:-1], self.batch_starts[1:])
        )

    def model_transfers(self, hops: str = "server") -> int:
        """Model-sized payloads sent for the plan (docs/architecture.md, "Traffic
        counting"): single-sample, :func:`chain_transfers` of its holders by ``hops``;
        batch, one model download per participant of a global batch."""
        if self.batch_starts is not None:
            return self.holders
        return chain_transfers(self.holders, hops)


#: How the model travels between two consecutive holders: through the server (uploaded,
#: then downloaded: two transfers, as the paper's router relays it) or client to client.
HOPS = ("server", "direct")


def chain_transfers(holders: int, hops: str = "server") -> int:
    """Model transfers of a chain of ``holders`` arrivals that starts and ends at the
    server: one download to the first holder, one upload from the last, and between two
    holders an upload and a download via the server (``2 · holders`` in all) or one
    direct send (``holders + 1``). No holder, no transfer."""
    if hops not in HOPS:
        raise ConfigError(f"unknown --hops {hops!r}; choose one of {', '.join(HOPS)}")
    if holders <= 0:
        return 0
    return 2 * holders if hops == "server" else holders + 1


class ClientSelector:
    """Chooses a client for a placeholder among those with a non-empty pool.

    A draw reads only the pools' list of clients that still have a sample of the
    placeholder (:attr:`SamplePools.available`), so its cost does not grow with the
    clients holding nothing of it. The result is the same as drawing over all clients
    with the empty ones masked out: uniform picks ``candidates[rng.integers(n)]`` from
    the ascending candidates; weighted searches ``rng.random()`` times the total in the
    cumulative weights, whose partial sums are the same floats with or without the
    masked zeros in between.

    Parameters
    ----------
    placeholder_counts : numpy.ndarray
        ``(clients, placeholders)`` sample counts ``n_{k,l}`` (weighted mode).
    global_counts : numpy.ndarray
        ``n_l`` from the registry (weighted mode).
    mode : {"uniform", "weighted"}
        ``uniform``: equal probability; ``weighted``: probability ``n_{k,l} / n_l``
        renormalised over the available clients.
    """

    def __init__(
        self, placeholder_counts: np.ndarray, global_counts: np.ndarray, mode: str = "uniform"
    ) -> None:
        if mode not in SELECTIONS:
            raise ConfigError(f"unknown selection {mode!r}; choose one of {', '.join(SELECTIONS)}")
        self.mode = mode
        safe_totals = np.maximum(np.asarray(global_counts, dtype=np.float64), 1.0)
        # one row per placeholder, so a draw gathers its candidates' weights from one row
        self.weights = np.ascontiguousarray((placeholder_counts / safe_totals[None, :]).T)
        # placeholder -> (pools, their change count, candidates, cumulative weights): the
        # cumulative weights change only when a client runs out of a label or it is refilled
        self.cumulative: dict[int, tuple[SamplePools, int, np.ndarray, np.ndarray]] = {}

    def select(self, pools: SamplePools, placeholder: int, rng: np.random.Generator) -> int:
        """A client with a sample of ``placeholder`` left, or -1 if there is none."""
        candidates = pools.available[placeholder]
        if not candidates:
            return -1
        if self.mode == "uniform":
            return candidates[rng.integers(len(candidates))]
        clients, cumulative = self.weighted_candidates(pools, placeholder)
        total = cumulative[-1]
        if total <= 0:
            return -1
        pick = int(np.searchsorted(cumulative, rng.random() * total, side="right"))
        # random() * total may round up to total itself; the last candidate then owns it
        return int(clients[min(pick, len(clients) - 1)])

    def weighted_candidates(
        self, pools: SamplePools, placeholder: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The available clients of ``placeholder`` and their cumulative weights (cached)."""
        cached = self.cumulative.get(placeholder)
        changes = pools.changes[placeholder]
        if cached is not None and cached[0] is pools and cached[1] == changes:
            return cached[2], cached[3]
        clients = np.asarray(pools.available[placeholder], dtype=np.int64)
        cumulative = np.cumsum(self.weights[placeholder][clients])
        self.cumulative[placeholder] = (pools, changes, clients, cumulative)
        return clients, cumulative


def select_or_refill(
    selector: ClientSelector, pools: SamplePools, placeholder: int, rng: np.random.Generator
) -> int:
    """A client for ``placeholder``; when every pool of it is empty, after a refill (if
    the pools allow one). ``-1`` when the entry has to be skipped."""
    client = selector.select(pools, placeholder, rng)
    if client < 0 and pools.refill(placeholder):
        client = selector.select(pools, placeholder, rng)
    return client


def plan_single_sample(
    schedule: np.ndarray,
    pools: SamplePools,
    selector: ClientSelector,
    chunk: int,
    rng: np.random.Generator,
) -> Plan:
    """Single-sample plan with chunk size ``chunk`` (docs/architecture.md, "Stratify").

    The schedule keeps its order and is cut into chunks of ``chunk`` entries. The first
    entry of a chunk selects a client; each later entry stays with the current client
    if it has a sample of that label left, otherwise selects one.

    Parameters
    ----------
    schedule : numpy.ndarray
        The epoch's SLS (placeholders).
    pools : SamplePools
        Fresh pools for the epoch; consumed.
    selector : ClientSelector
        Uniform or weighted selection.
    chunk : int
        Chunk size CS >= 1.
    rng : numpy.random.Generator
        Source of the selection draws.
    """
    if chunk <= 0:
        raise ConfigError(f"--chunk must be a positive integer, got {chunk}")
    samples = np.empty(len(schedule), dtype=np.int64)
    clients = np.empty(len(schedule), dtype=np.int64)
    executed = 0
    current = -1
    for position, placeholder in enumerate(schedule.tolist()):
        starts_chunk = position % chunk == 0
        if starts_chunk or current < 0 or pools.remaining_of(current, placeholder) == 0:
            current = select_or_refill(selector, pools, placeholder, rng)
            if current < 0:
                continue
        samples[executed] = pools.take(current, placeholder)
        clients[executed] = current
        executed += 1
    skipped = len(schedule) - executed
    return Plan("single-sample", samples[:executed], clients[:executed], skipped, pools.reused)


def plan_global_batches(
    schedule: np.ndarray,
    pools: SamplePools,
    selector: ClientSelector,
    batch_labels: int,
    rng: np.random.Generator,
) -> Plan:
    """Batch-data plan: every ``batch_labels`` consecutive entries form one global batch.

    Each entry selects its own client; within a batch the entries are ordered by client
    so that each client's share is one contiguous segment (what the sum-based BatchNorm
    and the explicit per-client path read).

    Parameters
    ----------
    schedule : numpy.ndarray
        The epoch's SLS (placeholders).
    pools : SamplePools
        Fresh pools for the epoch; consumed.
    selector : ClientSelector
        Uniform or weighted selection.
    batch_labels : int
        Entries per global batch, B >= 1.
    rng : numpy.random.Generator
        Source of the selection draws.
    """
    if batch_labels <= 0:
        raise ConfigError(f"--batch-labels must be a positive integer, got {batch_labels}")
    samples: list[np.ndarray] = []
    clients: list[np.ndarray] = []
    batch_starts = [0]
    skipped = 0
    for start in range(0, len(schedule), batch_labels):
        batch_samples, batch_clients = [], []
        for placeholder in schedule[start : start + batch_labels].tolist():
            client = select_or_refill(selector, pools, placeholder, rng)
            if client < 0:
                skipped += 1
                continue
            batch_samples.append(pools.take(client, placeholder))
            batch_clients.append(client)
        if not batch_samples:
            continue
        order = np.argsort(np.asarray(batch_clients), kind="stable")
        samples.append(np.asarray(batch_samples, dtype=np.int64)[order])
        clients.append(np.asarray(batch_clients, dtype=np.int64)[order])
        batch_starts.append(batch_starts[-1] + len(order))
    if not samples:
        empty = np.empty(0, dtype=np.int64)
        return Plan("batch", empty, empty, skipped, pools.reused, np.zeros(1, dtype=np.int64))
    return Plan(
        "batch",
        np.concatenate(samples),
        np.concatenate(clients),
        skipped,
        pools.reused,
        np.asarray(batch_starts),
    )


def check_min_share(min_share: int | None, batch_labels: int) -> None:
    """Refuse a smallest share no global batch can hold.

    Parameters
    ----------
    min_share : int or None
        ``--min-share`` (``None``: no minimum).
    batch_labels : int
        ``--batch-labels``, the entries B of a global batch.

    Raises
    ------
    ConfigError
        One line when ``min_share`` is not positive or exceeds B.
    """
    if min_share is None:
        return
    if min_share < 1:
        raise ConfigError(f"--min-share must be a positive integer, got {min_share}")
    if min_share > batch_labels:
        raise ConfigError(
            f"--min-share {min_share} exceeds --batch-labels {batch_labels}: a client's "
            "share of a global batch could only be formed from held-back samples; give "
            f"--min-share {batch_labels} or less"
        )


def hold_back_small_shares(plan: Plan, min_share: int) -> Plan:
    """A batch plan in which no client's share of a global batch is under ``min_share``.

    A client whose share of a batch (with what it held back before) has fewer than
    ``min_share`` samples holds them back and adds them to its next share; the batch goes
    on with the other shares (so a batch may hold fewer or more than B entries, and a batch
    whose every share is held back is no step). Samples still held back when the epoch ends
    are dropped and counted in :attr:`Plan.skipped`: moving them into an earlier batch would
    change the gradient steps already planned, and the next epoch draws its own schedule
    (docs/flower.md, "Secure aggregation"). Within a batch, shares stay ordered by client.

    Parameters
    ----------
    plan : Plan
        A batch plan (:func:`plan_global_batches`).
    min_share : int
        ``N >= 1``; 1 returns ``plan`` unchanged.
    """
    if plan.mode != "batch" or plan.batch_starts is None or min_share <= 1:
        return plan
    held: dict[int, list[int]] = {}
    samples: list[int] = []
    clients: list[int] = []
    starts = [0]
    bounds = plan.batch_starts.tolist()
    for start, stop in zip(bounds[:-1], bounds[1:]):
        shares: dict[int, list[int]] = {}
        for sample, client in zip(
            plan.samples[start:stop].tolist(), plan.clients[start:stop].tolist()
        ):
            shares.setdefault(client, held.pop(client, [])).append(sample)
        for client in sorted(shares):
            share = shares[client]
            if len(share) < min_share:
                held[client] = share
                continue
            samples += share
            clients += [client] * len(share)
        if len(samples) > starts[-1]:
            starts.append(len(samples))
    dropped = sum(len(share) for share in held.values())
    return Plan(
        "batch",
        np.asarray(samples, dtype=np.int64),
        np.asarray(clients, dtype=np.int64),
        plan.skipped + dropped,
        plan.reused,
        np.asarray(starts, dtype=np.int64),
    )


def merge_trailing_singleton(plan: Plan) -> Plan:
    """A batch plan whose last global batch of one entry joins the batch before it.

    Batch-statistics norms cannot normalise a single sample; the merged batch keeps the
    entry rather than dropping it. Other plans are returned unchanged.
    """
    starts = plan.batch_starts
    if plan.mode != "batch" or starts is None or len(starts) < 3 or starts[-1] - starts[-2] != 1:
        return plan
    return dataclasses.replace(plan, batch_starts=np.delete(starts, -2))
