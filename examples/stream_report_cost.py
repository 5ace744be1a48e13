"""What reporting costs a stream: the same 10,000 events with a metrics line after every
event (``--eval-every 1``) and after every 1,000, through a run folder.

Metrics are appended (one line per report, synced at most once a second), so reporting
after every event should cost less than twice the time of reporting rarely::

    python examples/stream_report_cost.py            # prints one line per setting and the ratio
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from stratify.stream import StreamConfig
from stratify.stream.run import StreamRun


def write_events(path: Path, count: int, features: int, seed: int) -> None:
    """Three Gaussian clusters over five clients, one JSON line per event."""
    rng = np.random.default_rng(seed)
    with path.open("w") as handle:
        for number in range(count):
            label = int(rng.integers(3))
            x = rng.normal(0.0, 1.0, features)
            x[label] += 2.0
            event = {"client": f"c{number % 5}", "label": label, "x": x.round(4).tolist()}
            handle.write(json.dumps(event) + "\n")


def timed_run(source: Path, out: Path, eval_every: int) -> float:
    config = StreamConfig(
        source=str(source),
        out=str(out),
        eval_every=eval_every,
        secure=False,
        device="cpu",
    )
    start = time.perf_counter()
    StreamRun(config).run()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--features", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "events.jsonl"
        write_events(source, args.events, args.features, args.seed)
        seconds = {}
        for every in (1000, 1):
            seconds[every] = timed_run(source, Path(folder) / f"every-{every}", every)
            lines = len(
                (Path(folder) / f"every-{every}" / "metrics.jsonl").read_text().splitlines()
            )
            print(f"--eval-every {every}: {args.events:,} events, {lines:,} metrics lines, "
                  f"{seconds[every]:.2f} s")  # fmt: skip
    ratio = seconds[1] / seconds[1000]
    print(f"reporting after every event costs {ratio:.2f}x the time of every 1,000 events")
    return ratio


if __name__ == "__main__":
    main()
