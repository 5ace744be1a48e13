"""A Flower deployment on this machine: a SuperLink and one SuperNode per client, each a
separate process (insecure: plain HTTP on 127.0.0.1), and ``flwr run`` to submit the app
(docs/flower.md, "Deployed"). Every process starts in its own process group and
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
from pathlib import Path
from types import TracebackType
from typing import Any

from stratify.config import TrainConfig
from stratify.errors import ConfigError, TrainingError
from stratify.flower.messages import config_json

#: seconds a process gets to end after SIGTERM before its group is killed
STOP_GRACE = 5.0


def node_config(
    client: int,
    registry_keys: str | os.PathLike | None = None,
    order_key: str | os.PathLike | None = None,
) -> str:
    """A SuperNode's ``--node-config``: its client number and, for secure runs, the
    federation key file it loads (:mod:`stratify.flower.keys`) and, optionally, its own
    order-key file (read, or drawn and written 0600), a TOML string."""
    text = f"partition-id={client}"
    for option, path in (("registry-keys", registry_keys), ("order-key", order_key)):
        if path is None:
            continue
        if '"' in str(path) or "\\" in str(path):
            # Flower reads the node configuration's strings between quotes, unescaped
            raise ConfigError(
                f"a key file's path for --node-config has no quote or backslash: {path}"
            )
        text += f' {option}="{path}"'
    return text


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
    """A SuperLink and ``clients`` SuperNodes on free ports of 127.0.0.1.

    Parameters
    ----------
    clients : int
        SuperNodes to start; node ``k`` is client ``k`` (``--node-config partition-id=k``).
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
    """

    def __init__(
        self,
        clients: int,
        folder: str | os.PathLike | None = None,
        start_timeout: float = 60.0,
        registry_keys: str | os.PathLike | None = None,
        order_keys: str | os.PathLike | None = None,
    ) -> None:
        self.temporary = tempfile.TemporaryDirectory() if folder is None else None
        self.folder = Path(self.temporary.name if self.temporary else str(folder))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ)
        # the SuperLink and SuperNodes start flwr-serverapp / flwr-clientapp by name
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["FLWR_HOME"] = str(self.folder / "flwr-home")
        self.processes: dict[str, subprocess.Popen] = {}
        self.port = free_port()
        try:
            superlink = self.start(
                "superlink",
                "flower-superlink",
                "--insecure",
                "--disable-runtime-dependency-installation",
                "--port",
                str(self.port),
            )
            wait_for_port(self.port, start_timeout, superlink)
            for client in range(clients):
                self.start(
                    f"supernode-{client}",
                    "flower-supernode",
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{self.port}",
                    "--port",
                    str(free_port()),
                    "--node-config",
                    node_config(
                        client,
                        registry_keys,
                        None if order_keys is None else Path(order_keys) / f"client-{client}.json",
                    ),
                )
            self.write_connection()
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
        """The ``flwr`` command's connection to this SuperLink, named ``local-deployment``."""
        home = Path(self.env["FLWR_HOME"])
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            '[superlink]\ndefault = "local-deployment"\n\n'
            f'[superlink.local-deployment]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )

    def submit(
        self, app: str | os.PathLike, config: TrainConfig, result_dir: Path, **settings: Any
    ) -> None:
        """``flwr run`` the app folder ``app`` with ``config``; the server app writes its
        files into ``result_dir`` (:mod:`stratify.flower.apps`)."""
        values = {"config": config_json(config), "result-dir": str(result_dir), **settings}
        overrides = self.folder / f"run-{time.monotonic_ns()}.toml"
        overrides.write_text("".join(f"{key} = {json.dumps(v)}\n" for key, v in values.items()))
        completed = subprocess.run(
            [str(Path(sys.executable).parent / "flwr"), "run", str(app), "local-deployment"]
            + ["--run-config", str(overrides)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if completed.returncode != 0:
            raise TrainingError(f"flwr run failed: {(completed.stdout + completed.stderr)[-2000:]}")

    @staticmethod
    def wait(result_dir: Path, timeout: float) -> dict[str, Any]:
        """The server app's ``result.json`` (or ``failure.json``) once written; a
        :class:`~stratify.errors.TrainingError` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name in ("result.json", "failure.json"):
                if (result_dir / name).exists():
                    return {"file": name, **json.loads((result_dir / name).read_text())}
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
