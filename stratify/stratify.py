"""Stratify as a strategy: SLS -> label-aware selection -> plan -> hops of the model.

The global model itself travels: in single-sample mode from holder to holder, one SGD step
per sample; in batch mode every participant of a global batch adds its summed gradient and
one step is taken per batch. Nothing is averaged, so :meth:`Stratify.aggregate` returns
``None`` (docs/architecture.md, "Stratify").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from stratify.card import Bench, Comparison, Identity, MethodCard, Rates
from stratify.client import LocalJob
from stratify.common_options import CommonOptions
from stratify.compiled import (
    AUTO_COMPILE_AFTER_STEPS,
    COMPILE_MODES,
    STEPS_PER_CALL,
    CompiledCallFailed,
    CompileSwitch,
    StepTerms,
    compiled_steps,
    run_compiled_steps,
)
from stratify.errors import ConfigError
from stratify.federation import SamplePools
from stratify.method import (
    ClientUpdate,
    Context,
    LocalWork,
    Round,
    RoundStats,
    Strategy,
    Vectorizable,
)
from stratify.nn.norm import has_batch_norm
from stratify.options import Probe, StrategyOptions, option, option_of
from stratify.schedule import REPEAT_MODES, label_repeats, stratified_label_schedule
from stratify.selection import (
    HOPS,
    ClientSelector,
    Plan,
    check_min_share,
    hold_back_small_shares,
    merge_trailing_singleton,
    plan_global_batches,
    plan_single_sample,
)
from stratify.validation import check_fits_in_memory, check_positive_int

#: samples between two progress reports of the single-sample loop
PROGRESS_EVERY = 1000
#: bytes an epoch certainly holds per schedule entry, for the up-front memory check: the
#: shuffled schedule, the plan's sample and client arrays (int64) and the schedule as a
#: Python list (measured: 32 B); the single-sample loop also keeps each step's loss
#: tensor until the epoch ends (measured ~800 B per step on digits; 512 is a floor)
PLAN_BYTES_PER_ENTRY = 32
SINGLE_SAMPLE_BYTES_PER_STEP = 512
BATCH_PATHS = ("fused", "explicit")
EXHAUSTED = ("refill", "skip")


@dataclass
class StratifyOptions(StrategyOptions):
    """Options of :class:`Stratify` (defaults: the Stratify paper's single-sample setting)."""

    chunk: int = option_of(CommonOptions, "chunk", probe=Probe(1))
    batch_labels: int = option(
        64,
        "Labels (samples) B per global batch.",
        check=check_positive_int,
        modes=("batch",),
        probe=Probe(8),
    )
    selection: str = option_of(
        CommonOptions, "selection", probe=Probe("weighted", {"partition": "dirichlet:1.0"})
    )
    repeats: str = option(
        "uniform",
        "Label repeats r_l of the SLS: round(N/|L|) each, or min(n_l, cap).",
        choices=REPEAT_MODES,
        probe=Probe("proportional", {"dataset": "unbalanced"}),
    )
    repeat_count: int | None = option(
        None,
        "Override r_l of the uniform SLS [default: round(N/|L|)].",
        check=check_positive_int,
        cli_type=int,
        probe=Probe(3),
    )
    # refused with the default --repeats uniform
    cap: int | None = option(
        None,
        "Cap of the proportional SLS [default: N/|L|].",
        check=check_positive_int,
        cli_type=int,
        probe=Probe(2),
    )
    batch_path: str = option(
        "fused",
        "A global batch as one tensor, or client by client (same gradient).",
        choices=BATCH_PATHS,
        modes=("batch",),
        probe=Probe(
            unobservable="tests/test_stratify.py: a global batch fused or client by client, "
            "the same summed gradient"
        ),
    )
    momentum: float = option_of(CommonOptions, "momentum", probe=Probe(0.5))
    hops: str = option(
        "server",
        "How the model moves between two holders: relayed by the server (an upload and a "
        "download, two transfers) or sent client to client (one).",
        choices=HOPS,
        modes=("single-sample",),
        probe=Probe("direct"),
    )
    exhausted: str = option(
        "refill",
        "A scheduled label whose samples are all used this epoch: start a new pass over "
        "them (refill), or drop the entry (skip).",
        choices=EXHAUSTED,
        probe=Probe("skip", {"options": {"repeat_count": 40}}),
    )
    # the tiny clients hold about 16 samples a batch
    min_share: int | None = option(
        None,
        "Smallest share N of a global batch: a client whose share would be under N samples "
        "holds them back to its next share; what is still under N at the epoch's end is "
        "dropped [default: no minimum].",
        check=check_positive_int,
        cli_type=int,
        modes=("batch",),
        probe=Probe(20),
    )
    compile: str = option(
        "auto",
        "Single-sample steps as a compiled functional step (torch.compile): from the first "
        f"epoch that starts after {AUTO_COMPILE_AFTER_STEPS:,} steps (auto, when the run is "
        "long enough to repay the compile), always (on), or never (off).",
        choices=COMPILE_MODES,
        modes=("single-sample",),
        probe=Probe(
            unobservable="tests/test_compiled.py: the compiled step computes the eager "
            "step's numbers"
        ),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        # refused with the other options, before any data is loaded
        check_min_share(self.min_share, self.batch_labels)


class Stratify(Strategy, Vectorizable):
    """Stratified Label Schedule with label-aware client selection and fine-grained updates.

    Each epoch shuffles the schedule ``S`` (every placeholder ``r_l`` times), gives every
    entry to a client holding a sample of that placeholder (:mod:`stratify.selection`) and
    trains the travelling global model along the resulting plan. Options:
    :class:`StratifyOptions`.
    """

    card = MethodCard(
        Identity(
            "stratify",
            "Stratify",
            "SLS + label-aware client selection + single-sample hops or global batches",
        ),
        Comparison(
            no_comparator="stratify has no base and no local optimizer to match (its global "
            "model travels and takes one step per sample or per global batch)"
        ),
        rates=Rates(
            # chosen by the `defaults` grids (docs/results/defaults-*.csv), each mode at
            # its schedule
            tuned={
                ("digits", "batch"): 0.3,
                ("digits", "single-sample"): 0.03,
                ("mnist", "batch"): 0.1,
                ("mnist", "single-sample"): 0.01,
            },
            # over ten seeds of 30 single-sample epochs (the `stratify-schedule` grid,
            # docs/results.md) the paper's constant rate ends lower on every split and
            # dips below 90% on some seeds; the decay does neither. Batch mode was not
            # measured there, so it keeps the paper's constant rate
            mode_schedules={"single-sample": "inverse-epoch"},
        ),
        bench=Bench(step_size_options=("momentum",)),
        flower=True,
    )
    options_class = StratifyOptions
    options: StratifyOptions
    #: single-sample steps per compiled call (K)
    steps_per_call = STEPS_PER_CALL

    def setup(self, context: Context) -> None:
        super().setup(context)
        federation, placeholders = context.federation, context.placeholders
        self.sample_placeholders = federation.sample_placeholders(placeholders)
        self.selector = ClientSelector(
            federation.placeholder_counts(placeholders),
            placeholders.global_counts,
            self.options.selection,
        )
        self.repeats = label_repeats(
            placeholders.global_counts,
            int(federation.client_sizes.sum()),
            mode=self.options.repeats,
            cap=self.options.cap,
            repeats=self.options.repeat_count,
        )
        self.check_epoch_fits_in_memory(context.mode)
        self.optimizer = torch.optim.SGD(
            context.model.parameters(), lr=context.lr, momentum=self.options.momentum, foreach=True
        )
        #: ``--compile``: whether the next single-sample epoch runs compiled
        self.compile_switch = CompileSwitch(self.options.compile)
        self.batch_norm = has_batch_norm(context.model)
        if self.batch_norm and context.mode == "batch" and self.options.batch_labels < 2:
            raise ConfigError(
                "--batch-labels 1 gives global batches of one sample, which batch-statistics "
                "norms cannot normalise; use --batch-labels 2 or more, or --norm gn"
            )

    def drop_clients(self, context: Context, clients: Iterable[int]) -> None:
        """Leave ``clients`` out of the schedule's pools from the next epoch on (a client
        lost over Flower, docs/flower.md): their samples leave the federation, and the
        selector's counts and the label repeats are those of the others, as a run of
        the others alone would have them; a placeholder no other client holds is then
        skipped in every schedule."""
        federation, placeholders = context.federation, context.placeholders
        for client in clients:
            federation.client_indices[client] = np.zeros(0, dtype=np.int64)
        counts = federation.placeholder_counts(placeholders)
        held = counts.sum(0)
        self.sample_placeholders = federation.sample_placeholders(placeholders)
        self.selector = ClientSelector(counts, held, self.options.selection)
        self.repeats = label_repeats(
            held,
            int(federation.client_sizes.sum()),
            mode=self.options.repeats,
            cap=self.options.cap,
            repeats=self.options.repeat_count,
        )

    def check_epoch_fits_in_memory(self, mode: str) -> None:
        """Refuse label repeats whose epoch could not be held in memory, before any of it
        is allocated."""
        entries = int(self.repeats.sum())
        per_entry = PLAN_BYTES_PER_ENTRY
        if mode == "single-sample":
            per_entry += SINGLE_SAMPLE_BYTES_PER_STEP
        if self.options.repeat_count is not None:
            origin = (
                f"--repeat-count {self.options.repeat_count} for each of {len(self.repeats)} labels"
            )
        else:
            origin = f"--repeats {self.options.repeats}"
        check_fits_in_memory(
            entries * per_entry,
            f"an epoch of {entries:,} schedule entries ({origin})",
            "lower --repeat-count (or --cap)",
        )

    # -- planning -------------------------------------------------------------------------

    def plan_epoch(self, context: Context, rng: np.random.Generator) -> Plan:
        """The epoch's schedule turned into hops (single-sample) or global batches."""
        schedule = stratified_label_schedule(self.repeats, rng)
        pools = SamplePools(
            context.federation,
            self.sample_placeholders,
            context.placeholders.num_placeholders,
            rng,
            refill=self.options.exhausted == "refill",
        )
        if context.mode == "single-sample":
            return plan_single_sample(schedule, pools, self.selector, self.options.chunk, rng)
        plan = plan_global_batches(schedule, pools, self.selector, self.options.batch_labels, rng)
        if self.options.min_share is not None:
            plan = hold_back_small_shares(plan, self.options.min_share)
        return merge_trailing_singleton(plan) if self.batch_norm else plan

    def configure_rounds(
        self, context: Context, epoch: int, rng: np.random.Generator
    ) -> Iterable[Round]:
        plan = self.plan_epoch(context, rng)
        return [Round(payload=plan, stats=RoundStats(skipped=plan.skipped, reused=plan.reused))]

    # -- execution ------------------------------------------------------------------------

    def fit(self, context: Context, round_: Round, rng: np.random.Generator) -> list[ClientUpdate]:
        plan: Plan = round_.payload
        for group in self.optimizer.param_groups:
            group["lr"] = context.lr
        if plan.mode == "single-sample":
            stats = self.execute_single_sample(context, plan.samples)
            stats.transfers = plan.model_transfers(self.options.hops)
        else:
            stats = self.execute_global_batches(context, plan)
            # each participant downloads the model and uploads its summed gradient
            stats.transfers = stats.uploads = plan.model_transfers()
        return [ClientUpdate(client=-1, num_samples=len(plan.samples), stats=stats)]

    def execute_single_sample(self, context: Context, samples: np.ndarray) -> RoundStats:
        """One SGD step per sample, batch of one: the latency-bound hot loop.

        Runs :meth:`execute_compiled` where ``--compile`` asks for it (see
        :meth:`uses_compiled_step`), otherwise :meth:`execute_eager`, the reference.
        """
        if self.uses_compiled_step(context):
            stats = self.execute_compiled(context, samples)
        else:
            stats = self.execute_eager(context, samples)
        self.compile_switch.count(len(samples))
        return stats

    @property
    def steps_made(self) -> int:
        """Single-sample steps made so far in the run (``--compile auto`` reads them)."""
        return self.compile_switch.steps_made

    @steps_made.setter
    def steps_made(self, steps: int) -> None:
        self.compile_switch.steps_made = steps

    def uses_compiled_step(self, context: Context) -> bool:
        """Whether the next single-sample epoch runs compiled: always with ``--compile on``,
        with ``auto`` once the run has made :data:`AUTO_COMPILE_AFTER_STEPS` steps."""
        if not all(parameter.requires_grad for parameter in context.model.parameters()):
            return False  # the compiled step updates every parameter
        if not context.trainer.holds_samples:
            return False  # the compiled step reads the samples; a remote trainer sends them
        return self.compile_switch.active()

    def execute_eager(self, context: Context, samples: np.ndarray) -> RoundStats:
        """The eager single-sample loop (the trainer's
        :meth:`~stratify.client.LocalTrainer.single_sample_steps`), the reference for the
        compiled step, reporting progress every :data:`PROGRESS_EVERY` samples."""
        losses: list[torch.Tensor] = []
        indices = samples.tolist()
        for block_start in range(0, len(indices), PROGRESS_EVERY):
            block = indices[block_start : block_start + PROGRESS_EVERY]
            losses += context.trainer.single_sample_steps(
                context.model, self.optimizer, block, context.lr
            )
            context.progress(len(block))
        stats = RoundStats(
            steps=len(samples), loss_count=len(samples), sample_gradients=len(samples)
        )
        if losses:
            stats.loss_sum = float(torch.stack(losses).sum())
        return stats

    def step_terms(self, mode: str = "single-sample") -> StepTerms | None:
        """Single-sample hops add nothing to the gradient; the step keeps momentum if the
        global optimizer has it. Global batches are not jobs (``None``)."""
        if mode != "single-sample":
            return None
        return StepTerms(momentum=self.options.momentum > 0)

    def local_work(
        self, context: Context, round_: Round, rng: np.random.Generator
    ) -> LocalWork | None:
        """A single-sample epoch as one job: the travelling model, one step per planned
        sample, the optimizer's momentum buffers continued in place."""
        plan: Plan = round_.payload
        if (
            plan.mode != "single-sample"
            or not context.trainer.holds_samples
            or not all(parameter.requires_grad for parameter in context.model.parameters())
        ):
            return None
        momentum = self.options.momentum
        for group in self.optimizer.param_groups:
            group["lr"] = context.lr
        job = LocalJob(
            context.model,
            plan.samples,
            context.lr,
            momentum=momentum,
            velocities=self.momentum_buffers(context.model) if momentum > 0 else None,
        )

        def finish() -> list[ClientUpdate]:
            steps = len(plan.samples)
            self.compile_switch.count(steps)
            stats = job.result()
            round_stats = RoundStats(
                steps=steps,
                loss_count=steps,
                loss_sum=stats.loss_sum,
                transfers=plan.model_transfers(self.options.hops),
                sample_gradients=steps,
            )
            return [ClientUpdate(client=-1, num_samples=steps, stats=round_stats)]

        return LocalWork([job], finish)

    def execute_compiled(self, context: Context, samples: np.ndarray) -> RoundStats:
        """The single-sample loop as compiled calls of :attr:`steps_per_call` steps each
        (:mod:`stratify.compiled`); the last call is padded with masked steps.

        The parameters and the optimizer's momentum buffers are updated in place, so the
        eager loop, the checkpoint and a later eager epoch see the same state. The sample
        indices go to the device once and each call reads its ``K`` from that tensor. If
        a call fails to compile (a missing C compiler, say), ``--compile on`` stops with
        a one-line error and ``auto`` continues eagerly from that sample on.
        """
        model, momentum = context.model, self.options.momentum
        terms = self.step_terms()
        assert terms is not None  # single-sample mode
        steps = compiled_steps(model, self.steps_per_call, terms)
        try:
            losses = run_compiled_steps(
                steps,
                [parameter.detach() for parameter in model.parameters()],
                [buffer.detach() for buffer in model.buffers()],
                context.x_train,
                context.y_train,
                samples,
                context.lr,
                velocities=self.momentum_buffers(model) if momentum > 0 else (),
                momentum=momentum,
                progress=context.progress,
                progress_every=PROGRESS_EVERY,
            )
        except CompiledCallFailed as failure:
            self.compile_switch.give_up(failure.error)
            stats = RoundStats(
                steps=failure.done, loss_count=failure.done, sample_gradients=failure.done
            )
            stats.loss_sum = float(failure.losses.sum())
            stats.add(self.execute_eager(context, samples[failure.done :]))
            return stats
        stats = RoundStats(
            steps=len(samples), loss_count=len(samples), sample_gradients=len(samples)
        )
        stats.loss_sum = float(losses.sum())
        return stats

    def momentum_buffers(self, model: nn.Module) -> list[torch.Tensor]:
        """The optimizer's momentum buffers, created as zeros where it has none yet: one
        step from zero (``m·0 + g``) equals the optimizer's first step, which copies ``g``."""
        buffers = []
        for parameter in model.parameters():
            state = self.optimizer.state[parameter]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(
                    parameter, memory_format=torch.preserve_format
                )
            buffers.append(state["momentum_buffer"].detach())
        return buffers

    def execute_global_batches(self, context: Context, plan: Plan) -> RoundStats:
        """One optimizer step per global batch: the sum of client gradients divided by B."""
        assert plan.batch_starts is not None
        stats = RoundStats()
        starts = plan.batch_starts
        fused = self.options.batch_path == "fused"
        for start, stop in zip(starts[:-1].tolist(), starts[1:].tolist()):
            samples, clients = plan.samples[start:stop], plan.clients[start:stop]
            self.optimizer.zero_grad(set_to_none=False)
            stats.loss_sum += context.trainer.batch_gradient(
                context.model, samples, clients, fused=fused
            )
            # over Flower, a client dropped in or before this batch trained none of it
            trained = context.trainer.trained_samples(clients)
            context.progress(len(samples))
            if trained == 0:
                continue  # no gradient: a step would still move the weights by momentum
            self.optimizer.step()
            stats.steps += 1
            stats.loss_count += trained
            stats.sample_gradients += trained
        return stats

    # -- checkpoint -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), **self.compile_switch.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        self.compile_switch.load_state_dict(state)
