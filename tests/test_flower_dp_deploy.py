"""A node's own ε budget on a real Flower deployment (docs/flower.md, "The node's own
budget"): two SuperNodes with ``--node-config "dp-max-epsilon=... dp-ledger=..."``,
each message served by a fresh ``flwr-clientapp`` process, so the count lives only in
the ledger file. A DP FedAvg round is answered and each node's ledger then holds the ε
the server reports; the same round again, which would spend a second use of every
sample, is refused by the nodes before any update leaves.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip(
    "flwr", reason="the flower extra is not installed (pip install -e '.[flower]' in the checkout)"
)
pytest.importorskip("opacus", reason="Opacus is not installed (the privacy extra)")

from flwr.common.config import parse_config_args  # noqa: E402
from test_flower_deploy import (  # noqa: E402
    APP,
    FIRST_EXCHANGE_WAIT,
    FIRST_JOB_WAIT,
    config,
    exchange_timeout,
    job_wait,
)

from stratify.flower.deploy import LocalDeployment, node_config  # noqa: E402
from stratify.privacy.accounting import calibrate_noise, epsilon_spent  # noqa: E402
from stratify.privacy.ledger import Ledger  # noqa: E402

DELTA = 1e-5
#: one round of FedAvg, one local epoch: each sample is in one noised step
JOB = dataclasses.replace(
    config("fedavg", local_epochs=1), dp_epsilon=3.0, dp_delta=DELTA, dp_clip=1.0
)


def test_a_nodes_own_settings_reach_it_as_flower_parses_them(tmp_path: Path) -> None:
    settings = {"dp-max-epsilon": 4.5, "dp-ledger": tmp_path / "ledger.json", "secagg-only": True}
    assert parse_config_args([node_config(1, settings=settings)]) == {
        "partition-id": 1,
        "dp-max-epsilon": 4.5,
        "dp-ledger": str(tmp_path / "ledger.json"),
        "secagg-only": True,
    }
    with pytest.raises(Exception, match="no quote or backslash"):
        node_config(0, settings={"dp-ledger": 'a"b.json'})


def budget_between_one_use_and_two() -> tuple[float, float, float, float]:
    """σ as the server calibrates it for the job's planned single use of a sample, the ε
    of one use and of two at that σ, and a budget halfway between."""
    sigma = calibrate_noise(JOB.dp_epsilon, DELTA, 1)
    one, two = epsilon_spent(sigma, DELTA, 1), epsilon_spent(sigma, DELTA, 2)
    return sigma, one, two, (one + two) / 2


def test_the_budgets_figures_in_the_docs_are_todays() -> None:
    sigma, one, two, budget = budget_between_one_use_and_two()
    text = " ".join((APP.parents[1] / "docs" / "flower.md").read_text().split())
    stated = (
        f"a budget of {budget:.2f}, between {one:.2f} and {two:.2f} (the ε of one and of "
        f"two uses at σ = {sigma:.3f},"
    )
    assert stated in text


@pytest.mark.slow
def test_deployed_nodes_spend_no_more_than_their_budget(tmp_path: Path) -> None:
    _, one, _, budget = budget_between_one_use_and_two()
    ledgers = [tmp_path / f"ledger-{client}.json" for client in range(JOB.clients)]
    settings = [{"dp-max-epsilon": budget, "dp-ledger": path} for path in ledgers]
    with LocalDeployment(JOB.clients, node_settings=settings) as deployment:
        first = tmp_path / "first"
        deployment.submit(APP, JOB, first, timeout=FIRST_EXCHANGE_WAIT)
        result = deployment.wait(first, FIRST_JOB_WAIT)
        assert result["file"] == "result.json", result
        # every node's own count is the server's: one use of each sample at its σ
        for path in ledgers:
            spent = Ledger(path, budget, DELTA).epsilon()
            assert spent == pytest.approx(result["privacy"]["epsilon"], rel=1e-9)
            assert spent == pytest.approx(one, rel=1e-6)
        before = [path.read_bytes() for path in ledgers]
        exchange = result["epochs"][0]["seconds"] / JOB.clients
        timeout = exchange_timeout(exchange)
        again = tmp_path / "again"
        deployment.submit(APP, JOB, again, timeout=timeout, retries=1)
        refused = deployment.wait(again, job_wait(exchange, JOB.clients, timeout, 2))
    assert refused["file"] == "failure.json", refused
    assert "dp-max-epsilon" in refused["error"], refused
    # the refused messages counted nothing
    assert [path.read_bytes() for path in ledgers] == before
    assert json.loads(ledgers[0].read_text())["epsilon"] == pytest.approx(one, rel=1e-6)
    assert all(process.poll() is not None for process in deployment.processes.values())
