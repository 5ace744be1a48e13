"""Model transfers per epoch for chunk sizes CS, from planning alone (:func:`bench_transfers`,
``stratify bench transfers``): no model is trained."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stratify.config import TrainConfig
from stratify.data.datasets import load_dataset
from stratify.experiment import build_experiment
from stratify.stratify import Stratify
from stratify.validation import check_seeds


@dataclass
class TransfersResult:
    """What :func:`bench_transfers` counted: per chunk size, the mean holders (arrivals)
    and transfers per epoch over the seeds, each seed's transfers, and the reduction
    against the first chunk size."""

    dataset: str
    spec: str
    clients: int
    selection: str
    hops: str
    seeds: tuple[int, ...]
    rows: list[dict[str, Any]]

    def to_json(self) -> list[dict[str, Any]]:
        """The rows as ``bench transfers --json`` writes them."""
        return self.rows


def bench_transfers(
    dataset: str,
    chunk_sizes: list[int],
    *,
    data_dir: str | None = None,
    spec: str = "dirichlet:0.5",
    clients: int = 10,
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4),
    selection: str = "uniform",
    hops: str = "server",
) -> TransfersResult:
    """Model transfers per epoch of Stratify for every chunk size, averaged over the epoch
    schedules of ``seeds`` (planning only).

    Parameters
    ----------
    dataset, data_dir, spec, clients : str, str or None, str, int
        The data and its split, as ``stratify train`` takes them.
    chunk_sizes : list of int
        Chunk sizes CS, the first being the one the others are compared with.
    seeds : tuple of int
        Seeds of the epoch schedules averaged.
    selection, hops : str
        Stratify's client selection and how a model goes from holder to holder.
    """
    seeds = check_seeds(seeds)
    data = load_dataset(dataset, data_dir=data_dir, device="cpu")
    rows: list[dict[str, Any]] = []
    for chunk in chunk_sizes:
        config = TrainConfig(
            dataset=data.name,
            partition=spec,
            clients=clients,
            model="mlp",  # planning only: the cheapest model, never trained
            seed=0,
            secure=False,  # the plain registry: no CKKS set-up cost
            options={"chunk": chunk, "selection": selection},
        )
        engine = build_experiment(config, dataset=data).engine
        stratify = engine.strategy
        assert isinstance(stratify, Stratify)
        arrivals, counts = [], []
        for seed in seeds:
            plan = stratify.plan_epoch(engine.context, np.random.default_rng([seed, 1]))
            arrivals.append(plan.holders)
            counts.append(plan.model_transfers(hops))
        rows.append(
            {
                "chunk": chunk,
                "holders": float(np.mean(arrivals)),
                "transfers": float(np.mean(counts)),
                "runs": counts,
            }
        )
    for row in rows:
        row["reduction"] = 1.0 - row["transfers"] / rows[0]["transfers"]
    return TransfersResult(dataset, spec, clients, selection, hops, tuple(seeds), rows)
