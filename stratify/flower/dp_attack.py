"""The batch-count label attack on what a Flower server app holds under SecAgg+, with and
without DP on the nodes (docs/flower.md, "Differential privacy"): one simulation of
Stratify's batch mode on digits (four Dirichlet(0.5) clients, the MLP, ``--batch-labels
64 --min-share 8``, as :mod:`stratify.flower.secagg_cost`), a run without DP and one per
noise seed at ``ε`` (δ = 1e-5, C = 1); one JSON line a run: the share of placeholders the
attack maps to their real label and the test accuracy.

``python -m stratify.flower.dp_attack [--epsilon 3] [--seeds 5] [--epochs 1]
[--clipping-range 8]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from stratify.config import TrainConfig
from stratify.data.datasets import Dataset, load_dataset
from stratify.experiment import partition_clients
from stratify.flower.secagg_cost import job
from stratify.flower.secure_sum import SecAggSettings
from stratify.flower.server import FlowerRun
from stratify.flower.simulation import simulate
from stratify.nn.models import build_model
from stratify.privacy.aggregate import label_counts_from_bias, mapped_right, match_placeholders
from stratify.state import load_into


def sum_label_attack(run: FlowerRun, dataset: Dataset) -> float:
    """The batch-count label attack (:mod:`stratify.privacy.aggregate`) on the SecAgg+
    sums a recorded run's server app holds: the share of placeholders mapped to their
    real label (the real labels are read here, as the test's referee, not by the attack).

    Parameters
    ----------
    run : FlowerRun
        A run recorded (``record=True``) under SecAgg+, of an MLP on ``dataset``.
    dataset : Dataset
        The run's dataset, loaded as its nodes load it.
    """
    if run.batches is None or run.placeholders is None:
        raise ValueError("the attack reads a recorded run's batches and placeholders")
    federation = partition_clients(dataset, run.config)
    order = torch.as_tensor(np.concatenate(federation.client_indices))
    labels = dataset.y_train[order].numpy()
    placeholders = run.placeholders
    count = int(placeholders.max()) + 1
    truth = np.zeros(count, dtype=np.int64)
    truth[placeholders] = labels
    batch_placeholders, batch_labels = [], []
    model = build_model("mlp", dataset.input_shape, dataset.num_classes)
    for batch in run.batches:
        if "sum" not in batch:
            continue  # withheld: a single participant's batch is not sent
        load_into(model, batch["state"])
        with torch.no_grad():  # the server's estimate of a batch's mean prediction
            mean = F.softmax(model(dataset.x_test), 1).mean(0).numpy()
        samples = batch["samples"]
        batch_placeholders.append(np.bincount(placeholders[samples], minlength=count))
        # the head bias's mean gradient is the sum's last parameter
        batch_labels.append(label_counts_from_bias(batch["sum"][-1], len(samples), mean))
    matched = match_placeholders(np.array(batch_placeholders), np.array(batch_labels))
    return mapped_right(matched, truth)


def configs(epsilon: float, seeds: int, epochs: int) -> list[TrainConfig]:
    """The run without DP, then one per noise seed ``1..seeds`` at ``epsilon``."""
    base = dataclasses.replace(job(), epochs=epochs)
    private = [
        dataclasses.replace(
            base, dp_epsilon=epsilon, dp_delta=1e-5, dp_clip=1.0, dp_seed=seed, options=base.options
        )
        for seed in range(1, seeds + 1)
    ]
    return [base, *private]


def measure(
    epsilon: float = 3.0, seeds: int = 5, epochs: int = 1, clipping_range: float = 8.0
) -> list[dict[str, Any]]:
    """Run :func:`configs` in one simulation under SecAgg+ and attack every run's sums.

    Parameters
    ----------
    epsilon : float
        The DP runs' target ε.
    seeds : int
        DP runs, one per noise seed.
    epochs : int
        Epochs of every run.
    clipping_range : float
        SecAgg+'s clipping range (a noised model's loss may leave the default ±8).
    """
    settings = configs(epsilon, seeds, epochs)
    secagg = SecAggSettings(clipping_range=clipping_range)
    runs = simulate(settings, timeout=300, record=True, secagg=secagg)
    dataset = load_dataset("digits", seed=settings[0].seed)
    rows = []
    for config, run in zip(settings, runs):
        rows.append(
            {
                "epsilon": None if run.privacy is None else run.privacy["epsilon"],
                "noise_multiplier": None
                if run.privacy is None
                else run.privacy["noise_multiplier"],
                "uses": None if run.privacy is None else run.privacy["uses"],
                "dp_seed": config.dp_seed,
                "epochs": epochs,
                "mapped_right": sum_label_attack(run, dataset),
                "accuracy": run.accuracies[-1],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=3.0, help="the DP runs' target ε")
    parser.add_argument("--seeds", type=int, default=5, help="DP runs, one per noise seed")
    parser.add_argument("--epochs", type=int, default=1, help="epochs of every run")
    parser.add_argument("--clipping-range", type=float, default=8.0, help="SecAgg+'s")
    arguments = parser.parse_args(argv)
    rows = measure(arguments.epsilon, arguments.seeds, arguments.epochs, arguments.clipping_range)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
