"""What SecAgg+ of batch shares costs: one Flower simulation of Stratify's batch mode on
digits (four Dirichlet(0.5) clients, the MLP, ``--batch-labels 64 --min-share 8``, one
epoch), run without and with SecAgg+ ``--repeat`` times each, alternately; one JSON line a
run: seconds per epoch and per global batch, messages, and the bytes the server app sent
and received (docs/flower.md, "Secure aggregation").

``python -m stratify.flower.secagg_cost [--repeat 2]``
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from flwr.app import RecordDict

from stratify.config import TrainConfig
from stratify.flower.secure_sum import SecAggSettings
from stratify.flower.simulation import simulate


def job(seed: int = 3) -> TrainConfig:
    """The measured job."""
    return TrainConfig(
        dataset="digits",
        clients=4,
        partition="dirichlet:0.5",
        mode="batch",
        model="mlp",
        lr=0.3,
        secure=False,
        seed=seed,
        device="cpu",
        epochs=1,
        options={"batch_labels": 64, "min_share": 8},
    )


def payload_bytes(content: RecordDict) -> int:
    """The bytes of a message's arrays, texts and byte strings (8 a number)."""
    total = 0
    for arrays in content.array_records.values():
        total += sum(len(array.data) for array in arrays.values())
    for config in content.config_records.values():
        for value in config.values():
            for item in value if isinstance(value, list) else [value]:
                total += len(item) if isinstance(item, (bytes, str)) else 8
    return total


def measure(repeat: int = 2) -> list[dict[str, Any]]:
    """Run the job ``repeat`` times without and with SecAgg+, alternately.

    Parameters
    ----------
    repeat : int
        Runs of each setting.
    """
    settings = [None, SecAggSettings()] * repeat
    runs = simulate([job()] * len(settings), timeout=300, record=True, secagg=settings)
    rows = []
    for secagg, run in zip(settings, runs):
        assert run.payloads is not None and run.batches is not None
        batches = len(run.batches)
        rows.append(
            {
                "secagg": secagg is not None,
                "epoch_s": run.seconds[0],
                "batches": batches,
                "batch_s": run.seconds[0] / batches,
                "messages": run.traffic.messages,
                "sent_bytes": sum(payload_bytes(c) for d, _, c in run.payloads if d == "sent"),
                "received_bytes": sum(
                    payload_bytes(c) for d, _, c in run.payloads if d == "received"
                ),
                "accuracy": run.accuracies[0],
                "withheld": run.withheld,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2, help="runs of each setting")
    for row in measure(parser.parse_args(argv).repeat):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
