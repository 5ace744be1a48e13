"""Wall time per round of one job in-process, in Flower's simulation and deployed on this
machine (docs/flower.md, "Wall time"), and how far each run's final weights are from the
in-process run's, and the deployment's seconds per round over the simulation's.

    python examples/flower/compare_runtimes.py [stratify|fedavg|stratify-sumbn] [rounds]

``stratify-sumbn`` is Stratify's batch mode on ResNet-20 with the sum-based BatchNorm
(512 placeholders a global batch): in-process and in simulation only, its 39 exchanges
per global batch would take a deployment on this machine the better part of an hour.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from stratify.config import TrainConfig
from stratify.experiment import build_experiment
from stratify.flower.deploy import LocalDeployment
from stratify.flower.simulation import simulate

APP = Path(__file__).resolve().parent


def job(name: str, rounds: int) -> TrainConfig:
    options: dict = {"batch_labels": 128} if name == "stratify" else {"local_epochs": 1}
    model: dict = {}
    if name == "stratify-sumbn":
        options = {"batch_labels": 512}
        model = {"model": "resnet20", "norm": "sumbn"}
    return TrainConfig(
        dataset="digits",
        clients=3,
        partition="dirichlet:0.5",
        mode="batch",
        algorithm=name.removesuffix("-sumbn"),
        epochs=rounds,
        secure=False,
        seed=3,
        device="cpu",
        options=options,
        **model,
    )


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[key] - b[key]).abs().max()) for key in a)


def main() -> None:
    algorithm = sys.argv[1] if len(sys.argv) > 1 else "fedavg"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    config = job(algorithm, rounds)
    torch.set_num_threads(1)  # as the simulation's and deployment's nodes compute
    experiment = build_experiment(config)
    seconds = []
    for epoch in range(1, rounds + 1):
        start = time.perf_counter()
        experiment.engine.run_epoch(epoch)
        seconds.append(time.perf_counter() - start)
    reference = experiment.model.state_dict()
    rows = [("in-process", seconds, 0.0)]
    exchanges: list[int] = []
    (simulated,) = simulate([config])
    rows.append(
        ("Flower simulation", simulated.seconds, largest_difference(reference, simulated.state))
    )
    if config.norm != "sumbn":
        with tempfile.TemporaryDirectory() as folder, LocalDeployment(config.clients) as deployment:
            deployment.submit(APP, config, Path(folder), timeout=120.0)
            result = deployment.wait(Path(folder), 1800.0)
            weights = torch.load(Path(folder) / "weights.pt", weights_only=True)
        deployed = [epoch["seconds"] for epoch in result["epochs"]]
        # Stratify's batch mode sends one exchange per global batch (one step each)
        exchanges.extend(epoch["steps"] for epoch in result["epochs"])
        rows.append(("Flower deployment", deployed, largest_difference(reference, weights)))
    print(f"{algorithm}, {rounds} rounds, digits, 3 clients")
    print("| run | s/round (median) | rounds | max |w - w_in-process| |")
    print("|---|---|---|---|")
    for name, times, difference in rows:
        print(f"| {name} | {statistics.median(times):.3f} | {len(times)} | {difference:.1e} |")
    if len(rows) == 3:
        # the deployment's cost against the simulation's, per round (docs/flower.md)
        ratio = statistics.median(rows[2][1]) / statistics.median(rows[1][1])
        print(f"deployed / simulated seconds per round: {ratio:.0f}x")
        if config.algorithm == "stratify":
            per_exchange = statistics.median(t / n for t, n in zip(rows[2][1], exchanges))
            print(
                f"deployed: {statistics.median(exchanges):g} exchanges per epoch (one per global "
                f"batch), {per_exchange:.2f} s per exchange"
            )


if __name__ == "__main__":
    main()
