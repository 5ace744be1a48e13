"""A single-sample baseline's round with the clients' local training compiled (``--compile
on``) against the eager local loop, from the same weights (:func:`bench_local`, ``stratify
bench local``).

One engine of each runs the same rounds in turn (the same clients, the same shuffles), the
compiled one starting every round from the eager one's weights; round 1 warms up (and
compiles) and is not timed. Every client's local training is then checked the way ``bench
steps`` checks its loops (:class:`~stratify.bench.steps.SegmentCheck`): from the
round's global weights, the compiled job must end where the eager loop ends, within
:data:`~stratify.bench.steps.MATCH_TOLERANCE` of how far the eager loop moved.
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from stratify.algorithms import ALGORITHMS, strategy_class
from stratify.backend import Timer
from stratify.bench.steps import (
    MATCH_TOLERANCE,
    BackendSettings,
    BenchmarkError,
    SegmentCheck,
    TimedLoop,
    parameters_of,
    share_of_movement,
)
from stratify.client import LocalJob, LocalTrainer
from stratify.compiled import CompileSwitch
from stratify.config import TrainConfig
from stratify.data.datasets import load_dataset
from stratify.engine import Engine
from stratify.experiment import build_experiment
from stratify.method import local_work
from stratify.state import State, load_into
from stratify.validation import check_choice, check_positive_int, check_repeats


def local_methods() -> tuple[str, ...]:
    """The registered methods whose card sets ``bench.benchmark_local``."""
    return tuple(name for name in ALGORITHMS if strategy_class(name).card.bench.benchmark_local)


def local_engine(config: TrainConfig, compile_mode: str, data: Any) -> Engine:
    """``config``'s engine with the clients' ``--compile`` set to ``compile_mode``."""
    options = {**config.options, "compile": compile_mode}
    return build_experiment(replace(config, options=options), dataset=data).engine


def client_jobs(engine: Engine, epoch: int) -> list[LocalJob]:
    """The epoch's local training as jobs (the round's draws), on copies of the model."""
    strategy, context = engine.strategy, engine.context
    context.epoch = epoch
    rng = engine.epoch_rng(epoch)
    (round_,) = strategy.configure_rounds(context, epoch, rng)
    work = local_work(strategy, context, round_, rng)
    assert work is not None, "a single-sample baseline gives its round as jobs"
    return work.jobs


def check_jobs(
    engine: Engine, epoch: int, start: State, strategy_state: dict[str, Any]
) -> tuple[bool, float, int]:
    """Each client job of ``epoch`` from the global weights ``start`` and the method's
    state then (SCAFFOLD's control variates): compiled against eager."""
    load_into(engine.model, start)
    engine.strategy.load_state_dict(strategy_state)
    jobs = client_jobs(engine, epoch)
    agreed, worst, rechecked = True, 0.0, 0
    for job in jobs:
        ok, share, again = check_job(engine.context.trainer, job)
        agreed, worst, rechecked = agreed and ok, max(worst, share), rechecked + again
    return agreed, worst, rechecked


def check_job(trainer: LocalTrainer, job: LocalJob) -> tuple[bool, float, int]:
    """``job`` compiled against the eager loop from its model's weights: whether it
    agrees, its share of the movement, and whether it agreed only in pieces."""
    begin = parameters_of(job.model)
    eager_model = copy.deepcopy(job.model)

    def eager_from(state: State, part: np.ndarray) -> State:
        load_into(eager_model, state)
        trainer.train_eager(
            eager_model, [part], 1, job.lr, job.momentum, job.weight_decay, job.term
        )
        return parameters_of(eager_model)

    def compiled_part(part: np.ndarray) -> None:
        piece = LocalJob(job.model, part, job.lr, job.momentum, job.weight_decay, job.term)
        trainer.run_compiled(piece, CompileSwitch("on"))

    loop = TimedLoop("compiled job", job.model, BackendSettings.current(), compiled_part)
    end = eager_from(begin, job.order)
    load_into(job.model, begin)
    compiled_part(job.order)
    again = int(share_of_movement(parameters_of(job.model), end, begin)[1] > MATCH_TOLERANCE)
    agreed = SegmentCheck(eager_from, minimum=trainer.steps_per_call).agrees(
        loop, begin, job.order, end
    )
    return agreed, loop.worst_share, again


@dataclass
class LocalResult:
    """What :func:`bench_local` measured: seconds of each timed round, eager and compiled,
    and how far the compiled clients' weights ended from the eager loop's."""

    method: str
    dataset: str
    spec: str
    clients: int
    eager_rounds_s: list[float]
    compiled_rounds_s: list[float]
    weights_match: bool
    worst_share: float
    rechecked_jobs: int

    @property
    def eager_round_s(self) -> float:
        return statistics.median(self.eager_rounds_s)

    @property
    def compiled_round_s(self) -> float:
        return statistics.median(self.compiled_rounds_s)

    def to_json(self) -> dict[str, Any]:
        """The figures as ``bench local --json`` writes them."""
        return {
            "algorithm": self.method,  # the key earlier versions wrote
            "eager_round_s": self.eager_round_s,
            "compiled_round_s": self.compiled_round_s,
            "weights_match": self.weights_match,
            "worst_share": self.worst_share,
            "rechecked_jobs": self.rechecked_jobs,
            "ratio": self.eager_round_s / self.compiled_round_s,
        }

    def check(self) -> None:
        """Raise :class:`BenchmarkError` when a compiled job ended elsewhere."""
        if not self.weights_match:
            raise BenchmarkError(
                "the compiled local training ended a job with other weights than the eager "
                f"loop ({self.worst_share:.1e} of the movement, tolerance {MATCH_TOLERANCE:g})"
            )


def bench_local(
    method: str | None = None,
    *,
    dataset: str = "mnist-10k",
    data_dir: str | None = None,
    spec: str = "dirichlet:0.5",
    clients: int = 10,
    rounds: int = 3,
) -> LocalResult:
    """Seconds per round of a single-sample baseline (a table1 cell): compiled local
    training against the eager local loop, the same rounds, the weights checked.

    Parameters
    ----------
    method : str or None
        A method whose card sets ``bench.benchmark_local``; ``None``: the first registered.
    dataset, data_dir, spec, clients : str, str or None, str, int
        The data and its split, as ``stratify train`` takes them.
    rounds : int
        Timed rounds of each, after one warm-up round.
    """
    timed = local_methods()
    method = timed[0] if method is None else check_choice(method, "--method", timed)
    check_repeats(rounds, "--rounds")  # a loop count: bounded, as every benchmark's
    check_positive_int(clients, "--clients")
    data = load_dataset(dataset, data_dir=data_dir, device="cpu")
    config = TrainConfig(
        dataset=dataset,
        data_dir=data_dir,
        partition=spec,
        clients=clients,
        algorithm=method,
        mode="single-sample",
        secure=False,
        epochs=rounds + 1,
    )
    eager = local_engine(config, "off", data)
    compiled = local_engine(config, "on", data)
    eager_seconds, compiled_seconds = [], []
    agreed, worst, rechecked = True, 0.0, 0
    checker = local_engine(config, "on", data)
    for epoch in range(1, rounds + 2):  # round 1 warms up (and compiles)
        start = parameters_of(eager.model)
        before = copy.deepcopy(eager.strategy.state_dict())
        load_into(compiled.model, start)
        with Timer(eager.device) as timer:
            eager.run_epoch(epoch)
        if epoch > 1:
            eager_seconds.append(timer.seconds)
        with Timer(compiled.device) as timer:
            compiled.run_epoch(epoch)
        if epoch > 1:
            compiled_seconds.append(timer.seconds)
            ok, share, again = check_jobs(checker, epoch, start, before)
            agreed, worst, rechecked = agreed and ok, max(worst, share), rechecked + again
    return LocalResult(
        method, dataset, spec, clients, eager_seconds, compiled_seconds, agreed, worst, rechecked
    )
