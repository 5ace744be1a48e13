"""Flower's simulation runtime: the server app and one node per client in this process's
Ray cluster (docs/flower.md, "In Flower's simulation")."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from stratify.config import TrainConfig
from stratify.errors import ConfigError
from stratify.flower.messages import check_flower_config
from stratify.flower.node import client_app
from stratify.flower.secure_sum import SecAggSettings
from stratify.flower.server import FlowerRun, check_secagg, run_on_grid


def ray_init_args(cpus: int) -> dict[str, Any]:
    """The arguments the simulation's Ray cluster starts with (``ray.init``).

    Parameters
    ----------
    cpus : int
        CPUs the cluster may use.
    """
    return {
        "num_cpus": cpus,
        "logging_level": logging.ERROR,
        "log_to_driver": False,
        # Ray renices its workers by +15: beside two busy processes on two cores a node
        # got a few percent of a core and a run's first exchange timed out after 300 s
        # (docs/flower.md, "In Flower's simulation"); the nodes keep this process's priority
        "_system_config": {"worker_niceness": 0},
    }


def simulate(
    configs: Sequence[TrainConfig],
    *,
    timeout: float = 120.0,
    retries: int = 1,
    cpus: int = 2,
    keys: str | os.PathLike | None = None,
    record: bool = False,
    order_keys: str | os.PathLike | None = None,
    secagg: SecAggSettings | Sequence[SecAggSettings | None] | None = None,
) -> list[FlowerRun]:
    """Run every configuration in ``configs``, one after another, in one Flower simulation
    (the Ray cluster starts once); all of them must have the same number of clients.

    Parameters
    ----------
    configs : sequence of TrainConfig
        The runs (plain registry; see :func:`~stratify.flower.server.run_on_grid`).
    timeout, retries : float, int
        Of every exchange of messages (:class:`~stratify.flower.link.NodeLink`).
    cpus : int
        CPUs the simulation's Ray cluster may use (each node takes one while it works).
    keys : path, optional
        The federation key file every node loads for the secure runs
        (:func:`~stratify.flower.keys.write_federation_keys`); the server never reads it.
    record : bool
        Keep every message the server sends and receives (:attr:`FlowerRun.payloads`).
    order_keys : path, optional
        A folder of the nodes' own order-key files (``client-K.json``, read or drawn and
        written 0600; :func:`~stratify.flower.node.client_app`); default: each node draws
        its own in memory.
    secagg : SecAggSettings or sequence, optional
        Sum every global batch's shares with Flower's SecAgg+ (docs/flower.md, "Secure
        aggregation"): for every run, or per run (``None`` for a run without).

    Returns
    -------
    list of FlowerRun
        In the order of ``configs``.
    """
    if not configs or len({config.clients for config in configs}) != 1:
        raise ConfigError("a simulation runs configurations of one number of clients")
    if secagg is None or isinstance(secagg, SecAggSettings):
        secaggs: list[SecAggSettings | None] = [secagg] * len(configs)
    else:
        secaggs = list(secagg)
    if len(secaggs) != len(configs):
        raise ConfigError("give one secagg setting per configuration (None for a run without)")
    for config, secure_sum in zip(configs, secaggs):
        check_flower_config(config)
        if secure_sum is not None:
            check_secagg(config, secure_sum, "stop")
        if config.secure and keys is None:
            raise ConfigError(
                "a secure run over Flower needs the federation's key file for its nodes: "
                "simulate(..., keys=PATH), written by stratify.flower.keys.write_federation_keys"
            )
    runs: list[FlowerRun] = []
    failures: list[BaseException] = []
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            for config, secure_sum in zip(configs, secaggs):
                runs.append(
                    run_on_grid(
                        grid,
                        config,
                        timeout=timeout,
                        retries=retries,
                        record=record,
                        secagg=secure_sum,
                    )
                )
        except BaseException as error:  # handed to the caller: the runtime would only log it
            failures.append(error)

    backend: dict[str, Any] = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": ray_init_args(cpus),
    }
    run_simulation(
        server,
        client_app(keys, order_keys),
        num_supernodes=configs[0].clients,
        backend_config=backend,
    )
    if failures:
        raise failures[0]
    return runs
