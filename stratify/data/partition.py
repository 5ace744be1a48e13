"""Client partitions of a training set, with NIID-Bench semantics (Li et al., 2022), seeded.

A partition maps each client to the indices of the training samples it holds. Specs:

``iid``
    Shuffle, then split into equal parts (``np.array_split``: sizes differ by at most 1).
``classes:k``
    NIID-Bench's #C=k. Client ``i`` holds label ``i mod K`` (``K`` distinct labels, in
    sorted order) plus ``k - 1`` other distinct labels drawn at random. Each label's
    samples are shuffled and split equally among the clients holding it.
``dirichlet:alpha``
    NIID-Bench's Dirichlet split. Per label, ``p ~ Dir(alpha * 1_n)`` over the ``n``
    clients; clients that already hold at least ``N / n`` samples get ``p = 0``; ``p`` is
    renormalised and the label's shuffled samples are cut at the cumulative proportions.
    The whole draw is repeated while the smallest client holds fewer than ``min_size``
    samples, at most ``MAX_DIRICHLET_TRIES`` times.
``shards:s``
    McMahan et al. (2017): sort the samples by label, cut them into ``n * s`` shards of
    (almost) equal size and give each client ``s`` shards at random.
``domains:d``
    #D=d: like ``classes:d`` but over the per-sample domain ids of multi-domain data.
``domain-dirichlet:alpha``
    The ``dirichlet`` split over domain ids instead of labels (feature skew; the
    Stratify paper's PACS / Digits-DG "Dirichlet(0.5)" rows).
``concentrated:d``
    Domain ``d`` entirely on client 0; every other sample shuffled and split equally
    among clients ``1..n-1`` (the paper's ablation with one domain concentrated on a
    single client).
``gsc:k``
    FedDiverse's federations with a global spurious correlation (SpawriousGSC,
    CMNISTGSC), over the (label, attribute) groups of data whose domain ids are
    attributes: ``k`` clients dominated by class imbalance, ``k`` by attribute imbalance
    and the other ``n − 2k`` by spurious correlation, all of one size
    (:func:`gsc_shares`, :func:`gsc_counts`). Samples beyond what that size needs are
    **dropped** (:func:`unassigned` lists them).

The partition functions are pure: the same labels, spec and seed give the same indices.
"""

from __future__ import annotations

import math

import numpy as np

from stratify.errors import PartitionError

PARTITIONS: tuple[str, ...] = (
    "iid",
    "classes",
    "dirichlet",
    "shards",
    "domains",
    "domain-dirichlet",
    "concentrated",
    "gsc",
)
USAGE = (
    "use iid, classes:K, dirichlet:ALPHA, shards:S, domains:D, domain-dirichlet:ALPHA, "
    "concentrated:DOMAIN or gsc:K"
)
DOMAIN_KINDS = ("domains", "domain-dirichlet", "concentrated", "gsc")
MAX_DIRICHLET_TRIES = 1000
DEFAULT_MIN_SIZE = 10

_EXAMPLES = {
    "classes": "classes:2",
    "dirichlet": "dirichlet:0.5",
    "shards": "shards:2",
    "domains": "domains:1",
    "domain-dirichlet": "domain-dirichlet:0.5",
    "concentrated": "concentrated:0",
    "gsc": "gsc:4",
}

#: ``gsc:k``: the share of a class-imbalanced client's samples in its dominant label, and
#: of an attribute-imbalanced client's in its dominant attribute
GSC_DOMINANCE = 0.9
#: ``gsc:k``: the share of a spuriously correlated client's samples in the groups whose
#: attribute is their label's usual one
GSC_ALIGNMENT = 0.95


def parse_partition_spec(spec: str) -> tuple[str, int | float | None]:
    """Split a partition spec into its kind and value.

    Parameters
    ----------
    spec : str
        ``"iid"``, ``"classes:K"``, ``"dirichlet:ALPHA"``, ``"shards:S"`` or ``"domains:D"``
        (case and surrounding spaces are ignored).

    Returns
    -------
    tuple
        ``(kind, value)``: ``("iid", None)``, an ``int >= 1`` for classes/shards/domains,
        a finite ``float > 0`` for dirichlet and domain-dirichlet, a domain id ``>= 0``
        for concentrated.

    Raises
    ------
    PartitionError
        Unknown kind or malformed value.
    """
    if not isinstance(spec, str):
        raise PartitionError(f"partition spec must be text, got {spec!r}; {USAGE}")
    kind, separator, value_text = spec.strip().lower().partition(":")
    kind, value_text = kind.strip(), value_text.strip()
    if kind not in PARTITIONS:
        raise PartitionError(f"unknown partition {spec!r}; {USAGE}")
    if kind == "iid":
        if separator:
            raise PartitionError(f"partition 'iid' takes no value, got {spec!r}; use iid")
        return "iid", None
    example = _EXAMPLES[kind]
    if not value_text:
        raise PartitionError(f"partition {spec!r} needs a value; use e.g. {example}")
    if kind in ("dirichlet", "domain-dirichlet"):
        try:
            alpha = float(value_text)
        except ValueError:
            alpha = math.nan
        if not math.isfinite(alpha) or alpha <= 0:
            raise PartitionError(
                f"partition {spec!r}: dirichlet needs a positive concentration alpha, "
                f"got {value_text!r}; use e.g. {example}"
            )
        return kind, alpha
    try:
        count = int(value_text)
    except ValueError:
        count = -1
    if kind in ("concentrated", "gsc"):
        if count < 0:
            if kind == "gsc":
                raise PartitionError(
                    f"partition {spec!r}: gsc needs a whole number of clients k >= 0, got "
                    f"{value_text!r}; use e.g. {example}"
                )
            raise PartitionError(
                f"partition {spec!r}: concentrated needs a domain id (0, 1, ...), got "
                f"{value_text!r}; use e.g. {example}"
            )
        return kind, count
    if count < 1:
        raise PartitionError(
            f"partition {spec!r}: {kind} needs a whole number of at least 1, got {value_text!r}; "
            f"use e.g. {example}"
        )
    return kind, count


def partition(
    labels: np.ndarray,
    num_clients: int,
    spec: str,
    seed: int = 0,
    domains: np.ndarray | None = None,
    min_size: int | None = None,
) -> list[np.ndarray]:
    """Split sample indices ``0..N-1`` among ``num_clients`` clients.

    Parameters
    ----------
    labels : numpy.ndarray
        ``(N,)`` integer class labels of the training samples.
    num_clients : int
        Number of clients, ``1 <= num_clients <= N``.
    spec : str
        Partition spec, see :func:`parse_partition_spec` and the module docstring.
    seed : int
        Seed of the partition's random generator.
    domains : numpy.ndarray, optional
        ``(N,)`` integer domain ids; required by ``domains:d``, ``domain-dirichlet:alpha``
        and ``concentrated:d``.
    min_size : int, optional
        ``dirichlet`` and ``domain-dirichlet``: the smallest client must hold at least
        this many samples.
        Default ``min(10, N // (2 * num_clients))``, NIID-Bench's 10 lowered for small data.

    Returns
    -------
    list of numpy.ndarray
        One sorted int64 index array per client. Clients are disjoint. Their union is every
        index, except for ``classes:k`` / ``domains:d`` with fewer clients than labels
        (domains), where a label (domain) that no client drew is held by nobody: its
        samples are **dropped**, as in NIID-Bench. Use
        :func:`unassigned` to list them. A client can be empty when a label it holds has
        fewer samples than holders.

    Raises
    ------
    PartitionError
        Malformed spec, ``num_clients < 1`` or ``> N``, ``k`` larger than the number of
        labels (domains), ``domains:d`` without domains, too many shards, or no Dirichlet
        draw meeting ``min_size`` within ``MAX_DIRICHLET_TRIES`` tries.
    """
    kind, value = parse_partition_spec(spec)
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise PartitionError(f"labels must be a 1-D array, got shape {labels.shape}")
    num_samples = len(labels)
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)):
        raise PartitionError(f"number of clients must be a whole number, got {num_clients!r}")
    if num_clients < 1:
        raise PartitionError(f"number of clients must be at least 1, got {num_clients}")
    if num_clients > num_samples:
        raise PartitionError(
            f"{num_clients} clients but only {num_samples} samples; use at most {num_samples} "
            "clients"
        )
    rng = np.random.default_rng(seed)
    if kind == "iid":
        parts = np.array_split(rng.permutation(num_samples), num_clients)
    elif value is None:  # parse_partition_spec gives every kind but iid a parameter
        raise AssertionError(f"partition kind {kind!r} parsed without a parameter")
    elif kind == "classes":
        parts = _by_group(labels, num_clients, int(value), rng, noun="labels", kind=kind)
    elif kind in DOMAIN_KINDS:
        if domains is None:
            raise PartitionError(
                f"{spec.strip()} needs per-sample domains and this dataset has none; use a "
                "multi-domain dataset (pacs, digits-dg, rotated-mnist, colored-mnist)"
            )
        domains = np.asarray(domains)
        if domains.shape != labels.shape:
            raise PartitionError(
                f"domains has shape {domains.shape} but labels has {labels.shape}; give one "
                "domain id per training sample"
            )
        if kind == "domains":
            parts = _by_group(domains, num_clients, int(value), rng, noun="domains", kind=kind)
        elif kind == "gsc":
            parts = _gsc(labels, domains, num_clients, int(value), rng)
        elif kind == "domain-dirichlet":
            parts = _dirichlet(
                domains,
                num_clients,
                float(value),
                rng,
                _min_size(min_size, num_samples, num_clients),
            )
        else:
            parts = _concentrated(domains, num_clients, int(value), rng)
    elif kind == "dirichlet":
        parts = _dirichlet(
            labels, num_clients, float(value), rng, _min_size(min_size, num_samples, num_clients)
        )
    else:
        parts = _shards(labels, num_clients, int(value), rng)
    return [np.sort(np.asarray(part, dtype=np.int64)) for part in parts]


def unassigned(num_samples: int, client_indices: list[np.ndarray]) -> np.ndarray:
    """Sorted indices in ``0..num_samples-1`` that no client holds (the dropped samples).

    Parameters
    ----------
    num_samples : int
        Size of the partitioned set.
    client_indices : list of numpy.ndarray
        A partition, as returned by :func:`partition`.
    """
    held = np.zeros(num_samples, dtype=bool)
    for indices in client_indices:
        held[indices] = True
    return np.flatnonzero(~held).astype(np.int64)


def _members(values: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Distinct values (sorted) and, for each, the ascending indices of the samples having it."""
    distinct, inverse = np.unique(values, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(distinct) + 1))
    return distinct, [order[bounds[g] : bounds[g + 1]] for g in range(len(distinct))]


def _by_group(
    groups: np.ndarray,
    num_clients: int,
    per_client: int,
    rng: np.random.Generator,
    noun: str,
    kind: str,
) -> list[np.ndarray]:
    """NIID-Bench #C=k over ``groups`` (labels or domain ids)."""
    distinct, members = _members(groups)
    num_groups = len(distinct)
    if per_client > num_groups:
        raise PartitionError(
            f"{kind}:{per_client} asks for {per_client} {noun} per client but the data has only "
            f"{num_groups}; use {kind}:K with K <= {num_groups}"
        )
    # First every client draws its groups, then each group is split among its holders
    # (NIID-Bench's order, so the draws do not depend on the group sizes).
    holders: list[list[int]] = [[] for _ in range(num_groups)]
    for client in range(num_clients):
        first = client % num_groups
        others = rng.choice(
            np.delete(np.arange(num_groups), first), size=per_client - 1, replace=False
        )
        for group in (first, *others.tolist()):
            holders[group].append(client)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for group, group_members in enumerate(members):
        if not holders[group]:
            continue  # held by no client: dropped, as in NIID-Bench (see `partition`)
        shuffled = rng.permutation(group_members)
        for client, chunk in zip(holders[group], np.array_split(shuffled, len(holders[group]))):
            parts[client].append(chunk)
    return [np.concatenate(part) if part else np.empty(0, dtype=np.int64) for part in parts]


def _dirichlet(
    labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator, min_size: int
) -> list[np.ndarray]:
    """NIID-Bench's Dirichlet split over ``labels`` (or domain ids) with a minimum client size."""
    num_samples = len(labels)
    if min_size * num_clients > num_samples:
        raise PartitionError(
            f"a minimum of {min_size} samples for each of {num_clients} clients needs "
            f"{min_size * num_clients} samples but there are {num_samples}; use fewer clients "
            "or a smaller minimum size"
        )
    _, members = _members(labels)
    target = num_samples / num_clients
    concentration = np.full(num_clients, alpha)
    for _ in range(MAX_DIRICHLET_TRIES):
        sizes = np.zeros(num_clients, dtype=np.int64)
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for label_members in members:
            shuffled = rng.permutation(label_members)
            proportions = rng.dirichlet(concentration)
            # clients already at their fair share N/n take no more (keeps sizes bounded)
            proportions = np.where(sizes < target, proportions, 0.0)
            total = proportions.sum()
            if not np.isfinite(total) or total <= 0:
                break  # all mass on full clients (possible for tiny alpha): redraw everything
            cuts = (np.cumsum(proportions / total) * len(shuffled)).astype(np.int64)[:-1]
            for client, chunk in enumerate(np.split(shuffled, cuts)):
                parts[client].append(chunk)
                sizes[client] += len(chunk)
        else:
            if sizes.min() >= min_size:
                return [np.concatenate(part) for part in parts]
    raise PartitionError(
        f"could not draw a Dirichlet partition with at least {min_size} samples per client after "
        f"{MAX_DIRICHLET_TRIES} tries; use fewer clients or a larger alpha"
    )


def _min_size(min_size: int | None, num_samples: int, num_clients: int) -> int:
    """The Dirichlet splits' smallest client: NIID-Bench's 10, lowered for small data."""
    if min_size is None:
        return min(DEFAULT_MIN_SIZE, num_samples // (2 * num_clients))
    return int(min_size)


def _concentrated(
    domains: np.ndarray, num_clients: int, domain: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Domain ``domain`` on client 0; the other samples split equally among the rest."""
    present = np.unique(domains)
    if domain not in present:
        raise PartitionError(
            f"concentrated:{domain}: no sample has domain {domain}; the domains are "
            f"{', '.join(map(str, present.tolist()))}"
        )
    if num_clients < 2:
        raise PartitionError(
            f"concentrated:{domain} puts one domain on client 0 and the rest on the others; "
            "use at least 2 clients"
        )
    rest = rng.permutation(np.flatnonzero(domains != domain))
    return [np.flatnonzero(domains == domain), *np.array_split(rest, num_clients - 1)]


def _shards(
    labels: np.ndarray, num_clients: int, per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """McMahan-style shards: label-sorted data cut into ``n * s`` shards, ``s`` per client."""
    num_shards = num_clients * per_client
    if num_shards > len(labels):
        raise PartitionError(
            f"shards:{per_client} with {num_clients} clients needs {num_shards} shards but there "
            f"are only {len(labels)} samples; use fewer shards or clients"
        )
    # shuffle first so that the order within a label (and thus each shard's content) is random
    shuffled = rng.permutation(len(labels))
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shards = np.array_split(by_label, num_shards)
    assignment = rng.permutation(num_shards).reshape(num_clients, per_client)
    return [np.concatenate([shards[s] for s in row]) for row in assignment]


def gsc_shares(
    labels: np.ndarray, attributes: np.ndarray, num_clients: int, imbalanced: int
) -> tuple[list[tuple[int, int]], np.ndarray]:
    """The share of each client's samples in each (label, attribute) group of ``gsc:k``.

    Clients ``0..k−1`` are dominated by class imbalance: :data:`GSC_DOMINANCE` of their
    samples in one label (client ``i``: the ``i mod L``-th), the rest spread equally over
    the other labels, each label's share split equally over the attributes (no attribute
    imbalance, no correlation). Clients ``k..2k−1`` are dominated by attribute imbalance,
    the same with attributes and labels swapped. The others are dominated by spurious
    correlation: :data:`GSC_ALIGNMENT` of their samples in the groups whose attribute is
    their label's usual one (its most frequent in the data, the global correlation), split
    equally over the labels, the rest equally over the other groups.

    Parameters
    ----------
    labels, attributes : numpy.ndarray
        ``(N,)`` label and attribute ids of the samples.
    num_clients : int
        Clients ``n``, at least ``2k``.
    imbalanced : int
        ``k``.

    Returns
    -------
    tuple
        The groups ``(label, attribute)`` in sorted order, and an ``(n, G)`` array of
        shares, each row summing to 1.

    Raises
    ------
    PartitionError
        Fewer than two labels or attributes, or ``2k > n``.
    """
    label_ids, attribute_ids = np.unique(labels), np.unique(attributes)
    if len(label_ids) < 2 or len(attribute_ids) < 2:
        raise PartitionError(
            f"gsc:{imbalanced} needs at least 2 labels and 2 attributes, the data has "
            f"{len(label_ids)} and {len(attribute_ids)}; use colored-mnist"
        )
    if 2 * imbalanced > num_clients:
        raise PartitionError(
            f"gsc:{imbalanced} makes {imbalanced} class-imbalanced and {imbalanced} "
            f"attribute-imbalanced clients, more than the {num_clients} clients; use k <= "
            f"{num_clients // 2}"
        )
    groups = [(int(y), int(a)) for y in label_ids for a in attribute_ids]
    num_labels, num_attributes = len(label_ids), len(attribute_ids)
    # a label's usual attribute: its most frequent (ties: the lowest id)
    usual = {
        int(y): int(
            attribute_ids[
                np.argmax([np.sum((labels == y) & (attributes == a)) for a in attribute_ids])
            ]
        )
        for y in label_ids
    }
    shares = np.zeros((num_clients, len(groups)))
    for client in range(num_clients):
        for g, (y, a) in enumerate(groups):
            if client < imbalanced:
                dominant = int(label_ids[client % num_labels])
                label_share = (
                    GSC_DOMINANCE if y == dominant else (1 - GSC_DOMINANCE) / (num_labels - 1)
                )
                shares[client, g] = label_share / num_attributes
            elif client < 2 * imbalanced:
                dominant = int(attribute_ids[(client - imbalanced) % num_attributes])
                attribute_share = (
                    GSC_DOMINANCE if a == dominant else (1 - GSC_DOMINANCE) / (num_attributes - 1)
                )
                shares[client, g] = attribute_share / num_labels
            elif a == usual[y]:
                shares[client, g] = GSC_ALIGNMENT / num_labels
            else:
                shares[client, g] = (1 - GSC_ALIGNMENT) / (num_labels * (num_attributes - 1))
    return groups, shares


def gsc_counts(shares: np.ndarray, available: np.ndarray) -> np.ndarray:
    """Per client and group, the samples of ``gsc:k``: every client the same size ``m``,
    the largest whose groups' totals fit the ``available`` samples of each group.

    A client's counts are ``shares · m`` rounded by largest remainder, so they sum to
    ``m`` exactly (ties: the lower group).

    Parameters
    ----------
    shares : numpy.ndarray
        ``(n, G)`` shares, from :func:`gsc_shares`.
    available : numpy.ndarray
        ``(G,)`` samples in each group.

    Raises
    ------
    PartitionError
        When not even one sample per client fits.
    """

    def rounded(size: int) -> np.ndarray:
        exact = shares * size
        counts = np.floor(exact + 1e-9).astype(np.int64)
        for client in range(len(shares)):
            short = size - int(counts[client].sum())
            order = np.argsort(-(exact[client] - counts[client]), kind="stable")
            counts[client, order[:short]] += 1
        return counts

    demand = shares.sum(axis=0)
    # (the epsilon keeps 24 / 0.6 from flooring to 39)
    size = int(min(available[g] / demand[g] for g in range(len(demand)) if demand[g] > 0) + 1e-9)
    while size > 0 and np.any(rounded(size).sum(axis=0) > available):
        size -= 1  # rounding up a share can ask one sample more than a group holds
    if size < 1:
        raise PartitionError(
            f"gsc: the groups' samples ({', '.join(map(str, available.tolist()))}) cannot "
            f"give each of {len(shares)} clients one sample; use fewer clients"
        )
    return rounded(size)


def _gsc(
    labels: np.ndarray,
    attributes: np.ndarray,
    num_clients: int,
    imbalanced: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """``gsc:k``: each group's shuffled samples dealt to the clients in order."""
    groups, shares = gsc_shares(labels, attributes, num_clients, imbalanced)
    members = [np.flatnonzero((labels == y) & (attributes == a)) for y, a in groups]
    counts = gsc_counts(shares, np.array([len(m) for m in members]))
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for g, group_members in enumerate(members):
        cuts = np.cumsum(counts[:, g])
        shuffled = rng.permutation(group_members)
        for client, chunk in enumerate(np.split(shuffled[: cuts[-1]], cuts[:-1])):
            parts[client].append(chunk)
    return [np.concatenate(part) for part in parts]
