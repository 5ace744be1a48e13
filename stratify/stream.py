"""Streaming ingestion: samples arrive at the clients in windows and are learned as they come.

Each window is one pass of single-sample Stratify over what arrived: the SLS takes every
arrived sample once (proportional repeats with no cap), so the stream is learned in a
label-balanced order without storing anything past its window.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import nn

from stratify.config import TrainConfig
from stratify.data.datasets import Dataset
from stratify.experiment import build_experiment
from stratify.federation import Federation
from stratify.registry import PlainRegistry
from stratify.registry.base import LabelRegistry
from stratify.router import EpochStats, Router


class StreamLearner:
    """Learns a global model from windows of newly arrived client samples.

    Parameters
    ----------
    model : torch.nn.Module
        The global model (kept across windows), on ``dataset``'s device.
    dataset : Dataset
        Tensors holding every sample that will ever arrive (simulation), and the test set.
    lr : float
        SGD learning rate of the single-sample steps.
    chunk : int
        Chunk size CS.
    selection : {"uniform", "weighted"}
        Client selection.
    seed : int
        Base seed; window ``w`` plans with ``default_rng([seed, w])``.
    registry : LabelRegistry, optional
        Label registry run on every window (default: the plain one).
    """

    def __init__(
        self,
        model: nn.Module,
        dataset: Dataset,
        lr: float = 0.01,
        chunk: int = 5,
        selection: str = "uniform",
        seed: int = 0,
        registry: LabelRegistry | None = None,
    ) -> None:
        self.model = model
        self.dataset = dataset
        self.lr = lr
        self.chunk = chunk
        self.selection = selection
        self.seed = seed
        self.registry = registry if registry is not None else PlainRegistry(seed=seed)
        self.windows_seen = 0
        self.router: Router | None = None

    def ingest(self, arrivals: Sequence[np.ndarray]) -> EpochStats:
        """Learn one window: ``arrivals[k]`` are the sample indices client ``k`` just received.

        Clients that received nothing sit the window out.
        """
        present = [np.asarray(ix, dtype=np.int64) for ix in arrivals if len(ix) > 0]
        self.windows_seen += 1
        if not present:
            return EpochStats()
        federation = Federation(present, self.dataset.train_labels)
        # proportional repeats capped at the window's size: r_l = n_l, every arrival once
        window_size = sum(len(indices) for indices in present)
        config = TrainConfig(
            dataset=self.dataset.name,
            algorithm="stratify",
            mode="single-sample",
            lr=self.lr,
            lr_schedule="constant",
            seed=self.seed,
            secure=False,
            options={
                "chunk": self.chunk,
                "selection": self.selection,
                "repeats": "proportional",
                "cap": window_size,
            },
        )
        self.router = build_experiment(
            config,
            dataset=self.dataset,
            federation=federation,
            registry=self.registry,
            model=self.model,
        ).router
        return self.router.run_epoch(self.windows_seen)

    def evaluate(self) -> tuple[float, float]:
        """Test accuracy and loss of the global model."""
        if self.router is None:
            raise RuntimeError("evaluate() needs at least one ingested window")
        return self.router.evaluate()
