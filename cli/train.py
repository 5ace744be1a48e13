"""`stratify train`: one federated training run of any algorithm."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stratify.errors import ConfigError
from stratify.run import EpochRecord, Run, TrainConfig

# strategy options: flag -> strategy constructor argument; rejected where they don't apply
STRATEGY_FLAGS = [
    click.option("--chunk", type=int, help="Stratify single-sample chunk size CS [default: 5]."),
    click.option(
        "--batch-labels",
        type=int,
        help="Stratify batch-data labels per global batch B [default: 64].",
    ),
    click.option(
        "--selection",
        type=click.Choice(["uniform", "weighted"]),
        help="Stratify client selection [default: uniform].",
    ),
    click.option(
        "--repeats",
        type=click.Choice(["uniform", "proportional"]),
        help="Stratify label repeats in the SLS [default: uniform].",
    ),
    click.option("--repeat-count", type=int, help="Stratify: override r_l of the uniform SLS."),
    click.option("--cap", type=int, help="Stratify: cap of the proportional SLS [default: N/|L|]."),
    click.option(
        "--batch-path",
        type=click.Choice(["fused", "explicit"]),
        help="Stratify batch-data: one tensor or client by client [default: fused].",
    ),
    click.option("--local-epochs", type=int, help="Baselines: local epochs per round."),
    click.option(
        "--local-batch-size",
        type=int,
        help="Baselines, batch mode: local mini-batch size [default: 64]; single-sample uses 1.",
    ),
    click.option("--client-fraction", type=float, help="Baselines: fraction of clients per round."),
    click.option("--mu", type=float, help="FedProx proximal weight μ."),
    click.option("--server-lr", type=float, help="Server learning rate (SCAFFOLD, FedAvgM)."),
    click.option("--server-momentum", type=float, help="FedAvgM server momentum β."),
    click.option(
        "--bn-buffers",
        type=click.Choice(["average", "local"]),
        help="Averaging baselines: BN running stats [default: average].",
    ),
]


def strategy_flags(function):
    for decorator in reversed(STRATEGY_FLAGS):
        function = decorator(function)
    return function


def default_out(config: TrainConfig) -> str:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return str(Path("runs") / f"{stamp}-{config.algorithm}-{config.dataset}-{config.mode}")


@click.command("train")
@click.option("--dataset", default="digits", show_default=True, help="Dataset name.")
@click.option(
    "--data-dir", type=click.Path(file_okay=False), help="Folder holding the dataset files."
)
@click.option(
    "--partition",
    default="classes:1",
    show_default=True,
    help="iid | classes:k | dirichlet:α | shards:s | domains:d",
)
@click.option("--clients", default=10, show_default=True, type=int)
@click.option(
    "--algorithm", default="stratify", show_default=True, help="See `stratify algorithms`."
)
@click.option(
    "--mode",
    type=click.Choice(["single-sample", "batch"]),
    default="single-sample",
    show_default=True,
)
@click.option("--epochs", default=5, show_default=True, type=int)
@click.option("--lr", type=float, help="Base learning rate [default: 0.05 on digits, else 0.01].")
@click.option(
    "--lr-schedule",
    type=click.Choice(["inverse-epoch", "constant"]),
    default="inverse-epoch",
    show_default=True,
    help="Epoch e uses lr/e, or lr throughout.",
)
@click.option(
    "--momentum",
    default=0.0,
    show_default=True,
    type=float,
    help="SGD momentum of the global optimizer.",
)
@click.option(
    "--model",
    default=None,
    help="cnn | mlp | resnet9 | resnet18 | resnet20 [default: cnn for images, mlp for tabular]",
)
@click.option(
    "--norm",
    default="bn",
    show_default=True,
    help="bn | gn | sumbn | sumbn-client-mean | none (ResNets; cnn and mlp have no norm layers)",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True
)
@click.option(
    "--secure/--no-secure",
    default=True,
    show_default=True,
    help="CKKS placeholder registry, or the plain one.",
)
@click.option(
    "--protocol",
    type=click.Choice(["packed", "naive"]),
    default="packed",
    show_default=True,
    help="CKKS protocol.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="Run folder [default: runs/<time>-<algorithm>-<dataset>-<mode>].",
)
@click.option("--resume", is_flag=True, help="Continue the run in --out from its checkpoint.")
@click.option("--overwrite", is_flag=True, help="Replace a run already in --out.")
@strategy_flags
def train(
    dataset,
    data_dir,
    partition,
    clients,
    algorithm,
    mode,
    epochs,
    lr,
    lr_schedule,
    momentum,
    model,
    norm,
    seed,
    device,
    secure,
    protocol,
    out,
    resume,
    overwrite,
    **strategy_options,
) -> None:
    """Train the global model federatedly and write config, metrics, summary and checkpoint."""
    if mode == "batch" and strategy_options["chunk"] is not None:
        raise ConfigError("--chunk applies to --mode single-sample; use --batch-labels for batch")
    if mode == "single-sample" and strategy_options["batch_labels"] is not None:
        raise ConfigError("--batch-labels applies to --mode batch; use --chunk for single-sample")
    batch_path = strategy_options.pop("batch_path")
    if batch_path is not None:
        strategy_options["fused"] = batch_path == "fused"
    config = TrainConfig(
        dataset=dataset,
        data_dir=data_dir,
        partition=partition,
        clients=clients,
        algorithm=algorithm,
        mode=mode,
        epochs=epochs,
        lr=lr,
        lr_schedule=lr_schedule,
        momentum=momentum,
        model=model,
        norm=norm,
        seed=seed,
        device=device,
        secure=secure,
        protocol=protocol,
        options={key: value for key, value in strategy_options.items() if value is not None},
        out=out,
    )
    if config.out is None:
        config.out = default_out(config)
    console = Console(stderr=True)
    display = TrainingProgress(console, f"{algorithm} on {dataset}", epochs)
    with console.status(f"loading {dataset}, partitioning, registering labels…"):
        run = Run(
            config,
            resume=resume,
            overwrite=overwrite,
            on_epoch=display.epoch_done,
            on_steps=display.samples_done,
        )
    with display.live(run.start_epoch):
        summary = run.train()
    print_results(Console(), run, summary)


class TrainingProgress:
    """Rich progress: an epoch bar with the live accuracy, and a running sample count."""

    def __init__(self, console: Console, title: str, epochs: int) -> None:
        self.title = title
        self.epochs = epochs
        self.samples = 0
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[count]}"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
        )

    def live(self, start_epoch: int) -> Progress:
        self.epoch_task = self.progress.add_task(
            self.title,
            total=self.epochs,
            completed=start_epoch,
            count=f"{start_epoch}/{self.epochs} epochs",
            status="",
        )
        self.sample_task = self.progress.add_task("samples", total=None, count="0", status="")
        return self.progress

    def epoch_done(self, record: EpochRecord) -> None:
        self.progress.update(
            self.epoch_task,
            completed=record.epoch,
            count=f"{record.epoch}/{self.epochs} epochs",
            status=f"acc {record.test_accuracy:.4f} · train loss {record.train_loss:.4f}",
        )

    def samples_done(self, count: int) -> None:
        self.samples += count
        self.progress.update(self.sample_task, advance=count, count=f"{self.samples} trained")


def print_results(console: Console, run: Run, summary: dict) -> None:
    table = Table(title=f"{summary['algorithm']} · {summary['dataset']} · {summary['partition']}")
    for column in (
        "epoch",
        "test acc",
        "test loss",
        "train loss",
        "steps",
        "transfers",
        "skipped",
        "seconds",
    ):
        table.add_column(column, justify="right")
    for record in run.records:
        table.add_row(
            str(record.epoch),
            f"{record.test_accuracy:.4f}",
            f"{record.test_loss:.4f}",
            f"{record.train_loss:.4f}",
            str(record.steps),
            str(record.transfers),
            str(record.skipped),
            f"{record.wall_seconds:.1f}",
        )
    console.print(table)
    console.print(
        f"best accuracy {summary['best_accuracy']:.4f} at epoch {summary['best_epoch']}, "
        f"final {summary['final_accuracy']:.4f}, {summary['total_transfers']} transfers, "
        f"{summary['total_wall_seconds']:.1f} s · run folder: {run.out}"
    )
