"""The secure registry's cost over classes x clients, paper Table IV (:func:`bench_privacy`,
``stratify bench privacy``).

Each cell builds clients holding random label subsets, registers them with each protocol
asked for (naive, packed and their blinded variants), times unique discovery, mapping
and aggregation separately (all in one process, so client and server work both count;
key generation is reported apart as ``setup_s``), and checks every result against the
plain registry.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from stratify.errors import ConfigError, RegistryError
from stratify.registry.base import PROTOCOLS
from stratify.registry.ckks import CKKSRegistry, same_result
from stratify.registry.ckks.encoding import CKKSParameters
from stratify.registry.plain import PlainRegistry
from stratify.validation import check_fits_in_memory, check_repeats, check_seed

PHASES = ("unique_s", "mapping_s", "aggregation_s")
#: unique labels one packed CKKS ciphertext can compare: its slots at the ring degree used
MAX_CLASSES = CKKSParameters().slots
#: names ``--protocol`` takes for several protocols at once
PROTOCOL_GROUPS = {"both": ("naive", "packed"), "all": PROTOCOLS}


def parse_protocols(text: str) -> list[str]:
    """``"packed,packed-blind"`` -> those protocols, in :data:`PROTOCOLS` order; ``both``
    is naive and packed, ``all`` the four. Anything else is a one-line :class:`ConfigError`.

    Parameters
    ----------
    text : str
        Comma-separated protocol names or group names.
    """
    chosen: set[str] = set()
    for part in (part.strip() for part in text.split(",")):
        if part in PROTOCOL_GROUPS:
            chosen.update(PROTOCOL_GROUPS[part])
        elif part in PROTOCOLS:
            chosen.add(part)
        else:
            names = ", ".join([*PROTOCOLS, *PROTOCOL_GROUPS])
            raise ConfigError(f"--protocol takes comma-separated names of {names}; got {text!r}")
    return [protocol for protocol in PROTOCOLS if protocol in chosen]


#: bytes a client's label set takes at least: a dictionary of one label
CLIENT_BYTES = sys.getsizeof({0: 1})


def make_clients(classes: int, clients: int, seed: int) -> list[dict[int, int]]:
    """Clients holding random label subsets: each draws a size uniform in ``1..classes``,
    that many distinct labels in random order, and a count in ``1..1000`` per label.

    Parameters
    ----------
    classes : int
        Labels are ``0..classes-1``.
    clients : int
        Number of clients.
    seed : int
        Seed; the same (seed, classes, clients) gives the same clients.
    """
    rng = np.random.default_rng([seed, classes, clients])
    client_labels = []
    for _ in range(clients):
        size = int(rng.integers(1, classes + 1))
        labels = rng.choice(classes, size=size, replace=False)
        counts = rng.integers(1, 1001, size=size)
        client_labels.append({int(label): int(count) for label, count in zip(labels, counts)})
    return client_labels


def time_cell(classes: int, clients: int, protocol: str, repeat: int, seed: int) -> dict:
    """Register one cell ``repeat`` times; medians of each phase and whether all matched plain.

    Parameters
    ----------
    classes, clients : int
        The cell of the grid.
    protocol : str
        One of :data:`~stratify.registry.base.PROTOCOLS`.
    repeat : int
        Registrations timed; the reported phase times are their medians.
    seed : int
        Seed of the clients (the placeholders come from the registry's own secrets).
    """
    client_labels = make_clients(classes, clients, seed)
    registry = CKKSRegistry(seed=seed, protocol=protocol)
    # the plain registry given the clients' same secrets registers what CKKS must
    plain = PlainRegistry(seed=seed, secrets=registry.secrets)
    expected = plain.register(client_labels, num_classes=classes)
    runs, verified = [], True
    for _ in range(repeat):
        result = registry.register(client_labels, num_classes=classes)
        verified = verified and same_result(result, expected)
        runs.append(dict(registry.timings))
    stats = registry.stats
    assert stats is not None  # set by register(), which ran repeat >= 1 times
    row = {"protocol": protocol, "classes": classes, "clients": clients}
    for phase in PHASES:
        row[phase] = statistics.median(run[phase] for run in runs)
    row["total_s"] = statistics.median(sum(run[phase] for phase in PHASES) for run in runs)
    row["verified"] = verified
    row.update(
        setup_s=runs[0]["setup_s"],
        repeat=repeat,
        seed=seed,
        labels=sum(map(len, client_labels)),
        unique_labels=expected.num_placeholders,
        subtractions=stats.subtractions,
        multiplications=stats.multiplications,
        maskings=stats.maskings,
        encryptions=stats.encryptions,
        decryptions=stats.decryptions,
        bytes_to_server=stats.bytes_to_server,
        bytes_to_key_holder=stats.bytes_to_key_holder,
        max_decryption_error=stats.max_decryption_error,
        block_size=stats.block_size,
    )
    return row


def add_ratios(rows: list[dict]) -> None:
    """Packed rows get ``speedup``: the naive total of the same cell and blinding over
    theirs (naive / packed, naive-blind / packed-blind). Blinded rows get ``blind_cost``:
    their total over the unblinded protocol's of the same cell (packed-blind / packed)."""
    totals = {(row["classes"], row["clients"], row["protocol"]): row["total_s"] for row in rows}
    for row in rows:
        cell = (row["classes"], row["clients"])
        protocol = row["protocol"]
        blind = "-blind" if protocol.endswith("-blind") else ""
        naive_total = totals.get((*cell, f"naive{blind}"))
        if protocol.startswith("packed") and naive_total is not None and row["total_s"] > 0:
            row["speedup"] = naive_total / row["total_s"]
        unblinded_total = totals.get((*cell, protocol.removesuffix("-blind")))
        if blind and unblinded_total:
            row["blind_cost"] = row["total_s"] / unblinded_total


@dataclass
class PrivacyResult:
    """What :func:`bench_privacy` measured: one row per cell and protocol (phase seconds,
    whether it matched the plain registry, operation counts, bytes, ratios)."""

    protocols: list[str]
    rows: list[dict[str, Any]]

    @property
    def failed(self) -> list[str]:
        """The cells whose result differs from the plain registry's."""
        return [
            f"{row['classes']}x{row['clients']} {row['protocol']}"
            for row in self.rows
            if not row["verified"]
        ]

    def to_json(self) -> list[dict[str, Any]]:
        """The rows as ``bench privacy --json`` writes them."""
        return self.rows

    def check(self) -> None:
        """Raise :class:`RegistryError` when a cell differs from the plain registry."""
        if self.failed:
            raise RegistryError(
                "Secure registry result differs from the plain registry in: "
                + ", ".join(self.failed)
            )


def bench_privacy(
    class_counts: list[int],
    client_counts: list[int],
    protocols: list[str],
    *,
    repeat: int = 1,
    seed: int = 0,
    on_cell: Callable[[int, int, str], None] | None = None,
) -> PrivacyResult:
    """Time the secure registry's protocols over classes x clients, verified against plain.

    Parameters
    ----------
    class_counts, client_counts : list of int
        The grid's rows and columns.
    protocols : list of str
        Names of :data:`~stratify.registry.base.PROTOCOLS`.
    repeat : int
        Registrations per cell and protocol; phase times are their medians.
    seed : int
        Seed of the clients' label subsets and of the placeholders.
    on_cell : callable or None
        Called with each cell's classes, clients and protocol before it runs (a progress
        bar).
    """
    check_repeats(repeat, "--repeat")
    check_seed(seed, "--seed")
    if max(class_counts) > MAX_CLASSES:
        raise ConfigError(
            f"--classes takes at most {MAX_CLASSES} (the slots of one CKKS ciphertext, the packed "
            f"protocol's limit on unique labels), got {max(class_counts)}"
        )
    check_fits_in_memory(
        max(client_counts) * CLIENT_BYTES,
        f"--clients {max(client_counts):,} (a label set per client)",
        "use fewer clients",
    )
    rows = []
    for classes in class_counts:
        for clients in client_counts:
            for protocol in protocols:
                if on_cell is not None:
                    on_cell(classes, clients, protocol)
                rows.append(time_cell(classes, clients, protocol, repeat, seed))
    add_ratios(rows)
    return PrivacyResult(list(protocols), rows)
