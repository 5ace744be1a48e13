"""Stratify on a real Flower deployment on this machine: a SuperLink and two SuperNodes
as separate processes (insecure, free ports of 127.0.0.1), every node loading its own
client's digits; each job is submitted with ``flwr run`` (docs/flower.md, "Deployed").

A deployed run ends with the in-process weights, as a simulated one does
(tests/test_flower.py), so it equals the simulation; a node killed mid-run is reported
by the server app, which stops instead of waiting forever. Every process is stopped.
"""

from __future__ import annotations

import dataclasses
import io
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip(
    "flwr", reason="the flower extra is not installed (pip install 'stratify[flower]')"
)

from stratify.config import TrainConfig  # noqa: E402
from stratify.experiment import build_experiment  # noqa: E402
from stratify.flower.deploy import LocalDeployment  # noqa: E402

pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parents[1] / "examples" / "flower"
#: a job's whole run, submission to result.json (each message starts a client app process)
JOB_TIMEOUT = 240.0
TOLERANCE = 1e-5


def config(algorithm: str, **options: object) -> TrainConfig:
    return TrainConfig(
        dataset="digits",
        clients=2,
        partition="dirichlet:0.5",
        mode="batch",
        algorithm=algorithm,
        epochs=1,
        secure=False,
        seed=3,
        device="cpu",
        options=options,
    )


def in_process(config: TrainConfig) -> tuple[dict[str, torch.Tensor], int]:
    experiment = build_experiment(config)
    stats = experiment.engine.run_epoch(1)
    return experiment.model.state_dict(), stats.transfers


@pytest.fixture(scope="module")
def deployment():
    with LocalDeployment(2) as started:
        yield started
    for process in started.processes.values():
        assert process.poll() is not None, "every process started is stopped"


@pytest.mark.parametrize(
    "job", [config("stratify", batch_labels=512), config("fedavg", local_epochs=1)]
)
def test_a_deployed_run_ends_with_the_in_process_weights(
    deployment: LocalDeployment, tmp_path: Path, job: TrainConfig
) -> None:
    deployment.submit(APP, job, tmp_path, timeout=60.0)
    result = deployment.wait(tmp_path, JOB_TIMEOUT)
    assert result["file"] == "result.json", result
    weights = torch.load(io.BytesIO((tmp_path / "weights.pt").read_bytes()), weights_only=True)
    state, transfers = in_process(job)
    difference = max(float((state[key] - weights[key]).abs().max()) for key in state)
    assert difference < TOLERANCE
    assert result["traffic"]["transfers"] == transfers == result["epochs"][0]["transfers"]


def test_a_node_lost_mid_run_is_reported_and_the_run_stops(tmp_path: Path) -> None:
    job = dataclasses.replace(config("fedavg", local_epochs=1), epochs=20)
    with LocalDeployment(2) as deployment:
        log = deployment.folder / "supernode-1.log"
        deployment.submit(APP, job, tmp_path, timeout=20.0, retries=1)
        deadline = time.monotonic() + JOB_TIMEOUT
        while "Sending: train message" not in log.read_text():
            assert time.monotonic() < deadline, "node 1 never trained"
            assert not (tmp_path / "failure.json").exists(), (tmp_path / "failure.json").read_text()
            time.sleep(0.2)
        deployment.stop("supernode-1")
        result = deployment.wait(tmp_path, JOB_TIMEOUT)
    assert result["file"] == "failure.json"
    assert "client 1" in result["error"] and "sent 2 times" in result["error"]
    assert all(process.poll() is not None for process in deployment.processes.values())
