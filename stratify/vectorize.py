"""Many runs stepped together: stacked weights, one vmapped step (docs/architecture.md,
"Many runs at once").

Runs whose single-sample steps share an architecture and what they add to the gradient
(:class:`~stratify.compiled.StepTerms`) form a group. Every run keeps its own engine: its
plan, registry, random generators, metrics and run folder. Each epoch, every run of the
group hands out its round's local training as jobs (:meth:`Vectorizable.local_work
<stratify.method.Vectorizable.local_work>`): Stratify's hops as one job, FedAvg's clients as
one job each, SFL's hops as one job each. A :class:`LaneRunner` gives each run one lane of
a :class:`~stratify.compiled.VectorisedSteps` and steps every lane's jobs ``K`` samples per
call; a lane with nothing left to do steps at rate 0 until the others finish. A lane's
numbers depend only on its own inputs and the group's lane count, so a run gives the same
numbers in any group of that size, and a resumed group continues as it would have.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from stratify.algorithms import build_strategy
from stratify.backend import Timer
from stratify.client import GradientOffset, LocalJob, ProximalGradient
from stratify.compiled import (
    STEPS_PER_CALL,
    CompiledCallFailed,
    CompileSwitch,
    StepTerms,
    padded_blocks,
    vectorised_steps,
)
from stratify.config import TrainConfig
from stratify.errors import ConfigError, TrainingError
from stratify.method import EpochStats, LocalWork, step_terms
from stratify.nn.catalog import BATCH_STATISTICS_NORMS
from stratify.run import Run

#: ``--vectorize`` given without a number: runs per group
DEFAULT_GROUP_SIZE = 16

#: steps between two progress reports of a lane
PROGRESS_EVERY = 1000


def step_key(config: TrainConfig) -> tuple[tuple | None, str]:
    """What ``config``'s run must share with others to step with them, or ``None`` and why
    it steps alone.

    Runs share a step when they train single-sample, on the same dataset (the same
    architecture, and the same input and class counts) with the same model, norm and
    device, and their steps add the same terms to the gradient; ``--compile off`` groups
    apart (its group steps eagerly).
    """
    if config.mode != "single-sample":
        return None, "batch mode"
    if config.norm in BATCH_STATISTICS_NORMS:
        return None, f"--norm {config.norm}"
    strategy = build_strategy(config.algorithm, config.options, config.mode)
    terms = step_terms(strategy, config.mode)
    if terms is None:
        return None, f"{config.algorithm} has no single-sample jobs"
    compile_off = getattr(strategy.options, "compile", "auto") == "off"
    options = tuple(sorted((key, str(value)) for key, value in config.dataset_options.items()))
    key = (
        config.dataset,
        options,
        config.model,
        config.norm,
        config.mlp_hidden,
        config.device,
        terms,
        compile_off,
    )
    return key, ""


def balanced_chunks(items: Sequence, size: int) -> list[list]:
    """``items`` in order, cut into the fewest chunks of at most ``size``, their lengths
    differing by at most one (15 runs in groups of 8: 8 and 7, not 8 and 7; 16: 8 and 8)."""
    count = math.ceil(len(items) / size)
    base, extra = divmod(len(items), count)
    chunks, start = [], 0
    for index in range(count):
        stop = start + base + (index < extra)
        chunks.append(list(items[start:stop]))
        start = stop
    return chunks


@dataclass
class Grouping:
    """How runs are split into groups that step together.

    ``groups`` holds every run once, in groups of one or more (a group of one runs as
    usual); ``alone`` maps why a run cannot share a step to the runs it keeps apart.
    """

    groups: list[list[int]]
    alone: dict[str, list[int]] = field(default_factory=dict)

    def note(self, size: int) -> str | None:
        """One line: what steps together, and what runs alone and why."""
        together = [group for group in self.groups if len(group) > 1]
        if not together and not self.alone:
            return None
        runs = sum(len(group) for group in together)
        sizes = sorted({len(group) for group in together}, reverse=True)
        text = (
            f"--vectorize {size}: {runs} runs step in {len(together)} group(s) of "
            f"{'/'.join(map(str, sizes))}"
            if together
            else f"--vectorize {size}: no runs can step together"
        )
        if self.alone:
            count = sum(len(indices) for indices in self.alone.values())
            reasons = "; ".join(f"{len(v)} {k}" for k, v in self.alone.items())
            text += f"; {count} run(s) alone ({reasons})"
        return text


def plan_groups(configs: Sequence[TrainConfig], size: int) -> Grouping:
    """Groups of at most ``size`` runs sharing a step (:func:`step_key`), as even as
    possible, in the order given; the runs that cannot share one stay alone.

    The groups depend on the whole list only, so the same command forms the same groups
    again (a finished run keeps its place, its lane idle) and a resumed group steps with
    the same lane count.
    """
    if size < 1:
        raise ConfigError(f"--vectorize takes a group size of at least 1, got {size}")
    buckets: dict[tuple, list[int]] = {}
    grouping = Grouping([])
    for index, config in enumerate(configs):
        key, reason = step_key(config)
        if key is None:
            grouping.alone.setdefault(reason, []).append(index)
            grouping.groups.append([index])
        else:
            buckets.setdefault(key, []).append(index)
    for indices in buckets.values():
        grouping.groups += balanced_chunks(indices, size)
    return grouping


class TrainingData:
    """The distinct training tensors of a group's runs, joined into one, and each run's
    offset into it: a lane reads its run's samples as ``offset + index``.

    Runs on the same split share it (compared by value once, when the group forms);
    validation splits of different seeds are different tensors.
    """

    def __init__(self, tensors: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        distinct: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.offsets: list[int] = []
        starts: list[int] = []
        for x, y in tensors:
            for position, (seen_x, seen_y) in enumerate(distinct):
                if seen_x is x or (
                    seen_x.shape == x.shape and torch.equal(seen_x, x) and torch.equal(seen_y, y)
                ):
                    self.offsets.append(starts[position])
                    break
            else:
                starts.append(sum(len(seen) for seen, _ in distinct))
                self.offsets.append(starts[-1])
                distinct.append((x, y))
        self.x = distinct[0][0] if len(distinct) == 1 else torch.cat([x for x, _ in distinct])
        self.y = distinct[0][1] if len(distinct) == 1 else torch.cat([y for _, y in distinct])


@dataclass
class Lane:
    """One lane's queue of jobs and where it is in the current one."""

    jobs: list[LocalJob]
    offset: int
    progress: Callable[[int], None] | None
    current: int = -1
    blocks: np.ndarray | None = None
    mask: np.ndarray | None = None
    call: int = 0
    rows: list[torch.Tensor] = field(default_factory=list)
    unreported: int = 0

    @property
    def busy(self) -> bool:
        return self.blocks is not None


def copy_or_zero(
    targets: list[torch.Tensor], lane: int, sources: Sequence[torch.Tensor] | None
) -> None:
    """``targets[i][lane] = sources[i]``, or zeros where a job has no such term."""
    for index, target in enumerate(targets):
        if sources is None:
            target[lane].zero_()
        else:
            target[lane].copy_(sources[index])


class LaneRunner:
    """Steps the jobs of many lanes through one :class:`~stratify.compiled.VectorisedSteps`.

    Every lane runs its own queue of jobs in order. At a job's start its model's weights
    (and momentum buffers, anchor, offset) are copied into the lane; at its end the lane's
    weights go back into the model and the job's losses are filled in. Jobs are padded to
    whole calls of ``K`` steps with masked steps; a lane without work steps at rate 0.

    Parameters
    ----------
    model : torch.nn.Module
        A model of the architecture every job trains.
    terms : StepTerms
        What the steps add to the gradient; every job's terms must be among them.
    lanes : int
        Lanes of the vectorised step (the group's runs, fixed for the group's life).
    compile : bool
        Compiled (else the vmapped step runs eagerly).
    """

    steps_per_call = STEPS_PER_CALL

    def __init__(self, model: nn.Module, terms: StepTerms, lanes: int, compile: bool) -> None:
        self.terms = terms
        self.lanes = lanes
        self.steps = vectorised_steps(model, self.steps_per_call, terms, lanes, compile)
        parameters = [parameter.detach() for parameter in model.parameters()]
        self.dtype, self.device = parameters[0].dtype, parameters[0].device

        def stacked() -> list[torch.Tensor]:
            return [
                torch.zeros((lanes, *p.shape), dtype=p.dtype, device=p.device) for p in parameters
            ]

        self.parameters = stacked()
        self.velocities = stacked() if terms.momentum else []
        self.anchors = stacked() if terms.proximal else []
        self.offsets = stacked() if terms.offset else []
        #: calls made: only the first may fail to compile
        self.calls = 0
        self.beta = np.zeros(lanes, dtype=np.float64)
        self.weight_decay = np.zeros(lanes, dtype=np.float64)
        self.mu = np.zeros(lanes, dtype=np.float64)

    def run(
        self,
        queues: Sequence[Sequence[LocalJob]],
        x: torch.Tensor,
        y: torch.Tensor,
        lane_of: Sequence[int],
        offsets: Sequence[int],
        progress: Sequence[Callable[[int], None] | None] = (),
    ) -> None:
        """Run ``queues[i]`` in lane ``lane_of[i]``, its jobs' samples read from ``x``,
        ``y`` at ``offsets[i]`` + index; ``progress[i]`` is told the steps made, now and
        then."""
        K = self.steps_per_call
        lanes: list[Lane | None] = [None] * self.lanes
        for position, jobs in enumerate(queues):
            lanes[lane_of[position]] = Lane(
                list(jobs),
                offsets[position],
                progress[position] if position < len(progress) else None,
            )
        for lane, state in enumerate(lanes):
            if state is not None:
                self.next_job(lane, state)
        indices = np.zeros((self.lanes, K), dtype=np.int64)
        rates = np.zeros((self.lanes, K), dtype=np.float64)
        while any(state is not None and state.busy for state in lanes):
            indices[:] = 0
            rates[:] = 0.0
            for lane, state in enumerate(lanes):
                if state is not None and state.busy:
                    assert state.blocks is not None and state.mask is not None
                    indices[lane] = state.blocks[state.call]
                    rates[lane] = np.where(state.mask[state.call], state.jobs[state.current].lr, 0)
            try:
                losses = self.steps(
                    self.parameters,
                    self.velocities,
                    self.anchors,
                    self.offsets,
                    x,
                    y,
                    torch.as_tensor(indices, device=self.device),
                    self.tensor(rates),
                    self.tensor(self.beta),
                    self.tensor(self.weight_decay),
                    self.tensor(self.mu),
                )
            except Exception as error:
                if self.calls:
                    raise
                # the first call compiles; failing, it has touched no tensor or model
                raise CompiledCallFailed(error, 0, torch.zeros(0)) from None
            self.calls += 1
            for lane, state in enumerate(lanes):
                if state is None or not state.busy:
                    continue
                state.rows.append(losses[lane])
                state.call += 1
                state.unreported += K
                assert state.blocks is not None
                if state.call == len(state.blocks):
                    self.finish_job(lane, state)
                    self.next_job(lane, state)
                elif state.progress is not None and state.unreported >= PROGRESS_EVERY:
                    state.progress(state.unreported)
                    state.unreported = 0

    def tensor(self, values: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(values, dtype=self.dtype, device=self.device)

    def next_job(self, lane: int, state: Lane) -> None:
        """Load the lane's next job (skipping empty ones), or leave the lane idle."""
        state.blocks = state.mask = None
        while state.current + 1 < len(state.jobs):
            state.current += 1
            job = state.jobs[state.current]
            if len(job.order) == 0:
                job.losses = torch.zeros(0, dtype=self.dtype, device=self.device)
                continue
            self.load(lane, job)
            state.blocks, state.mask = padded_blocks(job.order + state.offset, self.steps_per_call)
            state.call = 0
            state.rows = []
            return

    def load(self, lane: int, job: LocalJob) -> None:
        """Copy a job's starting point into ``lane``."""
        if not self.terms.union(job.step_terms()) == self.terms:
            raise ValueError(
                f"a job with {job.step_terms().describe()} in a group stepping with "
                f"{self.terms.describe()}"
            )
        with torch.no_grad():
            for target, parameter in zip(self.parameters, job.model.parameters()):
                target[lane].copy_(parameter)
            if self.terms.momentum:
                for index, target in enumerate(self.velocities):
                    if job.velocities is None:
                        target[lane].zero_()
                    else:
                        target[lane].copy_(job.velocities[index])
            term = job.term
            if self.terms.proximal:
                anchor = term.anchor if isinstance(term, ProximalGradient) else None
                copy_or_zero(self.anchors, lane, anchor)
            if self.terms.offset:
                offset = term.offset if isinstance(term, GradientOffset) else None
                copy_or_zero(self.offsets, lane, offset)
        self.beta[lane] = job.momentum
        self.weight_decay[lane] = job.weight_decay
        self.mu[lane] = term.mu if isinstance(term, ProximalGradient) else 0.0

    def finish_job(self, lane: int, state: Lane) -> None:
        """Copy the lane's weights (and momentum) back into the job's model; its losses."""
        job = state.jobs[state.current]
        with torch.no_grad():
            for parameter, source in zip(job.model.parameters(), self.parameters):
                parameter.copy_(source[lane])
            if job.velocities is not None:
                for velocity, source in zip(job.velocities, self.velocities):
                    velocity.copy_(source[lane])
        job.losses = torch.stack(state.rows).reshape(-1)[: len(job.order)]
        if state.progress is not None:
            state.progress(state.unreported - (state.call * self.steps_per_call - len(job.order)))
        state.unreported = 0


def group_terms(runs: Sequence[Run]) -> StepTerms:
    """The step terms of a group's runs (all alike, by :func:`step_key`)."""
    terms = StepTerms()
    for run in runs:
        own = step_terms(run.strategy, run.config.mode)
        if own is None:
            raise ValueError(f"{run.config.algorithm} has no single-sample jobs")
        terms = terms.union(own)
    return terms


def train_together(
    runs: Sequence[Run],
    lanes: Sequence[int],
    lane_count: int,
    on_end: Callable[[int, BaseException | None], None],
) -> None:
    """Train every run of a group to its last epoch, stepping their jobs together.

    Run ``i`` steps in lane ``lanes[i]`` of ``lane_count``. Epoch by epoch, every run
    that has epochs left plans its round and hands out its jobs; the lanes step until
    every job has run; each run then finishes its round, evaluates, checkpoints and
    writes its files. A run whose epoch fails (a non-finite loss, an error) leaves the
    group, its files as :meth:`Run.train <stratify.run.Run.train>` would leave them;
    ``on_end(i, error)`` is called when run ``i`` ends (``error`` ``None`` when it
    finished). Each run records as its epoch's seconds its own planning and aggregation
    time plus an equal share of the shared steps.

    The group compiles its step (inductor) unless its runs say ``--compile off``: ``K``
    runs make ``K`` times one run's steps, so ``--compile auto`` compiles from the start.
    If the compile fails, ``--compile on`` stops the group's runs with one line and
    ``auto`` steps them with the eager vmapped step.
    """
    GroupTraining(runs, lanes, lane_count, on_end).train()


class GroupTraining:
    """The epochs of a group of runs stepped together (see :func:`train_together`)."""

    def __init__(
        self,
        runs: Sequence[Run],
        lanes: Sequence[int],
        lane_count: int,
        on_end: Callable[[int, BaseException | None], None],
    ) -> None:
        self.runs = runs
        self.lanes = lanes
        self.on_end = on_end
        self.modes = {getattr(run.strategy.options, "compile", "auto") for run in runs}
        self.runner = LaneRunner(
            runs[0].engine.model, group_terms(runs), lane_count, compile="off" not in self.modes
        )
        self.data = TrainingData(
            [(run.engine.context.x_train, run.engine.context.y_train) for run in runs]
        )
        self.ended: set[int] = set()

    def end(self, index: int, error: BaseException | None) -> None:
        self.ended.add(index)
        self.on_end(index, error)

    def train(self) -> None:
        active = []
        for index, run in enumerate(self.runs):
            if not run.done:
                active.append(index)
            else:
                self.end(index, None)
        while active:
            self.epoch(active)
            active = [index for index in active if index not in self.ended]

    def epoch(self, active: Sequence[int]) -> None:
        """The next epoch of every run in ``active``."""
        epochs = {index: self.runs[index].epochs_done + 1 for index in active}
        programs = {
            index: self.runs[index].engine.epoch_program(epochs[index], jobs=True)
            for index in active
        }
        seconds = dict.fromkeys(active, 0.0)
        works: dict[int, LocalWork] = {}
        results: dict[int, EpochStats] = {}
        for index in active:
            self.advance(index, programs[index], epochs[index], works, results, seconds)
        while works:
            stepping = sorted(works)
            with Timer(self.runner.device) as timer:
                self.step(stepping, works)
            for index in stepping:
                seconds[index] += timer.seconds / len(stepping)
                self.advance(index, programs[index], epochs[index], works, results, seconds)
        for index in sorted(results):
            run = self.runs[index]
            try:
                run.end_epoch(epochs[index], results[index], seconds[index])
            except Exception as error:
                self.end(index, error)
                continue
            if run.done:
                self.end(index, None)

    def advance(
        self,
        index: int,
        program: Generator[LocalWork, None, EpochStats],
        epoch: int,
        works: dict[int, LocalWork],
        results: dict[int, EpochStats],
        seconds: dict[int, float],
    ) -> None:
        """Run ``index``'s epoch up to its next jobs, or to its end."""
        run = self.runs[index]
        works.pop(index, None)
        with Timer(run.device) as timer:
            try:
                works[index] = program.send(None)
            except StopIteration as done:
                results[index] = done.value
            except TrainingError as error:
                self.end(index, run.stopped(error, epoch))
            except Exception as error:
                self.end(index, error)
        seconds[index] += timer.seconds

    def step(self, stepping: Sequence[int], works: dict[int, LocalWork]) -> None:
        """One round of every stepping run's jobs; a failed compile falls back."""
        arguments = (
            [works[index].jobs for index in stepping],
            self.data.x,
            self.data.y,
            [self.lanes[index] for index in stepping],
            [self.data.offsets[index] for index in stepping],
            [self.runs[index].engine.context.progress for index in stepping],
        )
        try:
            self.runner.run(*arguments)
        except CompiledCallFailed as failure:
            switch = CompileSwitch("on" if "on" in self.modes else "auto")
            switch.give_up(failure.error)  # on: a one-line TrainingError for the group
            runner = self.runner
            runner.steps = vectorised_steps(
                self.runs[stepping[0]].engine.model,
                runner.steps_per_call,
                runner.terms,
                runner.lanes,
                compile=False,
            )
            runner.run(*arguments)
