"""What the `stratify stream` tests share: a small labelled stream and the settings its
runs use, in the library (SETTINGS) and on the command line (FLAGS)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from stratify.stream import StreamConfig

FEATURES = 5
#: the settings shared by every run of a stream in these tests
SETTINGS = {
    "mlp_hidden": (12,),
    "capacity": 8,
    "max_uses": 3,
    "lr": 0.05,
    "eval_every": 50,
    "checkpoint_every": 100,
    "secure": False,
    "device": "cpu",
    "window": 40,
}
#: SETTINGS as `stratify stream` flags
FLAGS = [
    "--mlp-hidden", "12", "--capacity", "8", "--max-uses", "3", "--lr", "0.05",
    "--eval-every", "50", "--checkpoint-every", "100", "--no-secure", "--device", "cpu",
    "--window", "40",
]  # fmt: skip


def event_line(line: int, rng: np.random.Generator, labels=(0, 1, 2, 3)) -> str:
    """An event whose first feature is its line number, so a trained row names its event."""
    label = int(rng.choice(labels))
    x = rng.normal(0, 0.5, FEATURES)
    x[0] = line
    x[1 + label % (FEATURES - 1)] += 3
    return json.dumps({"client": f"c{rng.integers(3)}", "label": label, "x": x.round(5).tolist()})


def stream_config(source: Path | str, out: Path | None, **values) -> StreamConfig:
    """A stream of ``source`` with SETTINGS, overridden by ``values``."""
    settings = {**SETTINGS, **values}
    return StreamConfig(source=str(source), out=None if out is None else str(out), **settings)
