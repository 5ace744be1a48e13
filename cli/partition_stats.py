"""`stratify data stats`: per-client label counts and heterogeneity metrics of a partition
(``partition-stats`` before; the old name still runs, see :mod:`stratify.cli.main`)."""

from __future__ import annotations

import click
import numpy as np

from stratify.cli.common import DATA_DIR, DATASET_OPTION, checked, parse_options
from stratify.validation import check_int, check_positive_int, check_seed

METRIC_ROWS = (
    ("class imbalance ΔCI", "ci"),
    ("attribute imbalance ΔAI", "ai"),
    ("spurious correlation ΔSC", "sc"),
)


def check_min_size(value: object, flag: str) -> int:
    """A smallest client size: 0 (no minimum) or more."""
    return check_int(value, flag, minimum=0)


def _format(value: float | None) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{value:.4f}"


@click.command("stats")
@click.option(
    "--dataset",
    "dataset_name",
    default="digits",
    show_default=True,
    help='Dataset name, e.g. digits, mnist-10k, colored-mnist (docs/usage.md, "Datasets").',
)
@DATA_DIR
@click.option(
    "--partition",
    "spec",
    default="iid",
    show_default=True,
    help="iid, classes:K, dirichlet:ALPHA, shards:S, domains:D, domain-dirichlet:ALPHA or "
    "concentrated:DOMAIN.",
)
@click.option(
    "--clients",
    type=int,
    default=10,
    show_default=True,
    callback=checked(check_positive_int),
    help="Number of clients.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    callback=checked(check_seed),
    help="Seed of the partition (and of derived datasets), in [0, 2**63).",
)
@click.option(
    "--min-size",
    type=int,
    default=None,
    callback=checked(check_min_size),
    help="dirichlet: smallest allowed client (default min(10, N // (2 clients))).",
)
@DATASET_OPTION
def partition_stats(
    dataset_name: str,
    data_dir: str | None,
    spec: str,
    clients: int,
    seed: int,
    min_size: int | None,
    dataset_options: tuple[str, ...],
) -> None:
    """Print per-client label counts and the six FedDiverse heterogeneity metrics.

    The training split of the dataset is partitioned; domains (pacs, digits-dg,
    rotated-mnist angle, colored-mnist colour) serve as the attribute for ΔAI and ΔSC.
    """
    from rich.console import Console
    from rich.table import Table

    from stratify.data.datasets import load_dataset
    from stratify.data.heterogeneity import heterogeneity_metrics
    from stratify.data.partition import parse_partition_spec, partition, unassigned

    parse_partition_spec(spec)  # reject a malformed spec before loading any data
    dataset = load_dataset(
        dataset_name, data_dir=data_dir, device="cpu", seed=seed, **parse_options(dataset_options)
    )
    labels = dataset.train_labels
    domains = dataset.domains_train
    parts = partition(labels, clients, spec, seed=seed, domains=domains, min_size=min_size)
    num_attributes = None
    if domains is not None:
        num_attributes = int(dataset.meta.get("num_domains", int(domains.max()) + 1))
    metrics = heterogeneity_metrics(labels, domains, parts, dataset.num_classes, num_attributes)

    counts = np.stack([np.bincount(labels[p], minlength=dataset.num_classes) for p in parts])
    dropped = unassigned(len(labels), parts)

    # a wide table (many classes) keeps its columns instead of being squeezed when piped
    console = Console(width=max(Console().width, 100, 12 + 7 * (dataset.num_classes + 1)))
    console.print(
        f"[bold]{dataset.name}[/bold]: {len(labels)} training samples, {dataset.num_classes} "
        f"classes; partition [bold]{spec}[/bold], {clients} clients, seed {seed}"
    )
    table = Table(title="samples per client and label", show_footer=True)
    table.add_column("client", footer="all", justify="right")
    for label in range(dataset.num_classes):
        table.add_column(str(label), footer=str(int(counts[:, label].sum())), justify="right")
    table.add_column("total", footer=str(int(counts.sum())), justify="right", style="bold")
    for client, row in enumerate(counts):
        table.add_row(str(client), *(str(int(c)) if c else "·" for c in row), str(int(row.sum())))
    console.print(table)
    if len(dropped):
        held_by_nobody = sorted(set(np.unique(labels[dropped]).tolist()))
        console.print(
            f"{len(dropped)} samples of labels {held_by_nobody} are held by no client (dropped)"
        )
    sizes = counts.sum(axis=1)
    console.print(
        f"client sizes: min {int(sizes.min())}, median {float(np.median(sizes)):g}, "
        f"max {int(sizes.max())}; labels per client: "
        f"min {int((counts > 0).sum(axis=1).min())}, max {int((counts > 0).sum(axis=1).max())}"
    )

    summary = Table(title="heterogeneity (FedDiverse)")
    summary.add_column("metric")
    summary.add_column("global", justify="right")
    summary.add_column("client mean", justify="right")
    for title, key in METRIC_ROWS:
        summary.add_row(title, _format(metrics[f"global_{key}"]), _format(metrics[f"client_{key}"]))
    console.print(summary)
    if domains is None:
        console.print(f"{dataset.name} has no domains/attributes: ΔAI and ΔSC are n/a")
