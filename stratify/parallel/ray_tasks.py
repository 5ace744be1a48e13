"""Runs as Ray tasks on an existing cluster or a local one (:class:`RayBackend`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stratify.errors import (
    ConfigError,
)
from stratify.parallel.execute import (
    DatasetCache,
    execute_group,
)
from stratify.parallel.local_workers import sigterm_stops_runs
from stratify.parallel.specs import (
    EventHandler,
    RunGroup,
    RunOutcome,
    RunsInterrupted,
)

RAY_HINT = "--backend ray needs Ray: pip install -e '.[ray]' in the checkout"
#: seconds a Ray cluster's address has to accept a connection before it is called dead
#: (ray.init itself retries a dead address for minutes)
RAY_CONNECT_SECONDS = 10.0
#: seconds a trial driver has to join the cluster (what answers may not be Ray)
RAY_JOIN_SECONDS = 30.0
#: a trial driver: joins the cluster at argv[1] and leaves
RAY_JOIN_SCRIPT = (
    "import logging, sys\n"
    "import ray\n"
    "ray.init(address=sys.argv[1], log_to_driver=False, include_dashboard=False,\n"
    "         logging_level=logging.ERROR)\n"
    "ray.shutdown()\n"
)
#: the addresses Ray resolves itself, without a host to connect to
RAY_LOCAL_ADDRESSES = ("auto", "local")


def ray_endpoint(address: str) -> tuple[str, int] | None:
    """The ``(host, port)`` of a Ray address (``host:port`` or ``ray://host:port``), or
    ``None`` for ``auto``/``local``; anything else is refused in one line."""
    if address in RAY_LOCAL_ADDRESSES:
        return None
    text = address.removeprefix("ray://")
    host, separator, port = text.rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--address {address!r} is not host:port, ray://host:port, auto or local")
    return host, int(port)


def check_ray_address(address: str | None) -> None:
    """Refuse, in bounded time and one line, a Ray address that cannot be joined, before
    ``ray.init`` in this process would retry it for minutes, printing as it goes.

    First a TCP connection (at most :data:`RAY_CONNECT_SECONDS`): nothing listening is
    refused at once. Then a trial driver in a child process joins the cluster (at most
    :data:`RAY_JOIN_SECONDS`, its output kept from the terminal): something that answers
    but is not a Ray cluster is refused too. ``None`` checks the address Ray would read
    from ``RAY_ADDRESS``, if set; ``auto`` and ``local`` are Ray's to resolve."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        return
    endpoint = ray_endpoint(address)
    if endpoint is None:
        return
    try:
        socket.create_connection(endpoint, timeout=RAY_CONNECT_SECONDS).close()
    except OSError as error:
        reason = "no answer" if isinstance(error, TimeoutError) else error.strerror or error
        raise ConfigError(
            f"--backend ray: nothing answers at {address} ({reason}, waited at most "
            f"{RAY_CONNECT_SECONDS:g} s); start the cluster (ray start --head) or fix --address"
        ) from None
    try:
        trial = subprocess.run(
            [sys.executable, "-c", RAY_JOIN_SCRIPT, address],
            capture_output=True,
            text=True,
            timeout=RAY_JOIN_SECONDS,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"--backend ray: could not join the Ray cluster at {address} within "
            f"{RAY_JOIN_SECONDS:g} s; check that --address names a Ray head node"
        ) from None
    if trial.returncode != 0:
        lines = [line.strip() for line in trial.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line.split(":")[0]] or lines or ["?"]
        raise ConfigError(
            f"--backend ray: cannot join the Ray cluster at {address} ({errors[-1][:200]}); "
            "check that --address names a Ray head node"
        )


#: the datasets a Ray worker process has loaded, kept for the next tasks it runs
_RAY_WORKER_DATASETS = DatasetCache()


def _ray_execute(group: RunGroup, events: Any) -> list[RunOutcome]:
    return execute_group(group, events.put, _RAY_WORKER_DATASETS)


@dataclass
class RayBackend:
    """One Ray task per group (a run alone, or runs stepped together): one CPU each, or
    one GPU for runs with ``device="cuda"``.

    Parameters
    ----------
    address : str, optional
        The cluster to join (``ray.init(address=...)``; e.g. ``auto`` or
        ``ray://head:10001``). Default: Ray's own default, which starts a local cluster
        where none runs; a Ray already initialised in this process is used as it is.
    """

    address: str | None = None

    def __post_init__(self) -> None:
        if self.address is not None:
            if not isinstance(self.address, str):
                raise ConfigError(f"--address must be text, got {self.address!r:.60}")
            ray_endpoint(self.address)

    def check(self) -> None:
        """Refuse a cluster address where nothing answers, in bounded time."""
        check_ray_address(self.address)

    def run(self, groups: Sequence[RunGroup], on_event: EventHandler) -> list[RunOutcome]:
        try:
            import ray
            from ray.util.queue import Queue
        except ImportError:
            raise ConfigError(RAY_HINT) from None
        started_here = not ray.is_initialized()
        # ray.init installs a SIGTERM handler of its own and ray.shutdown leaves it: the
        # handler found here is put back once the Ray started here is shut down
        found = signal.getsignal(signal.SIGTERM) if started_here else None
        if started_here:
            self.check()
            try:
                ray.init(address=self.address, log_to_driver=False, include_dashboard=False)
            except (ConnectionError, RuntimeError, ValueError) as error:
                raise ConfigError(
                    f"--backend ray: cannot join the Ray cluster at {self.address or 'default'} "
                    f"({str(error).splitlines()[0]})"
                ) from None
        events = Queue(actor_options={"num_cpus": 0})
        task = ray.remote(_ray_execute)
        pending = {
            task.options(
                num_cpus=1, num_gpus=1 if group.specs[0].config.device == "cuda" else 0
            ).remote(group, events): group
            for group in groups
        }
        specs = [spec for group in groups for spec in group.specs]
        outcomes: dict[str, RunOutcome] = {}

        def drain() -> None:
            waiting = events.qsize()
            if waiting:
                for event in events.get_nowait_batch(waiting):
                    on_event(event)

        try:
            # SIGTERM takes Ctrl-C's path: the tasks are cancelled and a Ray started here
            # is shut down, where the default action would leave its processes running
            with sigterm_stops_runs():
                self._wait(ray, pending, outcomes, on_event, drain)
            drain()
        except KeyboardInterrupt as stop:
            for reference in pending:
                ray.cancel(reference, force=True)
            stopped = [
                outcomes.get(spec.name) or RunOutcome(spec.name, "interrupted") for spec in specs
            ]
            raise RunsInterrupted(stopped, RunsInterrupted.signal_of(stop)) from None
        finally:
            events.shutdown(force=True)
            if started_here:
                ray.shutdown()
                if found is not None and threading.current_thread() is threading.main_thread():
                    signal.signal(signal.SIGTERM, found)
        return [outcomes[spec.name] for spec in specs]

    @staticmethod
    def _wait(
        ray: Any,
        pending: dict[Any, RunGroup],
        outcomes: dict[str, RunOutcome],
        on_event: EventHandler,
        drain: Callable[[], None],
    ) -> None:
        """Collect the tasks' outcomes as they end (``pending`` empties as they do)."""
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=0.25)
            drain()
            for reference in done:
                group = pending.pop(reference)
                try:
                    results = ray.get(reference)
                except Exception as error:  # the task's process died or Ray failed it
                    message = f"Ray: {str(error).splitlines()[0]}"
                    results = [RunOutcome(spec.name, "failed", message) for spec in group.specs]
                for outcome in results:
                    outcomes[outcome.name] = outcome
                    on_event(outcome)
