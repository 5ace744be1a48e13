"""A Flower deployment on this machine: a SuperLink and one SuperNode per client, each a
separate process (insecure: plain HTTP on 127.0.0.1), and ``flwr run`` to submit the app
(docs/flower.md, "Deployed"); or a SuperLink in simulation mode, whose runs simulate the
nodes in a Ray cluster (``flwr run`` against a simulation federation, docs/flower.md, "In
Flower's simulation"). Every process starts in its own process group and
:meth:`LocalDeployment.close` ends each group, its app processes included.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from stratify.config import TrainConfig
from stratify.errors import ConfigError, TrainingError
from stratify.flower.certificates import TlsFiles
from stratify.flower.run_config import run_config_of

#: seconds a process gets to end after SIGTERM before its group is killed
STOP_GRACE = 5.0
#: seconds a ``flwr`` command (a submission, a registration) may take: it builds and sends
#: the app, or one key, and returns; importing flwr takes seconds on a loaded machine
FLWR_TIMEOUT = 300.0
#: seconds between a SuperExec's looks for a task to start (Flower 1.42 reads them from
#: ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, default 1 s, at least 0.01 s): each message a
#: SuperNode receives waits that long, on average half, before its ``flwr-clientapp``
#: starts (docs/flower.md, "Wall time")
TASK_POLL_INTERVAL = 0.1


#: a value of a SuperNode's own setting (``--node-config``)
NodeSetting = str | int | float | bool


def node_config(
    client: int,
    registry_keys: str | os.PathLike | None = None,
    order_key: str | os.PathLike | None = None,
    settings: Mapping[str, NodeSetting | os.PathLike] | None = None,
) -> str:
    """A SuperNode's ``--node-config``: its client number and, for secure runs, the
    federation key file it loads (:mod:`stratify.flower.keys`) and, optionally, its own
    order-key file (read, or drawn and written 0600), then any other ``settings`` of the
    node's own (``dp-min-noise``, ``dp-max-epsilon``, ``dp-ledger``, ...), a TOML string."""
    entries: dict[str, NodeSetting | os.PathLike] = {"partition-id": client}
    for option, path in (("registry-keys", registry_keys), ("order-key", order_key)):
        if path is not None:
            entries[option] = path
    entries.update(settings or {})
    return " ".join(f"{key}={setting_text(key, value)}" for key, value in entries.items())


def setting_text(key: str, value: NodeSetting | os.PathLike) -> str:
    """``value`` as Flower reads a node setting: a bool ``true``/``false``, a number as
    written, anything else a string between quotes."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return repr(value)
    if '"' in str(value) or "\\" in str(value):
        # Flower reads the node configuration's strings between quotes, unescaped
        raise ConfigError(f"--node-config {key}: a value has no quote or backslash: {value}")
    return f'"{value}"'


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_port(port: int, timeout: float, process: subprocess.Popen) -> None:
    """Wait until something accepts connections on ``port``; fail if ``process`` ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise TrainingError(f"the process {process.pid} exited with code {process.returncode}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TrainingError(f"nothing listened on port {port} after {timeout:g} s")


class LocalDeployment:
    """A SuperLink and ``clients`` SuperNodes on free ports of 127.0.0.1, or a simulation
    SuperLink whose runs simulate ``clients`` nodes.

    Parameters
    ----------
    clients : int
        SuperNodes to start (node ``k`` is client ``k``: ``--node-config
        partition-id=k``), or, with ``simulation``, nodes each run simulates (Flower
        numbers their partitions itself).
    folder : path, optional
        Where the processes' logs and Flower's home go (default: a temporary folder,
        removed by :meth:`close`).
    start_timeout : float
        Seconds the SuperLink gets to listen.
    registry_keys : path, optional
        The federation key file every node loads for secure runs (here all nodes share
        one machine, so one path); without it a secure job's nodes refuse to register.
    order_keys : path, optional
        A folder where node ``k`` keeps its own order key, ``client-k.json`` (read if
        there, else drawn and written 0600); default: each node draws its own in memory.
    simulation : bool
        Start the SuperLink with ``--simulation`` and no SuperNode: every run submitted is
        simulated with ``clients`` nodes, one CPU each, in a Ray cluster of ``cpus`` CPUs.
    cpus : int
        With ``simulation``: the CPUs the Ray cluster may use.
    tls : TlsFiles, optional
        Serve TLS with these files (:func:`~stratify.flower.certificates.write_tls_files`)
        instead of plain HTTP: the SuperNodes and ``flwr`` trust its CA.
    node_keys : sequence of path, optional
        One authentication private key per SuperNode
        (:func:`~stratify.flower.certificates.write_node_key`, its public half at
        ``PATH.pub``): the SuperLink admits only SuperNodes whose public keys were
        registered (``--enable-supernode-auth``, ``flwr supernode register``).
    task_poll_interval : float
        Seconds between the SuperExecs' looks for a task to start (the SuperLink's server
        app, each SuperNode's client apps): ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``.
    node_settings : sequence of mapping, optional
        One mapping per SuperNode of its own further ``--node-config`` settings (a DP
        floor or budget: docs/flower.md, "Differential privacy").
    """

    def __init__(
        self,
        clients: int,
        folder: str | os.PathLike | None = None,
        start_timeout: float = 60.0,
        registry_keys: str | os.PathLike | None = None,
        order_keys: str | os.PathLike | None = None,
        simulation: bool = False,
        cpus: int = 2,
        tls: TlsFiles | None = None,
        node_keys: Sequence[str | os.PathLike] | None = None,
        task_poll_interval: float = TASK_POLL_INTERVAL,
        node_settings: Sequence[Mapping[str, NodeSetting | os.PathLike]] | None = None,
    ) -> None:
        if node_keys is not None and len(node_keys) != clients:
            raise ConfigError(f"give one SuperNode key per client: {clients}, not {len(node_keys)}")
        if node_settings is not None and len(node_settings) != clients:
            raise ConfigError(
                f"give one mapping of node settings per client: {clients}, not {len(node_settings)}"
            )
        self.clients = clients
        self.simulation = simulation
        self.cpus = cpus
        #: the ``flwr`` command's name of the connection to this SuperLink
        self.connection = "local-simulation" if simulation else "local-deployment"
        self.tls = tls
        self.temporary = tempfile.TemporaryDirectory() if folder is None else None
        self.folder = Path(self.temporary.name if self.temporary else str(folder))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ)
        # the SuperLink and SuperNodes start flwr-serverapp / flwr-clientapp by name
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["FLWR_HOME"] = str(self.folder / "flwr-home")
        self.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = f"{task_poll_interval:g}"
        # a simulation federation's Ray workers keep this process's priority instead of
        # Ray's +15, which starved them on a busy machine (stratify.flower.simulation)
        self.env["RAY_worker_niceness"] = "0"
        self.processes: dict[str, subprocess.Popen] = {}
        self.port = free_port()
        try:
            served = (
                ["--insecure"]
                if tls is None
                else ["--ssl-ca-certfile", str(tls.ca), "--ssl-certfile", str(tls.certificate)]
                + ["--ssl-keyfile", str(tls.key)]
            )
            superlink = self.start(
                "superlink",
                "flower-superlink",
                *served,
                "--disable-runtime-dependency-installation",
                "--port",
                str(self.port),
                *(["--simulation"] if simulation else []),
                *(["--enable-supernode-auth"] if node_keys is not None else []),
            )
            wait_for_port(self.port, start_timeout, superlink)
            self.write_connection()
            trusted = ["--insecure"] if tls is None else ["--root-certificates", str(tls.ca)]
            for client in range(0 if simulation else clients):
                key: list[str] = []
                if node_keys is not None:
                    self.register(Path(f"{node_keys[client]}.pub"))
                    key = ["--auth-supernode-private-key", str(node_keys[client])]
                self.start(
                    f"supernode-{client}",
                    "flower-supernode",
                    *trusted,
                    *key,
                    "--superlink",
                    f"127.0.0.1:{self.port}",
                    "--port",
                    str(free_port()),
                    "--node-config",
                    node_config(
                        client,
                        registry_keys,
                        None if order_keys is None else Path(order_keys) / f"client-{client}.json",
                        None if node_settings is None else node_settings[client],
                    ),
                )
        except BaseException:
            self.close()
            raise

    def start(self, name: str, *command: str) -> subprocess.Popen:
        """Start ``command`` as the process ``name``, in its own process group, its output
        in ``name.log``."""
        log = open(self.folder / f"{name}.log", "wb")
        with log:
            process = subprocess.Popen(
                [str(Path(sys.executable).parent / command[0]), *command[1:]],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.processes[name] = process
        return process

    def write_connection(self) -> None:
        """The ``flwr`` command's connection to this SuperLink, named :attr:`connection`."""
        home = Path(self.env["FLWR_HOME"])
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{self.connection}"\n\n'
            f'[superlink.{self.connection}]\naddress = "127.0.0.1:{self.port}"\n'
            + (
                "insecure = true\n"
                if self.tls is None
                else f"root-certificates = {json.dumps(str(self.tls.ca))}\n"
            )
        )

    def register(self, public_key: Path) -> None:
        """Admit the SuperNode whose public key is ``public_key`` (``flwr supernode
        register``; the SuperLink refuses any other)."""
        self.flwr("supernode", "register", str(public_key), self.connection)

    def submit(
        self, app: str | os.PathLike, config: TrainConfig, result_dir: Path, **settings: Any
    ) -> None:
        """``flwr run`` the app folder ``app`` with ``config`` (every key of its run
        configuration, :func:`~stratify.flower.run_config.run_config_of`) and ``settings``
        (``timeout=60.0``: the run configuration's ``timeout``); the server app writes its
        files into ``result_dir`` (:mod:`stratify.flower.apps`)."""
        values = {**run_config_of(config), "result-dir": str(result_dir), **settings}
        overrides = self.folder / f"run-{time.monotonic_ns()}.toml"
        overrides.write_text("".join(f"{key} = {json.dumps(v)}\n" for key, v in values.items()))
        federation = (
            # one CPU per simulated node, as stratify.flower.simulation.simulate gives
            [
                "--federation-config",
                f"num-supernodes={self.clients} client-resources-num-cpus=1 "
                f"init-args-num-cpus={self.cpus}",
            ]
            if self.simulation
            else []
        )
        self.flwr("run", str(app), self.connection, "--run-config", str(overrides), *federation)

    def flwr(self, *arguments: str) -> None:
        """Run the ``flwr`` command with ``arguments`` against this SuperLink; a
        :class:`~stratify.errors.TrainingError` with its output if it fails."""
        completed = subprocess.run(
            [str(Path(sys.executable).parent / "flwr"), *arguments],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=FLWR_TIMEOUT,
        )
        if completed.returncode != 0:
            output = (completed.stdout + completed.stderr)[-2000:]
            raise TrainingError(f"flwr {arguments[0]} failed: {output}")

    def wait(self, result_dir: Path, timeout: float) -> dict[str, Any]:
        """The server app's ``result.json`` (or ``failure.json``) once written; a
        :class:`~stratify.errors.TrainingError` after ``timeout`` seconds, or as soon as
        the SuperLink has exited (it runs the server app, so nothing can be written then:
        before, a killed SuperLink left the caller waiting out the whole timeout)."""
        superlink = self.processes["superlink"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # polled before the files are read, so a result written just before the
            # SuperLink exited is still returned
            exited = superlink.poll() is not None
            for name in ("result.json", "failure.json"):
                if (result_dir / name).exists():
                    return {"file": name, **json.loads((result_dir / name).read_text())}
            if exited:
                log = (self.folder / "superlink.log").read_bytes()[-1500:]
                raise TrainingError(
                    f"the SuperLink exited (code {superlink.returncode}) before the server "
                    f"app wrote a result into {result_dir}; the end of its log:\n"
                    + log.decode(errors="replace")
                )
            time.sleep(0.2)
        raise TrainingError(f"the server app wrote no result into {result_dir} in {timeout:g} s")

    def stop(self, name: str) -> None:
        """End the process ``name`` and every process of its group (a node's apps too):
        SIGTERM, then SIGKILL after :data:`STOP_GRACE` seconds."""
        process = self.processes[name]
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass  # the whole group has already ended
        try:
            process.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)  # what is left of the group
        except ProcessLookupError:
            pass
        process.wait(STOP_GRACE)

    def close(self) -> None:
        """Stop every process started (the SuperNodes first) and remove the temporary
        folder."""
        for name in reversed(list(self.processes)):
            self.stop(name)
        if self.temporary is not None:
            self.temporary.cleanup()

    def __enter__(self) -> LocalDeployment:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
