"""Stratify as a strategy of the router: SLS -> label-aware selection -> plan -> hops."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from stratify.errors import ConfigError
from stratify.federation import SamplePools
from stratify.router import ClientUpdate, Round, Router, Strategy
from stratify.schedule import REPEAT_MODES, label_repeats, stratified_label_schedule
from stratify.selection import ClientSelector, Plan, plan_global_batches, plan_single_sample


class Stratify(Strategy):
    """Stratified Label Schedule with label-aware client selection and fine-grained updates.

    Parameters
    ----------
    chunk : int
        Chunk size CS of single-sample learning: how many consecutive schedule entries
        may stay with one client.
    batch_labels : int
        Labels (samples) B per global batch in batch-data learning.
    selection : {"uniform", "weighted"}
        How a client is chosen among those holding the scheduled label.
    repeats : {"uniform", "proportional"}
        How often each label appears in the schedule (DESIGN §4).
    repeat_count : int, optional
        Overrides the per-label repeats of the uniform schedule.
    cap : int, optional
        Cap of the proportional schedule (default ``N / |L|``).
    fused : bool
        Batch-data only: run a global batch as one tensor (True) or client by client.
    """

    name = "stratify"
    description = "SLS + label-aware client selection + single-sample hops or global batches"

    def __init__(
        self,
        chunk: int = 5,
        batch_labels: int = 64,
        selection: str = "uniform",
        repeats: str = "uniform",
        repeat_count: int | None = None,
        cap: int | None = None,
        fused: bool = True,
    ) -> None:
        if chunk <= 0:
            raise ConfigError(f"--chunk must be a positive integer, got {chunk}")
        if batch_labels <= 0:
            raise ConfigError(f"--batch-labels must be a positive integer, got {batch_labels}")
        if repeats not in REPEAT_MODES:
            raise ConfigError(f"unknown --repeats {repeats!r}; choose {' or '.join(REPEAT_MODES)}")
        self.chunk = chunk
        self.batch_labels = batch_labels
        self.selection = selection
        self.repeats = repeats
        self.repeat_count = repeat_count
        self.cap = cap
        self.fused = fused

    def setup(self, router: Router) -> None:
        federation, registry = router.federation, router.registry
        self.sample_placeholders = federation.sample_placeholders(registry)
        self.selector = ClientSelector(
            federation.placeholder_counts(registry), registry.global_counts, self.selection
        )
        self.label_repeats = label_repeats(
            registry.global_counts,
            int(federation.client_sizes.sum()),
            mode=self.repeats,
            cap=self.cap,
            repeats=self.repeat_count,
        )

    def plan_epoch(self, router: Router, rng: np.random.Generator) -> Plan:
        """The epoch's schedule turned into hops (single-sample) or global batches."""
        schedule = stratified_label_schedule(self.label_repeats, rng)
        pools = SamplePools(
            router.federation, self.sample_placeholders, router.registry.num_placeholders, rng
        )
        if router.mode == "single-sample":
            return plan_single_sample(schedule, pools, self.selector, self.chunk, rng)
        return plan_global_batches(schedule, pools, self.selector, self.batch_labels, rng)

    def configure_rounds(
        self, router: Router, epoch: int, rng: np.random.Generator
    ) -> Iterable[Round]:
        return [Round(index=0, plan=self.plan_epoch(router, rng))]

    def fit(self, router: Router, round_: Round, rng: np.random.Generator) -> list[ClientUpdate]:
        # the global model itself travels from client to client; nothing to aggregate
        router.execute_plan(round_.plan, fused=self.fused)
        return []
