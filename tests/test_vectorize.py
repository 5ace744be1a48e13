"""Runs stepped together (``--vectorize``) against the same runs alone.

Most tests step the vmapped function eagerly (``--compile off``): the same lanes, masks and
bookkeeping as the compiled step, without tens of seconds of compile; one test compiles
with inductor on a tiny MLP.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import stratify.compiled
import stratify.vectorize
from stratify.cli.main import main
from stratify.client import LocalJob, LocalTrainer, ProximalGradient
from stratify.compiled import StepTerms
from stratify.config import TrainConfig
from stratify.data.datasets import load_dataset
from stratify.experiment import build_experiment
from stratify.nn.models import build_model
from stratify.parallel import LocalBackend, RunsInterrupted, RunSpec, group_specs, run_specs
from stratify.vectorize import LaneRunner, TrainingData, balanced_chunks, plan_groups


def config(out: Path, algorithm: str = "stratify", seed: int = 0, **values) -> TrainConfig:
    options = dict(values.pop("options", {}))
    if values.get("mode", "single-sample") == "single-sample":
        options.setdefault("compile", "off")
    if algorithm == "stratify":
        options.setdefault("repeat_count", 30)  # 300 hops an epoch
    return TrainConfig(
        **{
            "dataset": "digits",
            "partition": "dirichlet:0.5",
            "clients": 5,
            "algorithm": algorithm,
            "epochs": 2,
            "lr": 0.01,
            "seed": seed,
            "secure": False,
            "options": options,
            "out": str(out),
            **values,
        }
    )


def parameters(folder: Path) -> dict[str, torch.Tensor]:
    return torch.load(folder / "checkpoint.pt", weights_only=True)["model"]


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def share_of_movement(ours, theirs, start) -> float:
    difference = max(float((ours[k] - theirs[k]).abs().max()) for k in ours)
    moved = max(float((theirs[k] - start[k]).abs().max()) for k in theirs)
    return difference / moved


METHODS = [("stratify", {}), ("fedavg", {}), ("scaffold", {})]
#: two seeds give every group two lanes or more, as many as a lane mix-up needs to show
SEEDS = (0, 1)


def test_a_vectorised_run_equals_the_run_alone(tmp_path):
    """Two seeds of three methods, stepped together (two groups: plain SGD for Stratify
    and FedAvg, SCAFFOLD's offset; each of two lanes or more), against each run alone:
    the same accuracies and counts, the losses and weights within float rounding."""

    def specs(where: str) -> list[RunSpec]:
        return [
            RunSpec(
                f"{method}-{seed}",
                config(tmp_path / where / f"{method}-{seed}", method, seed, options=options),
            )
            for method, options in METHODS
            for seed in SEEDS
        ]

    notes: list[str] = []
    alone = run_specs(specs("alone"), LocalBackend(1))
    together = run_specs(specs("together"), LocalBackend(1), vectorize=16, on_note=notes.append)
    assert [o.status for o in alone + together] == ["finished"] * 12
    assert notes == ["--vectorize 16: 6 runs step in 2 group(s) of 4/2"]
    for method, _ in METHODS:
        for seed in SEEDS:
            name = f"{method}-{seed}"
            ours, theirs = tmp_path / "together" / name, tmp_path / "alone" / name
            for mine, reference in zip(records(ours), records(theirs), strict=True):
                assert mine["test_accuracy"] == reference["test_accuracy"], name
                assert (mine["steps"], mine["transfers"]) == (
                    reference["steps"],
                    reference["transfers"],
                )
                assert mine["train_loss"] == pytest.approx(reference["train_loss"], rel=1e-5)
            torch.manual_seed(seed)
            start = build_model("cnn", (1, 8, 8), 10).state_dict()
            # the benchmark's tolerance is 1e-3 of the movement; float rounding stays far below
            assert share_of_movement(parameters(ours), parameters(theirs), start) < 1e-4, name


def test_a_vectorised_run_with_a_validation_split_equals_the_same_run_alone(tmp_path):
    """Seeds 0 and 1 with ``--validation 0.2`` stepped together (``--vectorize 2``): their
    training splits differ, and each run reads its own, giving its numbers alone."""

    def specs(where: str) -> list[RunSpec]:
        return [
            RunSpec(
                f"seed-{seed}",
                config(tmp_path / where / f"seed-{seed}", "stratify", seed, validation=0.2),
            )
            for seed in (0, 1)
        ]

    alone = run_specs(specs("alone"), LocalBackend(1))
    together = run_specs(specs("together"), LocalBackend(1), vectorize=2)
    assert [outcome.status for outcome in alone + together] == ["finished"] * 4
    for seed in (0, 1):
        ours = tmp_path / "together" / f"seed-{seed}"
        theirs = tmp_path / "alone" / f"seed-{seed}"
        for mine, reference in zip(records(ours), records(theirs), strict=True):
            for key in ("test_accuracy", "validation_accuracy", "steps"):
                assert mine[key] == reference[key], (seed, key)
        torch.manual_seed(seed)
        start = build_model("cnn", (1, 8, 8), 10).state_dict()
        assert share_of_movement(parameters(ours), parameters(theirs), start) < 1e-4, seed


def in_float64(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy: lanes and reference then agree to ~1e-15 of the movement, where in
    float32 a rounding difference that flips a near-tie (a ReLU at zero) now and then
    parts them by ~1e-2 (docs/architecture.md, "Performance")."""
    return copy.deepcopy(model).to(torch.float64)


def test_vectorised_fedavg_momentum_jobs_equal_each_client_alone():
    """FedAvg with ``--local-momentum 0.5``: a round's clients run one after another in a
    lane, each from zero momentum as a fresh optimizer alone, never from the previous
    client's; every client's model ends where torch's SGD alone leaves it (float64)."""
    run = config(Path("unused"), "fedavg", seed=1, options={"local_momentum": 0.5})
    engine = build_experiment(run).engine
    jobs = engine.epoch_program(1, jobs=True).send(None).jobs
    assert len(jobs) > 2 and all(job.momentum == 0.5 and job.velocities is None for job in jobs)
    x, y = engine.context.x_train.to(torch.float64), engine.context.y_train
    starts = [in_float64(job.model) for job in jobs]
    models = [copy.deepcopy(start) for start in starts]
    queue = [
        LocalJob(model, job.order, job.lr, momentum=job.momentum, weight_decay=job.weight_decay)
        for model, job in zip(models, jobs)
    ]
    runner = LaneRunner(starts[0], StepTerms(momentum=True), lanes=2, compile=False)
    runner.run([queue[::2], queue[1::2]], x, y, [0, 1], [0, 0])
    trainer = LocalTrainer(x, y)
    for start, model, job in zip(starts, models, jobs):
        alone = copy.deepcopy(start)
        trainer.train_eager(alone, [job.order], 1, job.lr, job.momentum, job.weight_decay)
        assert share_of_movement(state(model), state(alone), state(start)) < 1e-9


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: parameter.detach() for name, parameter in model.named_parameters()}


def test_a_masked_step_leaves_the_velocity_unchanged():
    """A job of 13 momentum steps runs as two calls of 8, the last three steps masked; its
    momentum buffers (given, as Stratify's optimizer keeps them across epochs) end where
    torch's SGD leaves them after the 13 real steps, as do the weights; so does a lane of
    3 steps that then idles for a whole call (float64)."""
    data = load_dataset("digits", device="cpu")
    x = data.x_train.to(torch.float64)
    torch.manual_seed(0)
    start = in_float64(build_model("cnn", data.input_shape, data.num_classes))
    rng = np.random.default_rng(0)
    orders = [rng.integers(0, 1000, size=13), rng.integers(0, 1000, size=3)]
    initial = [[torch.randn_like(p) for p in start.parameters()] for _ in orders]
    models = [copy.deepcopy(start) for _ in orders]
    velocities = [[v.clone() for v in lane] for lane in initial]
    jobs = [
        [LocalJob(model, order, 0.05, momentum=0.5, velocities=buffers)]
        for model, order, buffers in zip(models, orders, velocities)
    ]
    runner = LaneRunner(start, StepTerms(momentum=True), lanes=2, compile=False)
    runner.run(jobs, x, data.y_train, [0, 1], [0, 0])
    for lane, order in enumerate(orders):
        reference = copy.deepcopy(start)
        optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.5)
        for parameter, velocity in zip(reference.parameters(), initial[lane]):
            optimizer.state[parameter]["momentum_buffer"] = velocity.clone()
        for index in order.tolist():
            optimizer.zero_grad()
            loss = F.cross_entropy(reference(x[index : index + 1]), data.y_train[index : index + 1])
            loss.backward()
            optimizer.step()
        for mine, parameter in zip(velocities[lane], reference.parameters()):
            theirs = optimizer.state[parameter]["momentum_buffer"]
            assert torch.allclose(mine, theirs, rtol=0, atol=1e-12), float(
                (mine - theirs).abs().max()
            )
        assert_close(models[lane], reference, 1e-12)


def test_lanes_with_different_step_counts_are_masked():
    """Lanes whose jobs are shorter than the others', empty, or several in a row on one
    model (as SFL's hops are) step at rate 0 once they are done: each job ends where the
    eager loop ends it, and a lane with an empty job leaves its model exactly as it was."""
    data = load_dataset("digits", device="cpu")
    trainer = LocalTrainer(data.x_train, data.y_train)
    torch.manual_seed(0)
    start = build_model("cnn", data.input_shape, data.num_classes)
    anchor = [p.detach().clone() for p in start.parameters()]
    rng = np.random.default_rng(0)
    lengths = [[13], [5, 21], [0], []]  # the steps of each lane's jobs, in order
    orders = [[rng.integers(0, 1000, size=n) for n in jobs] for jobs in lengths]
    lane_models = [build_like(start) for _ in lengths]  # one model per lane, jobs chained
    queues = [
        [LocalJob(model, order, 0.05, term=ProximalGradient(anchor, 0.1)) for order in lane_orders]
        for model, lane_orders in zip(lane_models, orders)
    ]
    runner = LaneRunner(start, StepTerms(proximal=True), lanes=4, compile=False)
    training = TrainingData([(data.x_train, data.y_train)])
    runner.run(queues, training.x, training.y, [0, 1, 2, 3], [0, 0, 0, 0])
    for lane, jobs in enumerate(queues):
        reference = build_like(start)
        for job in jobs:
            result = trainer.train_eager(
                reference, [job.order], 1, 0.05, before_step=ProximalGradient(anchor, 0.1)
            )
            assert job.losses is not None and len(job.losses) == len(job.order)
            assert float(job.losses.sum()) == pytest.approx(result.loss_sum, rel=1e-5, abs=1e-6)
        # lane 0: 13 steps, two calls of 8 with three masked; lane 1: 5 then 21 steps
        assert_close(lane_models[lane], reference, 1e-6)
    for untouched, original in zip(lane_models[2].parameters(), start.parameters()):
        assert torch.equal(untouched, original)


def build_like(model: torch.nn.Module) -> torch.nn.Module:
    clone = build_model("cnn", (1, 8, 8), 10)
    clone.load_state_dict(model.state_dict())
    return clone


def assert_close(model, reference, atol):
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(mine, theirs, atol=atol), float((mine - theirs).abs().max())


def test_a_vectorised_grid_resumed_mid_epoch_equals_an_uninterrupted_one(tmp_path):
    """Ctrl-C in the middle of the second epoch of a vectorised group (FedAvg and
    Stratify lanes); the same command continues every run from its checkpoint to the
    numbers of a grid that was never stopped, bit for bit."""

    def specs(where: str) -> list[RunSpec]:
        return [
            RunSpec(f"{method}-{seed}", config(tmp_path / where / f"{method}-{seed}", method, seed))
            for method in ("stratify", "fedavg")
            for seed in (0, 1)
        ]

    run_specs(specs("straight"), LocalBackend(1), vectorize=4)
    seen = {"epochs": 0}

    def stop_in_epoch_two(event) -> None:
        if getattr(event, "kind", None) == "epoch":
            seen["epochs"] += 1
        elif getattr(event, "kind", None) == "steps" and seen["epochs"] == 4:
            raise KeyboardInterrupt

    with pytest.raises(RunsInterrupted):
        run_specs(specs("stopped"), LocalBackend(1), stop_in_epoch_two, vectorize=4)
    stopped = tmp_path / "stopped"
    assert all(len(records(stopped / s.name)) == 1 for s in specs("stopped"))
    outcomes = run_specs(specs("stopped"), LocalBackend(1), vectorize=4)
    assert [outcome.status for outcome in outcomes] == ["finished"] * 4
    for spec in specs("straight"):
        ours, theirs = stopped / spec.name, tmp_path / "straight" / spec.name
        assert [{k: v for k, v in r.items() if k != "wall_seconds"} for r in records(ours)] == [
            {k: v for k, v in r.items() if k != "wall_seconds"} for r in records(theirs)
        ]
        for key, value in parameters(theirs).items():
            assert torch.equal(parameters(ours)[key], value), (spec.name, key)


def test_runs_that_cannot_share_a_step_run_alone_and_are_named_in_one_line(tmp_path):
    configs = [
        config(tmp_path / "a", seed=0),
        config(tmp_path / "b", seed=1),
        config(tmp_path / "c", "fedavg", mode="batch"),
        config(tmp_path / "d", model="mlp"),
        config(tmp_path / "e", "fedprox"),
    ]
    grouping = plan_groups(configs, 8)
    # the batch-mode run alone; the MLP and FedProx's proximal step have no partner
    assert grouping.groups == [[2], [0, 1], [3], [4]]
    assert grouping.note(8) == (
        "--vectorize 8: 2 runs step in 1 group(s) of 2; 1 run(s) alone (1 batch mode)"
    )
    groups, _ = group_specs([RunSpec(str(i), c) for i, c in enumerate(configs)], 8)
    assert [(group.lanes, group.lane_count) for group in groups] == [
        ((), 1),
        ((0, 1), 2),
        ((), 1),
        ((), 1),
    ]
    assert balanced_chunks(list(range(17)), 8) == [
        list(range(6)),
        list(range(6, 12)),
        list(range(12, 17)),
    ]


def test_vectorize_needs_several_seeds_on_the_command_line(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["train", "--dataset", "digits", "--vectorize", "4"])
    assert caught.value.code == 2
    assert "--vectorize applies to --seeds" in capsys.readouterr().err


@pytest.mark.compile
def test_compiled_lanes_equal_the_run_alone_and_depend_on_nothing_else(tmp_path, monkeypatch):
    """Inductor, a tiny MLP: a run stepped with others equals it alone within float
    rounding, and gives the same bits whichever lane it has and whoever its neighbours
    are."""
    monkeypatch.setattr(stratify.compiled, "_SHARED", {})
    data = load_dataset(
        "synthetic", device="cpu", seed=0, n_train=200, n_test=20, num_features=6, num_classes=3
    )
    trainer = LocalTrainer(data.x_train, data.y_train)
    torch.manual_seed(0)
    start = build_model("mlp", (6,), 3, hidden=(8,))
    rng = np.random.default_rng(1)
    orders = [rng.integers(0, 200, size=40) for _ in range(3)]

    def lanes_run(order_of_lanes):
        models = [copy_model(start) for _ in order_of_lanes]
        runner = LaneRunner(start, StepTerms(), lanes=3, compile=True)
        runner.run(
            [[LocalJob(model, orders[k], 0.05)] for model, k in zip(models, order_of_lanes)],
            data.x_train,
            data.y_train,
            [0, 1, 2],
            [0, 0, 0],
        )
        return {k: model for model, k in zip(models, order_of_lanes)}

    first = lanes_run([0, 1, 2])
    moved = lanes_run([2, 0, 1])
    for k in range(3):
        for a, b in zip(first[k].parameters(), moved[k].parameters()):
            assert torch.equal(a, b)
        alone = copy_model(start)
        trainer.train_eager(alone, [orders[k]], 1, 0.05)
        assert_close(first[k], alone, 1e-5)


def copy_model(model: torch.nn.Module) -> torch.nn.Module:
    clone = build_model("mlp", (6,), 3, hidden=(8,))
    clone.load_state_dict(model.state_dict())
    return clone


def bench_vectorised(tmp_path, *extra: str) -> list[str]:
    path = tmp_path / "steps.json"
    return [
        "bench",
        "steps",
        "--steps",
        "48",
        "--check-every",
        "16",
        "--compile",
        "off",
        "--vectorize",
        "3",
        "--json",
        str(path),
        *extra,
    ]


def test_bench_steps_checks_the_lanes_in_float64(tmp_path, capsys):
    """``bench steps --vectorize``: the lanes, run in float64, end every segment where the
    float64 eager loop does, to float64 rounding."""
    main(bench_vectorised(tmp_path))
    result = json.loads((tmp_path / "steps.json").read_text())
    assert result["weights_match"] is True
    assert result["vectorized_lanes"] == 3
    assert result["vectorized_float64_share"] < 1e-9
    assert "lanes 0/2 checked in float64" in capsys.readouterr().out


def test_bench_steps_fails_a_lane_that_leaves_a_step_out(tmp_path, capsys, monkeypatch):
    """A lane bug (every job's first sample left out of the vectorised lanes) fails the
    benchmark's check: exit 2, one line, ``weights_match`` false."""
    original = stratify.vectorize.padded_blocks

    def leaves_the_first_step_out(order, steps_per_call):
        return original(order[1:], steps_per_call)

    monkeypatch.setattr(stratify.vectorize, "padded_blocks", leaves_the_first_step_out)
    with pytest.raises(SystemExit) as caught:
        main(bench_vectorised(tmp_path))
    assert caught.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "the vectorised lanes, run in float64" in lines[0], lines
    assert json.loads((tmp_path / "steps.json").read_text())["weights_match"] is False
