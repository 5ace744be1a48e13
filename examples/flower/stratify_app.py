"""The Flower app of docs/flower.md: Stratify's ``ServerApp`` and ``ClientApp``.

Deployed (a SuperLink, one SuperNode per client started with ``--node-config
partition-id=K``)::

    flwr run examples/flower local-deployment

The server app runs the job of ``pyproject.toml``'s run configuration (one key per
setting, overridden by ``flwr run --run-config "epochs=3 lr=0.05"``) and writes
``result.json`` and ``weights.pt`` into ``result-dir``; every node loads its own client's
data.
"""

from stratify.flower.apps import client_app, server_app

server = server_app()
client = client_app()
