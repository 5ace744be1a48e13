"""Privacy against utility (``stratify bench privacy-utility``): each job trained with its
training messages recorded as the server sees them, at no defence and at differential
privacy ε ∈ {8, 3, 1}, then every update attack run on the record
(:func:`stratify.privacy.gradients.attack_run`, docs/privacy.md, "Threat model"); and,
where Flower is installed, what SecAgg+ of batch shares costs a round
(:func:`stratify.flower.secagg_cost.measure`).

The rows go to ``privacy-utility.csv`` and ``secagg-cost.csv``, from which ``stratify
tables`` renders docs/privacy.md's tables.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from stratify.client import LocalTrainer, PrivateTrainer
from stratify.config import TrainConfig

#: δ of every private run
DELTA = 1e-5
#: the per-sample clipping norm C of every private run
CLIP = 1.0
#: the privacy levels measured besides "no defence"
EPSILONS = (8.0, 3.0, 1.0)
#: the candidate learning rates of every job and level, as multiples of the job's own
LR_FACTORS = (0.3, 1.0, 3.0)
#: the share of the training samples held out to choose the learning rate on
VALIDATION = 0.1
#: the columns of ``privacy-utility.csv``, in order
UTILITY_COLUMNS = (
    "job",
    "dataset",
    "mode",
    "model",
    "seed",
    "defence",
    "lr",
    "validation_accuracy",
    "noise_multiplier",
    "epsilon",
    "accuracy",
    "labels",
    "labels_aggregated",
    "labels_counts",
    "inputs",
    "seconds",
)
#: the mnist-10k batch job's learning rate at every privacy level (not tuned per level:
#: the table compares the defence at fixed settings; 1.0 diverges without DP)
BATCH_LR = 0.3
#: written where an attack does not apply to a job (its mode or model)
NOT_APPLICABLE = "–"


@dataclass(frozen=True)
class Job:
    """One run of the table, at every privacy level.

    Parameters
    ----------
    name : str
        Its row label.
    config : TrainConfig
        The run without differential privacy.
    attacks : tuple of str
        The attacks that apply (:data:`stratify.privacy.gradients.ATTACKS`).
    """

    name: str
    config: TrainConfig
    attacks: tuple[str, ...]


def jobs(data_dir: str | None, seed: int = 0) -> list[Job]:
    """The measured jobs: the README's main job (``stratify train --mode single-sample
    --chunk 5`` on digits), the same with the MLP (whose first layer gives one-sample
    inputs back), and, with ``data_dir``, batch mode on ``mnist-10k`` with the MLP (shares,
    their sums, inputs).

    Parameters
    ----------
    data_dir : str, optional
        The folder holding mnist-10k's files; without it the mnist-10k job is left out.
    seed : int
        Every run's ``--seed``.
    """
    main = TrainConfig(seed=seed, options={"chunk": 5})
    selected = [
        Job("main job", main, ("labels",)),
        Job("main job, MLP", replace(main, model="mlp"), ("labels", "inputs")),
    ]
    if data_dir is not None:
        batch = TrainConfig(
            dataset="mnist-10k",
            data_dir=data_dir,
            mode="batch",
            model="mlp",
            lr=BATCH_LR,
            seed=seed,
            options={"batch_labels": 1024},
        )
        selected.append(
            Job(
                "mnist-10k, batch",
                batch,
                ("labels", "labels-aggregated", "labels-counts", "inputs"),
            )
        )
    return selected


def private_config(config: TrainConfig, epsilon: float | None) -> TrainConfig:
    """``config`` at ``epsilon`` (δ = :data:`DELTA`, C = :data:`CLIP`), or as it is."""
    if epsilon is None:
        return config
    return replace(config, dp_epsilon=epsilon, dp_delta=DELTA, dp_clip=CLIP)


def trainer_for(epsilon: float | None) -> Callable[[torch.Tensor, torch.Tensor], LocalTrainer]:
    """The client trainer a recorded run wraps: plain SGD, or a private one (its σ is
    calibrated by ``build_experiment`` for the run's uses; its noise from OS entropy)."""
    if epsilon is None:
        return LocalTrainer
    return lambda x, y: PrivateTrainer(x, y, clip=CLIP, noise_multiplier=0.0)


def figure(value: float | None, digits: int) -> str:
    """``value`` rounded, or :data:`NOT_APPLICABLE` (``None``, NaN)."""
    if value is None or math.isnan(value):
        return NOT_APPLICABLE
    return f"{value:.{digits}f}"


def validation_accuracy(config: TrainConfig) -> float:
    """The final validation accuracy of ``config``'s run trained with
    :data:`VALIDATION` of its training samples held out (never the test set)."""
    from stratify.experiment import build_experiment

    experiment = build_experiment(replace(config, validation=VALIDATION))
    for epoch in range(1, config.epochs + 1):
        experiment.engine.run_epoch(epoch)
    metrics = experiment.engine.validation_metrics()
    assert metrics is not None
    return metrics.accuracy


def validated_lr(config: TrainConfig, factors: Sequence[float] = LR_FACTORS) -> tuple[float, float]:
    """The learning rate among ``factors`` times ``config``'s own whose run ends with the
    best validation accuracy (the first on a tie), and that accuracy.

    Parameters
    ----------
    config : TrainConfig
        The run (with its privacy settings: each level chooses its own rate).
    factors : sequence of float
        The candidates, as multiples of :func:`~stratify.config.resolve_lr`'s rate.
    """
    from stratify.config import resolve_lr

    base = resolve_lr(config)
    scored = [
        (validation_accuracy(replace(config, lr=base * factor)), -index, base * factor)
        for index, factor in enumerate(factors)
    ]
    accuracy, _, lr = max(scored)
    return lr, accuracy


def measure(
    job: Job, epsilon: float | None, lr: float | None = None, chosen_on: float | None = None
) -> dict[str, str]:
    """Train ``job`` at ``epsilon`` (``None``: no defence), recorded, and attack it.

    Parameters
    ----------
    job : Job
        The run.
    epsilon : float, optional
        The target ε at δ = :data:`DELTA`.
    lr : float, optional
        Its learning rate (default: the job's own).
    chosen_on : float, optional
        The validation accuracy ``lr`` was chosen with, for the row.
    """
    from stratify.privacy.gradients import attack_run

    config = private_config(job.config, epsilon)
    if lr is not None:
        config = replace(config, lr=lr)
    started = time.perf_counter()
    results = attack_run(config, job.attacks, trainer=trainer_for(epsilon))
    seconds = time.perf_counter() - started
    return {
        "job": job.name,
        "dataset": config.dataset,
        "mode": config.mode,
        "model": config.model or "cnn",
        "seed": str(config.seed),
        "defence": "none" if epsilon is None else f"DP ε={epsilon:g}",
        "lr": f"{config.lr:g}" if config.lr is not None else NOT_APPLICABLE,
        "validation_accuracy": figure(chosen_on, 4),
        "noise_multiplier": figure(results.get("noise-multiplier"), 2),
        "epsilon": figure(results.get("epsilon"), 2),
        "accuracy": figure(results["accuracy"], 4),
        "labels": figure(results.get("labels"), 2),
        "labels_aggregated": figure(results.get("labels-aggregated"), 2),
        "labels_counts": figure(results.get("labels-counts"), 2),
        "inputs": figure(results.get("inputs"), 3),
        "seconds": f"{seconds:.0f}",
    }


def bench_privacy_utility(
    data_dir: str | None,
    *,
    epsilons: Sequence[float] = EPSILONS,
    seeds: Sequence[int] = (0, 1, 2),
    on_row: Callable[[dict[str, str]], None] | None = None,
) -> list[dict[str, str]]:
    """Every job of :func:`jobs` at no defence and at each of ``epsilons``, each level at
    the learning rate its validation split chose (:func:`validated_lr`, on the first
    seed), then recorded and attacked on every seed.

    Parameters
    ----------
    data_dir : str, optional
        mnist-10k's folder (without it, the digits jobs only).
    epsilons : sequence of float
        The privacy levels besides none.
    seeds : sequence of int
        The seeds of the recorded runs; the first also chooses the learning rates.
    on_row : callable, optional
        Called with each row as it is measured.
    """
    rows = []
    for job in jobs(data_dir, seeds[0]):
        for epsilon in (None, *epsilons):
            lr, chosen_on = validated_lr(private_config(job.config, epsilon))
            for seed in seeds:
                seeded = replace(job, config=replace(job.config, seed=seed))
                row = measure(seeded, epsilon, lr, chosen_on)
                rows.append(row)
                if on_row is not None:
                    on_row(row)
    return rows


def secagg_rows(repeat: int = 2) -> list[dict[str, str]]:
    """What SecAgg+ of batch shares costs on a Flower simulation
    (:func:`stratify.flower.secagg_cost.measure`), one row a run."""
    from stratify.flower.secagg_cost import measure as measure_secagg

    rows = []
    runs: dict[bool, int] = {}
    for result in measure_secagg(repeat):
        on = bool(result["secagg"])
        runs[on] = runs.get(on, 0) + 1
        rows.append(
            {
                "secagg": "on" if on else "off",
                "repeat": str(runs[on]),
                "seconds_per_epoch": f"{result['epoch_s']:.1f}",
                "seconds_per_batch": f"{result['batch_s']:.2f}",
                "batches": str(result["batches"]),
                "messages": str(result["messages"]),
                "mb_received": f"{result['received_bytes'] / 1e6:.1f}",
                "mb_sent": f"{result['sent_bytes'] / 1e6:.1f}",
                "accuracy": f"{result['accuracy']:.4f}",
            }
        )
    return rows


def as_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """``rows`` as CSV text with a header row."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
