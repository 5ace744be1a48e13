"""The ``ServerApp`` and ``ClientApp`` of a deployment (``flwr run``), and the files the
server app leaves: ``result.json`` and ``weights.pt`` after a run, ``failure.json`` when a
client was lost (docs/flower.md, "Deployed").

The run is set by the app's run configuration (``[tool.flwr.app.config]`` of its
``pyproject.toml``, overridden by ``flwr run --run-config``): one key per setting
(:mod:`stratify.flower.run_config`: ``epochs``, ``lr``, ``stratify.batch-labels``, …);
``timeout`` and ``retries`` of every exchange; ``on-lost`` (``stop``, or ``drop``:
Stratify's batch mode goes on without a lost client, and ``result.json`` says which, when
and why); ``result-dir``, where the files go. :func:`check_run_config` checks all of it
before any message is sent; a value refused is one line in the log and in
``failure.json``, and the run fails.
"""

from __future__ import annotations

import dataclasses
import difflib
import io
import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from stratify.config import TrainConfig
from stratify.errors import ConfigError, RegistryError, StratifyError
from stratify.flower.link import ClientLostError
from stratify.flower.messages import check_flower_config
from stratify.flower.node import client_app
from stratify.flower.run_config import train_config_of, train_keys
from stratify.flower.secure_sum import SecAggSettings
from stratify.flower.server import ON_LOST, FlowerRun, check_secagg, run_on_grid
from stratify.runfolder import write_file

log = logging.getLogger("stratify.flower")

#: the keys of how the run is carried out (examples/flower/pyproject.toml) and their
#: defaults (docs/flower.md, "A client that does not answer"); ``result-dir`` has none
RUN_DEFAULTS: dict[str, Any] = {"timeout": 120.0, "retries": 1, "on-lost": "stop"}
#: secure aggregation of batch shares (docs/flower.md, "Secure aggregation"): off unless
#: ``secagg = true``; its parameters default to :class:`SecAggSettings`'s
SECAGG_KEYS = {
    "secagg-num-shares": ("num_shares", float),
    "secagg-reconstruction-threshold": ("reconstruction_threshold", float),
    "secagg-clipping-range": ("clipping_range", float),
    "secagg-quantization-range": ("quantization_range", int),
}
#: every key of the run configuration: the run's settings, then how it is carried out
RUN_KEYS = (*train_keys(), "result-dir", *RUN_DEFAULTS, "secagg", *SECAGG_KEYS)
#: seconds one exchange may wait at most: a day, so a silent node ends a run (``inf``
#: waited for ever) while the slowest exchange (a node's local epochs) has room
MAX_TIMEOUT = 86_400.0
#: times a request may be sent again at most: more only delays the verdict on a lost node
MAX_RETRIES = 10


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """A checked run configuration (:func:`check_run_config`).

    Attributes
    ----------
    config : TrainConfig
        The run.
    result_dir : Path
        Where the server app writes its files.
    timeout : float
        Seconds each exchange waits, in (0, :data:`MAX_TIMEOUT`].
    retries : int
        Times an unanswered request is sent again, 0 to :data:`MAX_RETRIES`.
    on_lost : {"stop", "drop"}
        What a lost client does to the run.
    secagg : SecAggSettings or None
        SecAgg+ of every global batch's shares (``secagg = true``), or none.
    """

    config: TrainConfig
    result_dir: Path
    timeout: float
    retries: int
    on_lost: str
    secagg: SecAggSettings | None = None


def check_result_dir(value: Any) -> Path:
    """The run configuration's ``result-dir``: a non-empty text naming a folder (or
    nothing yet).

    Parameters
    ----------
    value : Any
        The value the run configuration holds (``None`` when missing).

    Raises
    ------
    ConfigError
        One line saying what is wrong.
    """
    if value is None:
        raise ConfigError('the run configuration has no result-dir: give result-dir="FOLDER"')
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"result-dir must name a folder, got {value!r}")
    folder = Path(value)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"result-dir {value} is not a folder")
    return folder


def _number(value: Any, key: str, kind: type) -> Any:
    """``value`` as ``kind`` (a TOML number, or a text holding one); bools are refused
    (TOML's ``true`` is no timeout)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{key} must be a number, got {value!r}")
    try:
        number = kind(value)
    except (ValueError, OverflowError):
        raise ConfigError(f"{key} must be a number, got {value!r}") from None
    if kind is int and isinstance(value, float) and number != value:
        raise ConfigError(f"{key} must be a whole number, got {value!r}")
    return number


def check_run_config(settings: Mapping[str, Any]) -> RunSettings:
    """The server app's run configuration, checked before any message is sent.

    Parameters
    ----------
    settings : mapping
        ``context.run_config``: the run's settings, one key each
        (:func:`~stratify.flower.run_config.train_config_of`), ``result-dir``, and
        optionally ``timeout`` (seconds, finite, in (0,
        :data:`MAX_TIMEOUT`]), ``retries`` (0 to :data:`MAX_RETRIES`) and ``on-lost``
        (``stop`` or ``drop``; ``drop`` in Stratify's batch mode only), ``secagg``
        (true: SecAgg+ of every global batch's shares) with its ``secagg-*``
        parameters.

    Returns
    -------
    RunSettings
        The checked values, the defaults filled in.

    Raises
    ------
    ConfigError
        One line naming the first key refused and why.
    """
    unknown = sorted(set(settings) - set(RUN_KEYS))
    if unknown:
        close = difflib.get_close_matches(unknown[0], RUN_KEYS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"the run configuration has no key {unknown[0]!r}{hint}; docs/flower.md "
            "(Run configuration) lists its keys"
        )
    result_dir = check_result_dir(settings.get("result-dir"))
    values = {**RUN_DEFAULTS, **settings}
    timeout = float(_number(values["timeout"], "timeout", float))
    if not math.isfinite(timeout) or not 0 < timeout <= MAX_TIMEOUT:
        raise ConfigError(
            f"timeout must be seconds in (0, {MAX_TIMEOUT:,.0f}] (a day), got {values['timeout']!r}"
        )
    retries = int(_number(values["retries"], "retries", int))
    if not 0 <= retries <= MAX_RETRIES:
        raise ConfigError(f"retries must be 0 to {MAX_RETRIES}, got {values['retries']!r}")
    on_lost = values["on-lost"]
    if on_lost not in ON_LOST:
        raise ConfigError(f"on-lost must be one of {', '.join(ON_LOST)}, not {on_lost!r}")
    config = train_config_of(settings)
    check_flower_config(config)
    if on_lost == "drop" and (config.algorithm != "stratify" or config.mode != "batch"):
        raise ConfigError(
            "on-lost drop goes on without a lost client in Stratify's batch mode only; "
            f"{config.algorithm} in {config.mode} mode stops (on-lost stop)"
        )
    secagg = secagg_settings(settings)
    if secagg is not None:
        check_secagg(config, secagg, on_lost)
    return RunSettings(config, result_dir, timeout, retries, on_lost, secagg)


def secagg_settings(settings: Mapping[str, Any]) -> SecAggSettings | None:
    """The run configuration's SecAgg+ settings: ``None`` unless ``secagg`` is true (its
    ``secagg-*`` parameters are then unused: the app's ``pyproject.toml`` declares them
    all, so they are always there)."""
    enabled = settings.get("secagg", False)
    if not isinstance(enabled, bool):
        raise ConfigError(f"secagg must be true or false, got {enabled!r}")
    if not enabled:
        return None
    values = {
        field: _number(settings[key], key, kind)
        for key, (field, kind) in SECAGG_KEYS.items()
        if key in settings
    }
    return SecAggSettings(**values)


def write_failure(folder: Path, error: StratifyError) -> None:
    """``failure.json`` in ``folder``: the one line that stopped the run."""
    folder.mkdir(parents=True, exist_ok=True)
    write_file(folder / "failure.json", json.dumps({"error": str(error)}).encode())


def run_summary(run: FlowerRun) -> dict[str, Any]:
    """What ``result.json`` holds: per epoch the engine's counters, the test accuracy and
    the wall time; the traffic the messages carried; with DP, the (ε, δ) spent."""
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
        "secagg": run.secagg,
        "withheld": run.withheld,
        # with DP, the (ε, δ) spent, as an in-process run's summary has it
        **({"privacy": run.privacy} if run.privacy is not None else {}),
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
    """Run the configured job; a lost client is reported in the log and ``failure.json``.

    A run configuration :func:`check_run_config` refuses sends no message: its one line
    goes to the log and to ``failure.json`` (when ``result-dir`` itself is usable), and
    the :class:`~stratify.errors.ConfigError` is raised, so Flower ends the run as failed
    with that line and ``flwr-serverapp`` exits non-zero; so is a refusal only the grid
    shows (two nodes claiming one client), after the messages that found it.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        The grid Flower gives the app.
    context : flwr.app.Context
        Its ``run_config`` holds the run configuration.
    """
    settings = context.run_config
    try:
        checked = check_run_config(settings)
    except ConfigError as refused:
        log.error("stratify: run configuration refused: %s", refused)
        try:
            folder = check_result_dir(settings.get("result-dir"))
            write_failure(folder, refused)
        except (OSError, StratifyError) as unwritable:
            # the refusal is the news; a result-dir that cannot hold it only adds a line
            log.error("stratify: no failure.json written: %s", unwritable)
        raise
    try:
        run = run_on_grid(
            grid,
            checked.config,
            timeout=checked.timeout,
            retries=checked.retries,
            on_lost=checked.on_lost,
            secagg=checked.secagg,
        )
    except (ClientLostError, RegistryError) as lost:  # a registration refused is reported too
        log.error("stratify: the run stopped: %s", lost)
        write_failure(checked.result_dir, lost)
        return
    except ConfigError as refused:  # what only the grid shows, e.g. two nodes one client
        log.error("stratify: the run stopped: %s", refused)
        write_failure(checked.result_dir, refused)
        raise
    save_run(run, checked.result_dir)


def server_app() -> ServerApp:
    """The deployment's ``ServerApp``: :func:`server_main`."""
    app = ServerApp()
    app.main()(server_main)
    return app


__all__ = [
    "RunSettings",
    "check_run_config",
    "client_app",
    "save_run",
    "server_app",
    "server_main",
]
