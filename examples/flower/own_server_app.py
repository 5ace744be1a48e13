"""A ServerApp of one's own that runs Stratify's server logic (docs/flower.md, "From your
own ServerApp"): Flower calls ``main``; it reads the run from the run configuration, runs
it on the grid with :func:`stratify.flower.server.run_on_grid` (the workflow: the
registry, the schedule, every exchange) and does its own thing with the result. Use it
as the app's server component::

    [tool.flwr.app.components]
    serverapp = "own_server_app:app"
    clientapp = "stratify_app:client"
"""

from pathlib import Path

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from stratify.flower.apps import check_run_config
from stratify.flower.server import run_on_grid

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    settings = check_run_config(context.run_config)  # the app's keys, checked
    run = run_on_grid(
        grid,
        settings.config,
        timeout=settings.timeout,
        retries=settings.retries,
        on_lost=settings.on_lost,
    )
    # what this app does with the run: its own files
    folder = Path(settings.result_dir)
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"{epoch} {accuracy:.4f}" for epoch, accuracy in enumerate(run.accuracies, 1)]
    (folder / "accuracy.txt").write_text("\n".join(lines) + "\n")
    torch.save(run.state, folder / "weights.pt")
