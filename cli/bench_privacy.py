"""`stratify bench-privacy`: the secure registry's cost over classes x clients (paper Table IV).

Each cell builds clients holding random label subsets, registers them with each protocol
asked for (naive, packed and their blinded variants), times unique discovery, mapping
and aggregation separately (all in one process, so client and server work both count;
key generation is reported apart as ``setup_s``), and checks every result against the
plain registry.
"""

from __future__ import annotations

import json
import statistics
import sys

import click
import numpy as np
from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stratify.cli.common import check_output_file, checked, write_output
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


def parse_positive_ints(text: str, flag: str) -> list[int]:
    """``"2,10,100"`` -> ``[2, 10, 100]``; anything else is a one-line :class:`ConfigError`.

    Parameters
    ----------
    text : str
        Comma-separated integers, each at least 1.
    flag : str
        The option's name, for the error message.
    """
    parts = [part.strip() for part in text.split(",") if part.strip()]
    try:
        values = [int(part) for part in parts]
    except ValueError:
        raise ConfigError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ConfigError(f"{flag} takes integers of at least 1, got {text!r}")
    return list(dict.fromkeys(values))  # repeated values would only repeat a cell


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


def console_is_terminal() -> bool:
    return Console().is_terminal


def format_seconds(seconds: float) -> str:
    """Durations as the paper writes them: ``8ms``, ``0.8s``, ``102s``."""
    if seconds < 0.01:
        return f"{seconds * 1e3:.1f}ms"
    if seconds < 1:
        return f"{seconds * 1e3:.0f}ms"
    if seconds < 100:
        return f"{seconds:.1f}s"
    return f"{seconds:.0f}s"


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


def format_speedup(speedup: float | None) -> str:
    if speedup is None:
        return ""
    return f"{speedup:.1f}x" if speedup < 10 else f"{speedup:.0f}x"


def format_ratio(ratio: float | None) -> str:
    return "" if ratio is None else f"{ratio:.2f}x"


def results_table(rows: list[dict]) -> Table:
    table = Table(
        title="Secure registry: seconds per phase (client + server work)", box=box.SIMPLE_HEAD
    )
    for column in (
        "classes",
        "clients",
        "protocol",
        "unique",
        "mapping",
        "aggregation",
        "total",
        "verified",
        "speed-up",
        "vs unblinded",
    ):
        table.add_column(column, justify="left" if column == "protocol" else "right", no_wrap=True)
    for row in rows:
        table.add_row(
            str(row["classes"]),
            str(row["clients"]),
            row["protocol"],
            *(f"{row[key]:.3f}" for key in (*PHASES, "total_s")),
            "yes" if row["verified"] else "[red]NO[/red]",
            format_speedup(row.get("speedup")),
            format_ratio(row.get("blind_cost")),
        )
    return table


def table_iv(rows: list[dict], protocol: str) -> Table:
    """The paper's Table IV layout: classes down, clients across, unique + mapping + aggregation."""
    cells = {(r["classes"], r["clients"]): r for r in rows if r["protocol"] == protocol}
    clients = sorted({key[1] for key in cells})
    table = Table(
        title=f"{protocol} (Table IV layout)",
        box=box.SIMPLE_HEAD,
        caption="unique + mapping + aggregation",
    )
    table.add_column("total class")
    for count in clients:
        table.add_column(f"{count} clients", justify="right")
    for classes in sorted({key[0] for key in cells}):
        table.add_row(
            f"{classes} classes",
            *(
                " + ".join(format_seconds(cells[classes, count][phase]) for phase in PHASES)
                if (classes, count) in cells
                else ""
                for count in clients
            ),
        )
    return table


@click.command("bench-privacy")
@click.option(
    "--classes",
    "classes_text",
    default="2,10,100",
    show_default=True,
    help="Comma-separated numbers of classes.",
)
@click.option(
    "--clients",
    "clients_text",
    default="5,10,20",
    show_default=True,
    help="Comma-separated numbers of clients.",
)
@click.option(
    "--protocol",
    "protocol_text",
    default="all",
    show_default=True,
    help="Comma-separated protocols to time: naive, packed, naive-blind, packed-blind; "
    "both (naive and packed) or all.",
)
@click.option(
    "--repeat",
    type=int,
    default=1,
    show_default=True,
    callback=checked(check_repeats),
    help="Registrations per cell and protocol; phase times are their medians.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    callback=checked(check_seed),
    help="Seed of the clients' label subsets and of the placeholders, in [0, 2**63).",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    callback=checked(check_output_file),
    help="Also write one object per cell and protocol to this file.",
)
def bench_privacy(
    classes_text: str,
    clients_text: str,
    protocol_text: str,
    repeat: int,
    seed: int,
    json_path: str | None,
) -> None:
    """Time the secure registry's protocols over classes x clients, verified against plain."""
    class_counts = parse_positive_ints(classes_text, "--classes")
    client_counts = parse_positive_ints(clients_text, "--clients")
    protocols = parse_protocols(protocol_text)
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
    jobs = [(c, k, p) for c in class_counts for k in client_counts for p in protocols]

    # the results table needs ~110 columns; rich assumes 80 when writing to a pipe or file
    console = Console() if console_is_terminal() else Console(width=120)
    rows = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("bench-privacy", total=len(jobs))
        for classes, clients, name in jobs:
            progress.update(task, description=f"{classes} classes x {clients} clients · {name}")
            rows.append(time_cell(classes, clients, name, repeat, seed))
            progress.advance(task)
    add_ratios(rows)

    if json_path:
        write_output(json_path, json.dumps(rows, indent=2) + "\n")
    console.print(results_table(rows))
    for name in protocols:
        console.print(table_iv(rows, name))

    failed = [f"{r['classes']}x{r['clients']} {r['protocol']}" for r in rows if not r["verified"]]
    if failed:
        raise RegistryError(
            f"Secure registry result differs from the plain registry in: {', '.join(failed)}"
        )
