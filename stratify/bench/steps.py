"""The engine's single-sample loop against plain eager PyTorch loops, checked to do the same
work, and many runs at once on worker processes (:func:`bench_steps`, ``stratify bench
steps``).

Every loop starts from the same initial weights and steps through the same samples (the
epoch-1 plan of seed 0). The check compares weights every ``check_every`` steps: each loop
runs a segment from the reference loop's weights at its start and must end where the
reference ended. Comparing only at the very end would not work: batch-of-one SGD amplifies
float rounding, and loops with different kernels drift apart after a few thousand steps
even when they make exactly the same updates (docs/architecture.md, "Performance").
Runs stepped together (``--vectorize``) are checked the same way in float64, where such
rounding cannot part correct loops.
"""

from __future__ import annotations

import copy
import multiprocessing
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from stratify.backend import (
    Timer,
    configure_cpu_for_single_sample,
    cpu_backend_now,
    resolve_device,
    set_cpu_backend,
)
from stratify.client import LocalJob
from stratify.compiled import StepTerms
from stratify.config import TrainConfig
from stratify.data.datasets import Dataset, load_dataset
from stratify.engine import Engine
from stratify.errors import StratifyError
from stratify.experiment import build_experiment
from stratify.nn.models import check_model_norm, default_model
from stratify.state import State, clone_state, load_into
from stratify.stratify import SINGLE_SAMPLE_BYTES_PER_STEP, Stratify
from stratify.validation import check_fits_in_memory, check_positive_int, check_seeds
from stratify.vectorize import LaneRunner, TrainingData

#: a loop matches the reference when, at every check, its weights differ from the
#: reference's by at most this share of how far the reference moved in the segment;
#: float rounding stays near 1e-5 of it, one step left out or reordered is ~1e-2 or more
MATCH_TOLERANCE = 1e-3

#: the vectorised lanes match when, run in float64, their weights differ from the float64
#: reference's by at most this share of its movement per check: float64 rounding stays
#: near 1e-13 of it, one step left out or reordered is ~1e-2 or more
LANE_CHECK_TOLERANCE = 1e-6

#: seconds the workers may take to load the data and compile before the timed phase
WORKER_START_TIMEOUT = 900

#: bytes :func:`bench_steps` holds per step at least: the step list as int64 (8 B) and as
#: a Python list of ints (8 B pointer + 28 B int), and the loss the engine keeps per step
STEPS_BYTES_PER_STEP = 8 + 36 + SINGLE_SAMPLE_BYTES_PER_STEP

#: bytes a benchmark worker process holds at least: Python with torch imported (measured
#: about 650 MB resident, of which this much is its own)
WORKER_BYTES = 100 * 2**20


class BenchmarkError(StratifyError):
    """A benchmark whose loops did not do the same work, or whose workers failed."""


@dataclass(frozen=True)
class BackendSettings:
    """The process-wide CPU settings a loop runs under: threads and oneDNN."""

    threads: int
    mkldnn: bool

    @classmethod
    def current(cls) -> BackendSettings:
        return cls(*cpu_backend_now())

    def apply(self) -> None:
        set_cpu_backend(self.threads, self.mkldnn)


def eager_loop(model: nn.Module, x_train, y_train, samples: np.ndarray, lr: float) -> None:
    """What a plain PyTorch user writes: index, zero_grad, forward, backward, step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for index in samples.tolist():
        x = x_train[index].unsqueeze(0)
        y = y_train[index].unsqueeze(0)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()


def bench_engine(
    data: Dataset,
    *,
    spec: str,
    clients: int,
    model_name: str | None,
    seed: int,
    lr: float | None,
    compile_mode: str,
) -> Engine:
    """A single-sample Stratify engine on ``data`` (plain registry: no CKKS set-up cost);
    ``None`` for the model or the rate takes the library's; the schedule is constant, as
    the eager loops it is compared with."""
    config = TrainConfig(
        dataset=data.name,
        partition=spec,
        clients=clients,
        model=model_name,
        lr=lr,
        lr_schedule="constant",
        seed=seed,
        secure=False,
        options={"compile": compile_mode},
    )
    return build_experiment(config, dataset=data).engine


def bench_samples(engine: Engine, steps: int) -> np.ndarray:
    """``steps`` sample indices: the epoch-1 plan of the engine's seed, repeated as needed."""
    strategy = engine.strategy
    assert isinstance(strategy, Stratify)
    plan = strategy.plan_epoch(engine.context, engine.epoch_rng(1))
    return np.resize(plan.samples, steps)


def eager_reference(
    model: nn.Module, default: BackendSettings, x_train, y_train, lr: float
) -> Callable[[State, np.ndarray], State]:
    """``reference_from(state, samples)``: the parameters after the eager loop over
    ``samples`` from ``state``, on a copy of ``model`` with torch's own ``default``
    settings (the reference a check compares the engine or the lanes with)."""
    scratch = copy.deepcopy(model)

    def reference_from(state: State, part: np.ndarray) -> State:
        load_into(scratch, state)
        default.apply()
        eager_loop(scratch, x_train, y_train, part, lr)
        return parameters_of(scratch)

    return reference_from


def parameters_of(model: nn.Module) -> State:
    return clone_state(dict(model.named_parameters()))


def largest_difference(first: State, second: State) -> float:
    return max(float((first[key] - second[key]).abs().max()) for key in first)


@dataclass
class TimedLoop:
    """One loop of the benchmark: how to run some steps, its settings, what it measured."""

    name: str
    model: nn.Module
    settings: BackendSettings
    run: Callable[[np.ndarray], Any]
    seconds: float = 0.0
    max_difference: float = 0.0
    worst_share: float = 0.0
    #: timed segments that agreed only once re-checked in smaller pieces
    rechecked: int = 0

    def timed(self, samples: np.ndarray, device: torch.device) -> None:
        self.settings.apply()
        with Timer(device) as timer:
            self.run(samples)
        self.seconds += timer.seconds

    def untimed_from(self, state: State, samples: np.ndarray) -> State:
        """Run ``samples`` from ``state`` (not timed); the parameters at the end."""
        load_into(self.model, state)
        self.settings.apply()
        self.run(samples)
        return parameters_of(self.model)

    def steps_per_s(self, steps: int) -> float:
        return steps / self.seconds


def share_of_movement(ours: State, theirs: State, start: State) -> tuple[float, float]:
    """``max |w_ours − w_theirs|`` and its share of ``max |w_theirs − w_start|``."""
    difference = largest_difference(ours, theirs)
    return difference, difference / max(largest_difference(theirs, start), 1e-30)


class SegmentCheck:
    """Whether a loop made the reference's updates over a segment, from the same start.

    A segment that disagrees is checked again in halves, each from the reference's own
    weights at the start of the half, down to ``minimum`` steps. Rounding differences of
    1e-7 occasionally flip a near-tie (a max-pool window, a ReLU at zero) somewhere in a
    long segment and the runs part; the halves then agree, because less rounding has
    accumulated. A loop that does other work (a step left out, another sample) disagrees
    in every piece that contains the difference, down to the smallest.

    Parameters
    ----------
    reference_from : callable
        ``reference_from(state, samples)``: the reference loop's parameters after
        ``samples`` from ``state`` (run untimed on a copy of its model).
    minimum : int
        Smallest piece, in steps (the compiled step's ``K``: pieces stay whole calls).
    """

    def __init__(self, reference_from: Callable[[State, np.ndarray], State], minimum: int) -> None:
        self.reference_from = reference_from
        self.minimum = minimum

    def agrees(self, loop: TimedLoop, start: State, samples: np.ndarray, end: State) -> bool:
        """Compare ``loop``'s weights now, after ``samples`` from ``start``, with ``end``
        (the reference's); records the differences it accepts, or the one that fails."""
        difference, share = share_of_movement(parameters_of(loop.model), end, start)
        if share <= MATCH_TOLERANCE or len(samples) <= self.minimum:
            loop.max_difference = max(loop.max_difference, difference)
            loop.worst_share = max(loop.worst_share, share)
            return share <= MATCH_TOLERANCE
        half = max(len(samples) // 2 // self.minimum * self.minimum, self.minimum)
        middle = self.reference_from(start, samples[:half])
        loop.untimed_from(start, samples[:half])
        if not self.agrees(loop, start, samples[:half], middle):
            return False
        loop.untimed_from(middle, samples[half:])
        return self.agrees(loop, middle, samples[half:], end)


def checked_comparison(
    engine: Engine,
    samples: np.ndarray,
    *,
    check_every: int,
    lr: float,
    default: BackendSettings,
) -> tuple[list[TimedLoop], float | None, bool]:
    """Time the default eager loop (the reference), the tuned eager loop and the engine
    segment by segment on ``samples``; returns the loops, the compile seconds and whether
    every segment of every loop agreed with the reference (:class:`SegmentCheck`).

    The engine's process settings (set when it was built) are the tuned ones; ``default``
    are torch's own, recorded before.
    """
    strategy = engine.strategy
    assert isinstance(strategy, Stratify)
    context, device = engine.context, engine.device
    x_train, y_train = context.x_train, context.y_train
    tuned = BackendSettings.current()
    initial = parameters_of(engine.model)
    reference_model, tuned_model = copy.deepcopy(engine.model), copy.deepcopy(engine.model)
    reference = TimedLoop(
        "eager PyTorch loop",
        reference_model,
        default,
        lambda part: eager_loop(reference_model, x_train, y_train, part, lr),
    )
    tuned_loop = TimedLoop(
        "eager PyTorch loop, tuned",
        tuned_model,
        tuned,
        lambda part: eager_loop(tuned_model, x_train, y_train, part, lr),
    )
    compiled = strategy.uses_compiled_step(context)
    engine_loop = TimedLoop(
        "engine, compiled step" if compiled else "engine, eager step",
        engine.model,
        tuned,
        lambda part: strategy.execute_single_sample(context, part),
    )
    reference_from = eager_reference(engine.model, default, x_train, y_train, lr)

    # warm-up on copies (and the engine's compile), then every loop starts from `initial`
    warm = samples[: max(64, 4 * strategy.steps_per_call)]
    for loop in (reference, tuned_loop):
        loop.settings.apply()
        eager_loop(copy.deepcopy(loop.model), x_train, y_train, warm, lr)
    tuned.apply()
    with Timer(device) as compile_timer:
        strategy.execute_single_sample(context, warm)
    load_into(engine_loop.model, initial)
    check = SegmentCheck(reference_from, minimum=strategy.steps_per_call)
    agreed = True
    start_state = initial
    for start in range(0, len(samples), check_every):
        part = samples[start : start + check_every]
        reference.timed(part, device)
        end_state = parameters_of(reference.model)
        for loop in (tuned_loop, engine_loop):
            load_into(loop.model, start_state)
            loop.timed(part, device)
            first_try = share_of_movement(parameters_of(loop.model), end_state, start_state)
            if first_try[1] > MATCH_TOLERANCE:
                loop.rechecked += 1
            agreed = check.agrees(loop, start_state, part, end_state) and agreed
        start_state = end_state
    return [reference, tuned_loop, engine_loop], compile_timer.seconds if compiled else None, agreed


# -- many runs in one step ----------------------------------------------------------------


def vectorised_comparison(
    engines: list[Engine],
    samples: list[np.ndarray],
    *,
    check_every: int,
    lr: float,
    compile: bool,
    default: BackendSettings,
) -> dict[str, Any]:
    """Time ``len(engines)`` runs stepped together (one lane each, their weights stacked
    under one vmapped step, :mod:`stratify.vectorize`) against one run's compiled step,
    segment by segment in turn so that a change of load hits both alike; then check the
    lanes in float64 (:func:`float64_lane_check`).

    Lane ``k`` trains engine ``k``'s model on ``samples[k]``; lane 0 starts every timed
    segment from the float32 reference loop's weights, and how far it ends from them is
    reported (``float32_share``) but not judged: in float32 a rounding difference that
    flips a near-tie (a ReLU at zero) parts two correct loops by ~1e-2 of the movement
    within a few steps, now and then, on some machines (docs/architecture.md,
    "Performance"). The single run is engine 0's compiled step on ``samples[0]`` from the
    same weights.
    """
    first = engines[0]
    strategy = first.strategy
    assert isinstance(strategy, Stratify)
    context, device = first.context, first.device
    x_train, y_train = context.x_train, context.y_train
    tuned = BackendSettings.current()
    lanes = len(engines)
    runner = LaneRunner(first.model, StepTerms(), lanes, compile=compile)
    lane_models = [copy.deepcopy(first.model)] + [engine.model for engine in engines[1:]]
    data = TrainingData([(engine.context.x_train, engine.context.y_train) for engine in engines])
    initial = parameters_of(first.model)
    reference_from = eager_reference(first.model, default, x_train, y_train, lr)

    tuned.apply()
    warm = [lane_samples[: 4 * runner.steps_per_call] for lane_samples in samples]
    with Timer(device) as compile_timer:
        step_lanes(runner, lane_models, warm, data, lr)
    strategy.execute_single_sample(context, samples[0][: 4 * strategy.steps_per_call])
    # the reference's weights at every check first: its two threads, right before a timed
    # loop, would still be spinning and slow it down
    starts = range(0, len(samples[0]), check_every)
    states = [initial]
    for start in starts:
        states.append(reference_from(states[-1], samples[0][start : start + check_every]))
    tuned.apply()
    single_seconds = vectorised_seconds = 0.0
    float32_share = 0.0
    for segment, start in enumerate(starts):
        parts = [lane_samples[start : start + check_every] for lane_samples in samples]
        start_state, end_state = states[segment], states[segment + 1]
        load_into(first.model, start_state)
        with Timer(device) as timer:
            strategy.execute_single_sample(context, parts[0])
        single_seconds += timer.seconds
        load_into(lane_models[0], start_state)
        with Timer(device) as timer:
            step_lanes(runner, lane_models, parts, data, lr)
        vectorised_seconds += timer.seconds
        share = share_of_movement(parameters_of(lane_models[0]), end_state, start_state)[1]
        float32_share = max(float32_share, share)
        tuned.apply()
    with Timer(device) as check_timer:
        check = float64_lane_check(
            engines, samples, check_every=check_every, lr=lr, compile=compile
        )
    tuned.apply()
    steps = len(samples[0])
    single = steps / single_seconds
    vectorised = lanes * steps / vectorised_seconds
    return {
        "lanes": lanes,
        "single_steps_per_s": single,
        "model_steps_per_s": vectorised,
        "ratio": vectorised / single,
        "weights_match": check["worst_share"] <= LANE_CHECK_TOLERANCE,
        "compile_seconds": compile_timer.seconds if compile else None,
        "check_seconds": check_timer.seconds,
        "max_difference": check["max_difference"],
        "worst_share": check["worst_share"],
        "checked_lanes": check["lanes"],
        "float32_share": float32_share,
    }


def step_lanes(
    runner: LaneRunner,
    models: list[nn.Module],
    parts: list[np.ndarray],
    data: TrainingData,
    lr: float,
) -> None:
    """One job per lane: ``models[k]`` steps through ``parts[k]`` in lane ``k``."""
    lanes = list(range(len(models)))
    runner.run(
        [[LocalJob(models[lane], parts[lane], lr)] for lane in lanes],
        data.x,
        data.y,
        lanes,
        [data.offsets[lane] for lane in lanes],
    )


def float64_lane_check(
    engines: list[Engine],
    samples: list[np.ndarray],
    *,
    check_every: int,
    lr: float,
    compile: bool,
) -> dict[str, Any]:
    """The benchmark's lanes in float64 against the eager loop in float64: the first and
    the last lane (each engine's own samples, every lane stepping) start each segment of
    ``check_every`` steps from the reference's weights and must end where it does.

    In float64 the rounding is 10⁹ times finer: correct lanes end ~1e-13 of the movement
    from the reference, where in float32 a flipped near-tie can part them by 1e-2 (see
    :func:`vectorised_comparison`); a lane that steps another sample, leaves a step out
    or reads another lane's tensors ends 1e-3 or more away. The lanes run the timed
    run's code (compiled with ``compile``) at float64.

    Parameters
    ----------
    engines : list of Engine
        One per lane, as in :func:`vectorised_comparison`.
    samples : list of numpy.ndarray
        Each lane's samples.
    check_every : int
        Steps per segment.
    lr : float
        The constant rate of every loop.
    compile : bool
        Compile the float64 lanes (else the vmapped step runs eagerly).

    Returns
    -------
    dict
        ``max_difference`` and ``worst_share`` (of the reference's movement) over the
        checked lanes and segments, and the checked ``lanes``.
    """
    lanes = len(engines)
    models = [copy.deepcopy(engine.model).to(torch.float64) for engine in engines]
    runner = LaneRunner(models[0], StepTerms(), lanes, compile=compile)
    data = TrainingData([(engine.context.x_train, engine.context.y_train) for engine in engines])
    data.x = data.x.to(torch.float64)
    checked = sorted({0, lanes - 1})
    reference = copy.deepcopy(models[0])
    states = {lane: parameters_of(models[lane]) for lane in checked}
    max_difference = worst_share = 0.0
    for start in range(0, len(samples[0]), check_every):
        parts = [lane_samples[start : start + check_every] for lane_samples in samples]
        ends = {}
        for lane in checked:
            load_into(reference, states[lane])
            eager_loop(reference, data.x, data.y, parts[lane] + data.offsets[lane], lr)
            ends[lane] = parameters_of(reference)
            load_into(models[lane], states[lane])
        step_lanes(runner, models, parts, data, lr)
        for lane in checked:
            difference, share = share_of_movement(
                parameters_of(models[lane]), ends[lane], states[lane]
            )
            max_difference = max(max_difference, difference)
            worst_share = max(worst_share, share)
            states[lane] = ends[lane]
    return {"max_difference": max_difference, "worst_share": worst_share, "lanes": checked}


# -- many runs at once -------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerJob:
    """What a worker process needs to build its runs (plain values: spawn pickles them)."""

    dataset: str
    data_dir: str | None
    spec: str
    clients: int
    model_name: str
    lr: float
    compile_mode: str
    steps: int
    seeds: tuple[int, ...]


def seed_worker(job: WorkerJob, worker: int, barrier, results) -> None:
    """A single-thread worker: load the data once, build and warm up one run per seed,
    wait for the others, then run ``steps`` engine steps of every seed, timed."""
    try:
        configure_cpu_for_single_sample()
        started = time.perf_counter()
        data = load_dataset(job.dataset, data_dir=job.data_dir, device="cpu")
        runs = []
        for seed in job.seeds:
            engine = bench_engine(
                data,
                spec=job.spec,
                clients=job.clients,
                model_name=job.model_name,
                seed=seed,
                lr=job.lr,
                compile_mode=job.compile_mode,
            )
            samples = bench_samples(engine, job.steps)
            strategy = engine.strategy
            assert isinstance(strategy, Stratify)
            # warm-up (the first run compiles, from inductor's cache; the others reuse it)
            strategy.execute_single_sample(engine.context, samples[: 4 * strategy.steps_per_call])
            runs.append((strategy, engine.context, samples))
        ready = time.perf_counter() - started
        barrier.wait(timeout=WORKER_START_TIMEOUT)
        start = time.perf_counter()
        for strategy, context, samples in runs:
            strategy.execute_single_sample(context, samples)
        results.put((worker, time.perf_counter() - start, ready, None))
    except BaseException as error:  # the parent reports it in one line
        barrier.abort()
        results.put((worker, 0.0, 0.0, f"{type(error).__name__}: {error}"))


def parallel_seeds(job: WorkerJob, workers: int) -> dict[str, float]:
    """Run ``job.seeds`` on ``workers`` spawned single-thread processes (seed ``s`` on worker
    ``s mod workers``); time from the moment all are ready until the last one finishes."""
    context = multiprocessing.get_context("spawn")
    workers = min(workers, len(job.seeds))
    barrier = context.Barrier(workers + 1)
    results = context.Queue()
    processes = []
    for worker in range(workers):
        own = WorkerJob(**{**job.__dict__, "seeds": job.seeds[worker::workers]})
        process = context.Process(target=seed_worker, args=(own, worker, barrier, results))
        process.start()
        processes.append(process)
    try:
        try:
            barrier.wait(timeout=WORKER_START_TIMEOUT)
        except Exception:
            pass  # a failed worker broke the barrier; its message is in the queue
        start = time.perf_counter()
        reports = [results.get(timeout=WORKER_START_TIMEOUT * 4) for _ in range(workers)]
        wall = time.perf_counter() - start
    except queue.Empty:
        raise BenchmarkError("a benchmark worker stopped without reporting") from None
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.terminate()
    failures = [message for _, _, _, message in reports if message]
    if failures:
        raise BenchmarkError(f"a benchmark worker failed: {failures[0]}")
    return {
        "model_steps_per_s": len(job.seeds) * job.steps / wall,
        "wall_seconds": wall,
        "slowest_start_seconds": max(ready for _, _, ready, _ in reports),
    }


# -- the benchmark -----------------------------------------------------------------------


@dataclass
class StepsResult:
    """What :func:`bench_steps` measured; :meth:`to_json` is ``bench steps --json``.

    ``loops`` are the reference eager loop, the tuned eager loop and the engine (their
    ``steps_per_s`` and checks); ``parallel`` and ``vectorised`` are set when asked for
    (``seeds`` or ``workers`` above one, ``vectorize``).
    """

    dataset: str
    model_name: str
    lr: float
    device: str
    steps: int
    check_every: int
    compile_mode: str
    seeds: tuple[int, ...]
    workers: int
    loops: list[TimedLoop]
    compile_seconds: float | None
    weights_match: bool
    parallel: dict[str, float] | None = None
    vectorize: int | None = None
    vectorised: dict[str, Any] | None = None

    @property
    def reference(self) -> TimedLoop:
        return self.loops[0]

    def steps_per_s(self, loop: TimedLoop) -> float:
        return loop.steps_per_s(self.steps)

    def to_json(self) -> dict[str, Any]:
        """The figures as ``bench steps --json`` writes them."""
        reference, tuned, engine = (self.steps_per_s(loop) for loop in self.loops)
        result: dict[str, Any] = {
            "eager_steps_per_s": reference,
            "tuned_eager_steps_per_s": tuned,
            "engine_steps_per_s": engine,
            "ratio": engine / reference,
            "tuned_ratio": engine / tuned,
            "model_steps_per_s": engine
            if self.parallel is None
            else self.parallel["model_steps_per_s"],
            "seeds": list(self.seeds),
            "workers": self.workers,
            "weights_match": self.weights_match,
            "compile_seconds": self.compile_seconds,
        }
        if self.vectorised is not None:
            result.update(
                vectorized_lanes=self.vectorize,
                vectorized_model_steps_per_s=self.vectorised["model_steps_per_s"],
                vectorized_single_steps_per_s=self.vectorised["single_steps_per_s"],
                vectorized_ratio=self.vectorised["ratio"],
                vectorized_compile_seconds=self.vectorised["compile_seconds"],
                vectorized_float64_share=self.vectorised["worst_share"],
                vectorized_float32_share=self.vectorised["float32_share"],
            )
        return result

    def check(self) -> None:
        """Raise :class:`BenchmarkError` when the loops did not make the same updates."""
        if self.vectorised is not None and not self.vectorised["weights_match"]:
            raise BenchmarkError(
                "the vectorised lanes, run in float64, ended a segment "
                f"{self.vectorised['worst_share']:.1e} of the movement away from the eager "
                f"loop in float64 (tolerance {LANE_CHECK_TOLERANCE:g}): they did not make the "
                "same updates"
            )
        if not self.weights_match:
            worst = max(loop.worst_share for loop in self.loops[1:])
            raise BenchmarkError(
                "the engine and the eager loops ended a segment with different weights "
                f"(worst {worst:.1e} of the movement, "
                f"tolerance {MATCH_TOLERANCE:g}): they did not make the same updates"
            )


def bench_steps(
    dataset: str,
    *,
    data_dir: str | None = None,
    spec: str = "dirichlet:0.5",
    clients: int = 10,
    model_name: str | None = None,
    steps: int = 4096,
    check_every: int = 512,
    lr: float | None = None,
    compile_mode: str = "on",
    seeds: tuple[int, ...] = (0,),
    workers: int = 1,
    device: str = "auto",
    vectorize: int | None = None,
) -> StepsResult:
    """Single-sample steps/s of the engine against plain eager loops, checked to make the
    same updates; with several ``seeds`` or ``workers``, model-steps/s of one run per seed
    on worker processes; with ``vectorize`` K, of K runs stepped together.

    Parameters
    ----------
    dataset, data_dir, spec, clients : str, str or None, str, int
        The data and its split, as ``stratify train`` takes them.
    model_name, lr : str or None, float or None
        ``None`` takes the library's, as ``stratify train``.
    steps, check_every : int
        Steps of every loop; steps between two weight checks against the reference.
    compile_mode : str
        The engine's ``--compile``.
    seeds : tuple of int
        The runs' seeds; the first is the checked run's.
    workers : int
        Single-thread worker processes for the seeds.
    device : str
        ``auto``, ``cpu`` or ``cuda``.
    vectorize : int or None
        Also step this many runs together under one vmapped step.
    """
    for value, flag in ((steps, "--steps"), (check_every, "--check-every")):
        check_positive_int(value, flag)
    seeds = check_seeds(seeds)
    check_positive_int(workers, "--workers")
    if vectorize is not None:
        check_positive_int(vectorize, "--vectorize")
    check_fits_in_memory(steps * STEPS_BYTES_PER_STEP, f"--steps {steps:,}", "time fewer steps")
    check_model_norm(model_name, None, "single-sample")  # before the data is loaded
    many = len(seeds) > 1 or workers > 1
    processes = min(workers, len(seeds)) if many else 0
    check_fits_in_memory(
        processes * WORKER_BYTES,
        f"--workers {workers:,} with {len(seeds):,} seeds ({processes:,} worker processes, "
        "each holding torch)",
        "use fewer workers",
    )
    default = BackendSettings.current()  # torch's own, before the engine changes them
    where = resolve_device(device)
    data = load_dataset(dataset, data_dir=data_dir, device=where)

    def engine_of(seed: int) -> Engine:
        return bench_engine(
            data,
            spec=spec,
            clients=clients,
            model_name=model_name,
            seed=seed,
            lr=lr,
            compile_mode=compile_mode,
        )

    engine = engine_of(seeds[0])
    lr = engine.base_lr  # the library's when not given
    model_name = model_name or default_model(data.input_shape)
    samples = bench_samples(engine, steps)
    loops, compile_seconds, weights_match = checked_comparison(
        engine, samples, check_every=check_every, lr=lr, default=default
    )
    result = StepsResult(
        dataset=dataset,
        model_name=model_name,
        lr=lr,
        device=str(where),
        steps=steps,
        check_every=check_every,
        compile_mode=compile_mode,
        seeds=tuple(seeds),
        workers=min(workers, len(seeds)),
        loops=loops,
        compile_seconds=compile_seconds,
        weights_match=weights_match,
    )
    if many:
        job = WorkerJob(
            dataset=dataset,
            data_dir=data_dir,
            spec=spec,
            clients=clients,
            model_name=model_name,
            lr=lr,
            compile_mode=compile_mode,
            steps=steps,
            seeds=tuple(seeds),
        )
        result.parallel = parallel_seeds(job, workers)
    if vectorize is not None:
        engines = [engine] + [engine_of(seeds[0] + lane) for lane in range(1, vectorize)]
        result.vectorize = vectorize
        result.vectorised = vectorised_comparison(
            engines,
            [samples] + [bench_samples(other, steps) for other in engines[1:]],
            check_every=check_every,
            lr=lr,
            compile=compile_mode != "off",
            default=default,
        )
        result.weights_match = weights_match and result.vectorised["weights_match"]
    return result
