"""A secure Stratify job deployed on this machine: a SuperLink and two SuperNodes, each
node loading the federation key file from its ``--node-config`` (docs/flower.md, "The
encrypted registry") and keeping its own order key in a node-local file; its final
weights against the in-process run's with the same shared secret and order keys, and its
wall time.

    python examples/flower/secure_deployment.py [packed-blind|packed]
"""

from __future__ import annotations

import io
import sys
import tempfile
import time
from pathlib import Path

import torch

from stratify.config import TrainConfig
from stratify.experiment import build_experiment
from stratify.flower.deploy import LocalDeployment
from stratify.flower.keys import write_federation_keys
from stratify.registry import RegistrySecrets, make_registry
from stratify.registry.client_secrets import node_order_key

APP = Path(__file__).resolve().parent


def main() -> None:
    protocol = sys.argv[1] if len(sys.argv) > 1 else "packed-blind"
    job = TrainConfig(
        dataset="digits",
        clients=2,
        partition="dirichlet:0.5",
        mode="batch",
        algorithm="stratify",
        epochs=1,
        secure=True,
        protocol=protocol,
        seed=3,
        device="cpu",
        options={"batch_labels": 512},
    )
    with tempfile.TemporaryDirectory() as folder:
        keys = write_federation_keys(Path(folder) / "keys.json")
        out = Path(folder) / "out"
        orders = Path(folder) / "order-keys"
        orders.mkdir()
        with LocalDeployment(
            job.clients, registry_keys=Path(folder) / "keys.json", order_keys=orders
        ) as deployment:
            start = time.perf_counter()
            deployment.submit(APP, job, out, timeout=120.0)
            result = deployment.wait(out, 900.0)
            seconds = time.perf_counter() - start
        if result["file"] != "result.json":
            raise SystemExit(f"the job failed: {result['error']}")
        weights = torch.load(io.BytesIO((out / "weights.pt").read_bytes()), weights_only=True)
        # each node's own order key, read here only to rerun the job in-process
        order_keys = {k: node_order_key(orders / f"client-{k}.json") for k in range(job.clients)}
    secrets = RegistrySecrets(keys.secrets, order_keys)
    registry = make_registry(True, job.seed, protocol, secrets=secrets)
    experiment = build_experiment(job, registry=registry)
    experiment.engine.run_epoch(1)
    reference = experiment.model.state_dict()
    difference = max(float((reference[key] - weights[key]).abs().max()) for key in reference)
    print(f"{protocol}, digits, 2 clients, 1 epoch, --batch-labels 512, deployed on localhost")
    print(
        f"submission to result: {seconds:.1f} s, the epoch: {result['epochs'][0]['seconds']:.1f} s"
    )
    print(f"messages sent by the server: {result['traffic']['messages']}")
    print(f"max |w - w_in-process|: {difference:.1e}")


if __name__ == "__main__":
    main()
