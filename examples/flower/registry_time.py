"""Wall time of the encrypted registry's registration in-process and over Flower's
simulation, for the same clients and registry secret (docs/flower.md, "Wall time"),
with the messages it took.

    python examples/flower/registry_time.py [repeats]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from stratify.config import TrainConfig
from stratify.experiment import build_experiment
from stratify.flower.keys import write_federation_keys
from stratify.flower.messages import SECURE_PROTOCOLS
from stratify.flower.simulation import simulate
from stratify.registry import RegistrySecrets
from stratify.registry.ckks import CKKSRegistry


def job(protocol: str, secure: bool = True) -> TrainConfig:
    return TrainConfig(
        dataset="digits",
        clients=3,
        partition="dirichlet:0.5",
        mode="batch",
        algorithm="stratify",
        epochs=1,
        secure=secure,
        protocol=protocol,
        seed=3,
        device="cpu",
        options={"batch_labels": 128},
    )


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "keys.json"
        keys = write_federation_keys(path)
        # a plain run first, so that Ray's start-up is in none of the timed runs
        configs = [job("packed-blind", secure=False)]
        configs += [job(protocol) for _ in range(repeats) for protocol in SECURE_PROTOCOLS]
        runs = simulate(configs, keys=path, record=True)[1:]
    counts = build_experiment(job("packed", secure=False)).federation.label_counts()
    print("| protocol | in-process (median) | Flower simulation (median) | messages |")
    print("|---|---|---|---|")
    for protocol in SECURE_PROTOCOLS:
        local = []
        for _ in range(repeats):
            registry = CKKSRegistry(protocol=protocol, secrets=RegistrySecrets(keys.secrets))
            registry.roles()  # key generation is not the registration's
            start = time.perf_counter()
            registry.register(counts, num_classes=10)
            local.append(time.perf_counter() - start)
        flower = [run for run in runs if run.config.protocol == protocol]
        seconds = [run.registration_seconds for run in flower]
        assert flower[0].payloads is not None
        sent = Counter(
            kind
            for direction, kind, _ in flower[0].payloads
            if direction == "sent" and kind.startswith("query.") and kind != "query.hello"
        )
        print(
            f"| {protocol} | {statistics.median(local):.3f} s | {statistics.median(seconds):.2f} s "
            f"| {dict(sent)} |"
        )


if __name__ == "__main__":
    main()
