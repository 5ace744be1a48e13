"""Stratify on a real Flower deployment on this machine: a SuperLink and two SuperNodes
as separate processes (free ports of 127.0.0.1; TLS and registered node keys for the
FedAvg and Stratify jobs, plain HTTP for the lost node), every node loading its own
client's digits; each job is submitted with ``flwr run`` (docs/flower.md, "Deployed"), as
one is to a SuperLink in simulation mode (a simulation federation).

A deployed run ends with the in-process weights, as a simulated one does
(tests/test_flower.py), so it equals the simulation; a node killed mid-run is reported
by the server app, which stops instead of waiting forever. Every process is stopped.
"""

from __future__ import annotations

import dataclasses
import io
import re
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip(
    "flwr", reason="the flower extra is not installed (pip install -e '.[flower]' in the checkout)"
)

from stratify.config import TrainConfig  # noqa: E402
from stratify.errors import TrainingError  # noqa: E402
from stratify.experiment import build_experiment  # noqa: E402
from stratify.flower.certificates import write_node_key, write_tls_files  # noqa: E402
from stratify.flower.deploy import LocalDeployment, free_port  # noqa: E402
from stratify.method import EpochStats  # noqa: E402

pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parents[1] / "examples" / "flower"
#: float32 sums in another order (docs/flower.md, "Same numbers": 3e-8 measured)
TOLERANCE = 1e-6
#: the waits follow the machine: each is a multiple of one exchange as measured by the
#: first job here (each message starts a fresh ``flwr-clientapp`` that imports torch, a
#: few seconds idle and about 24 s at load 16 on two cores: docs/flower.md, "Wall time"),
#: never under its floor. Until that measure exists a job may take up to FIRST_JOB_WAIT
#: seconds, and each of its exchanges up to FIRST_EXCHANGE_WAIT.
FIRST_EXCHANGE_WAIT = 600.0
FIRST_JOB_WAIT = 1800.0
#: an exchange's timeout: this many measured exchanges, and at least EXCHANGE_FLOOR s
EXCHANGES_PER_TIMEOUT = 5.0
EXCHANGE_FLOOR = 30.0


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


FEDAVG = config("fedavg", local_epochs=1)
STRATIFY = config("stratify", batch_labels=512)


def in_process(config: TrainConfig) -> tuple[dict[str, torch.Tensor], EpochStats]:
    experiment = build_experiment(config)
    stats = experiment.engine.run_epoch(1)
    return experiment.model.state_dict(), stats


def exchange_timeout(exchange: float) -> float:
    """An exchange's timeout on this machine now: :data:`EXCHANGES_PER_TIMEOUT` measured
    exchanges, at least :data:`EXCHANGE_FLOOR` seconds."""
    return max(EXCHANGE_FLOOR, EXCHANGES_PER_TIMEOUT * exchange)


def job_wait(exchange: float, exchanges: int, timeout: float, retries: int) -> float:
    """Seconds a job of ``exchanges`` exchanges may take before the test gives up: each
    exchange a timeout's worth, plus every retry of one that is lost, plus the server
    app's start (two exchanges' worth: it imports torch as a node does)."""
    return (exchanges + 2) * exchange_timeout(exchange) + retries * timeout


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory):
    """The SuperLink over TLS and two SuperNodes that authenticate with registered keys
    (certificates and keys drawn here: a CA, the SuperLink's certificate, a key per node),
    to which the FedAvg and Stratify jobs are submitted."""
    folder = tmp_path_factory.mktemp("tls")
    tls = write_tls_files(folder / "tls")
    keys = [folder / f"supernode-{client}.key" for client in range(STRATIFY.clients)]
    for key in keys:
        write_node_key(key)
    with LocalDeployment(STRATIFY.clients, tls=tls, node_keys=keys) as started:
        yield started
    for process in started.processes.values():
        assert process.poll() is not None, "every process started is stopped"


@pytest.fixture(scope="module")
def fedavg_run(deployment: LocalDeployment, tmp_path_factory: pytest.TempPathFactory):
    """The deployed FedAvg job (one round, each client training in turn: one exchange
    each), the first job here: its round measures an exchange on this machine now."""
    folder = tmp_path_factory.mktemp("fedavg")
    deployment.submit(APP, FEDAVG, folder, timeout=FIRST_EXCHANGE_WAIT)
    return folder, deployment.wait(folder, FIRST_JOB_WAIT)


@pytest.fixture(scope="module")
def exchange(fedavg_run: tuple[Path, dict]) -> float:
    """Seconds one exchange took in the first job: its round over its exchanges."""
    _, result = fedavg_run
    assert result["file"] == "result.json", result
    return result["epochs"][0]["seconds"] / FEDAVG.clients


def check_weights(folder: Path, result: dict, job: TrainConfig) -> None:
    assert result["file"] == "result.json", result
    weights = torch.load(io.BytesIO((folder / "weights.pt").read_bytes()), weights_only=True)
    state, stats = in_process(job)
    difference = max(float((state[key] - weights[key]).abs().max()) for key in state)
    assert difference < TOLERANCE
    assert result["traffic"]["transfers"] == stats.transfers == result["epochs"][0]["transfers"]


def test_a_deployed_fedavg_run_ends_with_the_in_process_weights(
    fedavg_run: tuple[Path, dict],
) -> None:
    check_weights(*fedavg_run, FEDAVG)


def test_a_deployed_stratify_run_ends_with_the_in_process_weights_and_admits_no_stranger(
    deployment: LocalDeployment, tmp_path: Path, exchange: float
) -> None:
    timeout = exchange_timeout(exchange)
    # a SuperNode with no registered key, which would register itself (admitted, it would
    # be a second client 1 and the run would stop)
    assert deployment.tls is not None
    refused = deployment.start(
        "stranger",
        "flower-supernode",
        "--root-certificates",
        str(deployment.tls.ca),
        "--superlink",
        f"127.0.0.1:{deployment.port}",
        "--port",
        str(free_port()),
        "--node-config",
        "partition-id=1",
    )
    deployment.submit(APP, STRATIFY, tmp_path, timeout=timeout, retries=1)
    # the hello, the plain registry's placeholders, then one exchange per global batch
    exchanges = 2 + in_process(STRATIFY)[1].steps
    result = deployment.wait(tmp_path, job_wait(exchange, exchanges, timeout, 1))
    assert refused.wait(exchange_timeout(exchange)) != 0, "an unregistered node joined"
    check_weights(tmp_path, result, STRATIFY)


def test_a_node_lost_mid_run_is_reported_and_the_run_stops(tmp_path: Path, exchange: float) -> None:
    """Node 1 stops between two rounds, its first round's reply sent: the server asks it
    twice in the next round and stops naming client 1 (what Flower answers in between,
    silence, its Node Unavailable error or a refused push, depends on how far the node's
    shutdown got: tests/test_flower_link.py checks each)."""
    job = dataclasses.replace(FEDAVG, epochs=20)
    timeout = exchange_timeout(exchange)
    with LocalDeployment(2) as deployment:
        log = deployment.folder / "supernode-1.log"
        deployment.submit(APP, job, tmp_path, timeout=timeout, retries=1)
        # node 1 trains in the first round's second exchange, after the hello and node 0's;
        # it is stopped once its reply is sent, between two rounds
        deadline = time.monotonic() + job_wait(exchange, 3, timeout, 0)
        while not re.search(
            r"Sending: train message.*\n(.*\n)*?.*Sent successfully", log.read_text()
        ):
            assert time.monotonic() < deadline, "node 1 never trained"
            assert not (tmp_path / "failure.json").exists(), (tmp_path / "failure.json").read_text()
            time.sleep(0.2)
        deployment.stop("supernode-1")
        # node 0's next round, then node 1's request and its retry
        result = deployment.wait(tmp_path, job_wait(exchange, 1, timeout, 2))
    assert result["file"] == "failure.json", result
    assert "client 1" in result["error"] and "sent 2 times" in result["error"], result
    assert all(process.poll() is not None for process in deployment.processes.values())


def test_waiting_on_a_job_ends_when_its_superlink_has_exited(tmp_path: Path) -> None:
    """The SuperLink, which runs the server app, is killed while a job is under way: the
    wait says so at once rather than waiting out its timeout for a result nothing can
    write any more. (The SuperLink has exited when ``stop`` returns, so the answer does
    not depend on the machine's speed; a wait that ignored it would end after the timeout,
    with another message.)"""
    with LocalDeployment(2) as deployment:
        deployment.submit(APP, dataclasses.replace(FEDAVG, epochs=20), tmp_path, timeout=60.0)
        deployment.stop("superlink")
        with pytest.raises(TrainingError, match=r"the SuperLink exited \(code -?\d+\)"):
            deployment.wait(tmp_path, 120.0)
    assert all(process.poll() is not None for process in deployment.processes.values())


def test_flwr_run_against_a_simulation_federation_ends_with_the_in_process_weights(
    tmp_path: Path,
) -> None:
    # a SuperLink in simulation mode: `flwr run` simulates the nodes in a Ray cluster
    with LocalDeployment(STRATIFY.clients, simulation=True) as simulation:
        simulation.submit(APP, STRATIFY, tmp_path, timeout=FIRST_EXCHANGE_WAIT)
        result = simulation.wait(tmp_path, FIRST_JOB_WAIT)
        assert not any(name.startswith("supernode") for name in simulation.processes)
    check_weights(tmp_path, result, STRATIFY)


def test_a_server_app_of_ones_own_runs_stratify_through_run_on_grid(tmp_path: Path) -> None:
    # a user's app folder: Stratify's client app, their own server app
    app = tmp_path / "app"
    app.mkdir()
    for name in ("stratify_app.py", "own_server_app.py"):
        (app / name).write_text((APP / name).read_text())
    project = (APP / "pyproject.toml").read_text()
    assert 'serverapp = "stratify_app:server"' in project
    (app / "pyproject.toml").write_text(
        project.replace('serverapp = "stratify_app:server"', 'serverapp = "own_server_app:app"')
    )
    out = tmp_path / "out"
    with LocalDeployment(STRATIFY.clients, simulation=True) as simulation:
        simulation.submit(app, STRATIFY, out, timeout=FIRST_EXCHANGE_WAIT)
        deadline = time.monotonic() + FIRST_JOB_WAIT
        while not (out / "accuracy.txt").exists():  # the app's last file
            assert time.monotonic() < deadline, "the server app wrote no accuracy.txt"
            assert not (out / "result.json").exists(), "Stratify's own server app ran"
            time.sleep(0.5)
    weights = torch.load(io.BytesIO((out / "weights.pt").read_bytes()), weights_only=True)
    state, _ = in_process(STRATIFY)
    assert max(float((state[key] - weights[key]).abs().max()) for key in state) < TOLERANCE
    assert re.fullmatch(r"1 [01]\.\d{4}\n", (out / "accuracy.txt").read_text())
