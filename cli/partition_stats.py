"""`stratify partition-stats`: per-client label counts and heterogeneity metrics of a partition."""

from __future__ import annotations

import click
import numpy as np

from stratify.errors import DatasetError

METRIC_ROWS = (
    ("class imbalance ΔCI", "ci"),
    ("attribute imbalance ΔAI", "ai"),
    ("spurious correlation ΔSC", "sc"),
)


def parse_option_value(text: str):
    """Read a dataset option value: ``"3"`` -> 3, ``"0.5"`` -> 0.5, ``"true"`` -> True,
    ``"0,15,30"`` -> (0, 15, 30), anything else stays text."""
    if "," in text:
        return tuple(parse_option_value(part.strip()) for part in text.split(",") if part.strip())
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def parse_options(pairs: tuple[str, ...]) -> dict:
    """``("correlation=0.5", ...)`` -> ``{"correlation": 0.5, ...}`` (dataset options)."""
    options = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key.strip():
            raise DatasetError(
                f"dataset option {pair!r} is not KEY=VALUE; use e.g. -o correlation=0.5"
            )
        options[key.strip().replace("-", "_")] = parse_option_value(value.strip())
    return options


def _format(value: float | None) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{value:.4f}"


@click.command("partition-stats")
@click.option(
    "--dataset",
    "dataset_name",
    default="digits",
    show_default=True,
    help="Dataset name (see DESIGN §7), e.g. digits, mnist-10k, colored-mnist.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    default=None,
    envvar="STRATIFY_DATA_DIR",
    help="Folder holding the dataset files (env STRATIFY_DATA_DIR).",
)
@click.option(
    "--partition",
    "spec",
    default="iid",
    show_default=True,
    help="iid, classes:K, dirichlet:ALPHA, shards:S or domains:D.",
)
@click.option("--clients", type=int, default=10, show_default=True, help="Number of clients.")
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the partition (and of derived datasets).",
)
@click.option(
    "--min-size",
    type=int,
    default=None,
    help="dirichlet: smallest allowed client (default min(10, N // (2 clients))).",
)
@click.option(
    "-o",
    "--option",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Dataset option, repeatable, e.g. -o correlation=0.5 -o base=mnist.",
)
def partition_stats(
    dataset_name: str,
    data_dir: str | None,
    spec: str,
    clients: int,
    seed: int,
    min_size: int | None,
    options: tuple[str, ...],
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
        dataset_name, data_dir=data_dir, device="cpu", seed=seed, **parse_options(options)
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
