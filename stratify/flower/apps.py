"""The ``ServerApp`` and ``ClientApp`` of a deployment (``flwr run``), and the files the
server app leaves: ``result.json`` and ``weights.pt`` after a run, ``failure.json`` when a
client was lost (docs/flower.md, "Deployed").

The run is set by the app's run configuration (``[tool.flwr.app.config]`` of its
``pyproject.toml``, overridden by ``flwr run --run-config``): ``config``, the JSON of the
:class:`~stratify.config.TrainConfig` values; ``timeout`` and ``retries`` of every
exchange; ``on-lost`` (``stop``, or ``drop``: Stratify's batch mode goes on without a
lost client, and ``result.json`` says which, when and why); ``result-dir``, where the
files go.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from stratify.errors import RegistryError
from stratify.flower.link import ClientLostError
from stratify.flower.messages import config_from_json
from stratify.flower.node import client_app
from stratify.flower.server import FlowerRun, run_on_grid
from stratify.runfolder import write_file

log = logging.getLogger("stratify.flower")


def run_summary(run: FlowerRun) -> dict[str, Any]:
    """What ``result.json`` holds: per epoch the engine's counters, the test accuracy and
    the wall time; the traffic the messages carried."""
    return {
        "config": dataclasses.asdict(run.config),
        "epochs": [
            {
                "transfers": stats.transfers,
                "uploads": stats.uploads,
                "steps": stats.steps,
                "train_loss": stats.train_loss,
                "accuracy": accuracy,
                "seconds": seconds,
            }
            for stats, accuracy, seconds in zip(run.epochs, run.accuracies, run.seconds)
        ],
        "traffic": dataclasses.asdict(run.traffic),
        "dropped": {str(client): lost for client, lost in run.dropped.items()},
    }


def save_run(run: FlowerRun, folder: Path) -> None:
    """``weights.pt`` (the final state) and ``result.json`` (:func:`run_summary`); the
    JSON is written last, so its presence says the run is complete."""
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(run.state, buffer)
    write_file(folder / "weights.pt", buffer.getvalue())
    write_file(folder / "result.json", json.dumps(run_summary(run), indent=1).encode())


def server_main(grid: Grid, context: Context) -> None:
    """Run the configured job; a lost client is reported in the log and ``failure.json``."""
    settings = context.run_config
    config = config_from_json(str(settings["config"]))
    folder = Path(str(settings["result-dir"]))
    try:
        run = run_on_grid(
            grid,
            config,
            timeout=float(settings.get("timeout", 120.0)),  # type: ignore[arg-type]
            retries=int(settings.get("retries", 1)),  # type: ignore[arg-type]
            on_lost=str(settings.get("on-lost", "stop")),
        )
    except (ClientLostError, RegistryError) as lost:  # a registration refused is reported too
        log.error("stratify: the run stopped: %s", lost)
        folder.mkdir(parents=True, exist_ok=True)
        write_file(folder / "failure.json", json.dumps({"error": str(lost)}).encode())
        return
    save_run(run, folder)


def server_app() -> ServerApp:
    """The deployment's ``ServerApp``: :func:`server_main`."""
    app = ServerApp()
    app.main()(server_main)
    return app


__all__ = ["client_app", "save_run", "server_app", "server_main"]
