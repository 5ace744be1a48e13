"""Differential privacy on Flower nodes (docs/flower.md, "Differential privacy").

Each node trains with a :class:`~stratify.client.PrivateTrainer`: it clips every
per-sample gradient and adds the noise itself, with the σ the server's
``build_experiment`` calibrated, sent with every training message. A simulated run with
``--dp-seed`` ends where the in-process run ends, with the same (ε, δ); the label attack
on the SecAgg+ sums the server holds is measured with and without DP.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip(
    "flwr", reason="the flower extra is not installed (pip install -e '.[flower]' in the checkout)"
)

from flwr.app import ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.common.config import parse_config_args  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from stratify.client import LocalTrainer, PrivateTrainer  # noqa: E402
from stratify.config import TrainConfig  # noqa: E402
from stratify.data.datasets import load_dataset  # noqa: E402
from stratify.errors import ConfigError  # noqa: E402
from stratify.experiment import build_experiment, partition_clients  # noqa: E402
from stratify.flower import node  # noqa: E402
from stratify.flower.apps import check_run_config, run_summary  # noqa: E402
from stratify.flower.dp_attack import sum_label_attack  # noqa: E402
from stratify.flower.link import Traffic  # noqa: E402
from stratify.flower.messages import index_record, state_record  # noqa: E402
from stratify.flower.run_config import run_config_of  # noqa: E402
from stratify.flower.secagg_cost import job as secagg_job  # noqa: E402
from stratify.flower.secure_sum import SecAggSettings, ShareRequest  # noqa: E402
from stratify.flower.server import FlowerRun, RemoteTrainer  # noqa: E402
from stratify.flower.simulation import simulate  # noqa: E402
from stratify.nn.models import build_model  # noqa: E402
from stratify.privacy.accounting import calibrate_noise, epsilon_spent  # noqa: E402
from stratify.privacy.ledger import run_key  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: float32 sums in another order (one per-sample pass per client's share)
TOLERANCE = 1e-5


def job(**changes) -> TrainConfig:
    """Stratify's batch mode on digits over four Dirichlet(0.5) clients, the MLP: the job
    :mod:`stratify.flower.secagg_cost` measures, with ``changes``."""
    return dataclasses.replace(secagg_job(), **changes)


# -- the node's side, without a simulation ----------------------------------------------


def private_node(config: TrainConfig) -> node.NodeData:
    torch.manual_seed(0)  # the same samples and model at every call
    x, y = torch.randn(6, 1, 8, 8), torch.arange(6) % 3
    model = build_model("mlp", (1, 8, 8), 10)
    return node.NodeData(1, y.numpy(), node.node_trainer(config, 1, x, y), model)


@pytest.mark.parametrize("dp", [True, False])
def test_a_node_trains_privately_exactly_when_the_run_asks(dp):
    config = job(dp_epsilon=3.0, dp_clip=0.5) if dp else job()
    trainer = private_node(config).trainer
    assert isinstance(trainer, PrivateTrainer) == dp
    assert isinstance(trainer, LocalTrainer)
    if dp:
        assert trainer.clip == 0.5
        assert math.isnan(trainer.noise_multiplier)  # no σ yet: nothing to send


def test_a_private_node_refuses_a_training_message_without_the_noise():
    private = private_node(job(dp_noise=1.0))
    with pytest.raises(ConfigError, match="must carry the noise"):
        node.message_noise(private, RecordDict())
    # a node of a run without DP needs none
    node.message_noise(private_node(job()), RecordDict())
    record = ConfigRecord({"noise": 0.7, "epoch": 2, "draw": 5})
    node.message_noise(private, RecordDict({"dp": record}))
    assert private.trainer.noise_multiplier == 0.7
    assert private.trainer.epoch == 2
    assert private.trainer.draws == {1: 5}


@pytest.mark.parametrize("dp", [True, False])
def test_a_nodes_share_gradient_is_clipped_and_noised_with_dp(dp):
    # the same share's gradient twice, at two noise seeds: a private node's differs (and
    # each has the noise's spread, σC = 1), a plain node's is the same
    def share(seed):
        config = job(dp_noise=1.0, dp_clip=1.0, dp_seed=seed) if dp else job()
        data = private_node(config)
        if dp:
            node.set_noise(data, 1.0, 1)
        grads, _ = node.share_sum(data, data.model, np.arange(4))
        return torch.cat([g.reshape(-1) for g in grads])

    first, again, other = share(0), share(0), share(1)
    assert torch.equal(first, again)
    if dp:
        spread = float(((first - other) / math.sqrt(2)).std())
        assert abs(spread - 1.0) < 0.1
    else:
        assert torch.equal(first, other)


def floor_context(floor: object | None) -> Context:
    config = {"partition-id": 0} if floor is None else {"partition-id": 0, "dp-min-noise": floor}
    return Context(0, 0, config, RecordDict(), {})


def test_a_node_reads_its_own_noise_floor():
    assert node.noise_floor(floor_context(None)) is None
    assert node.noise_floor(floor_context(1.5)) == 1.5
    assert node.noise_floor(floor_context("0.8")) == 0.8
    for bad in (0, -1.0, "many", float("inf")):
        with pytest.raises(ConfigError, match="dp-min-noise must be a number above 0"):
            node.noise_floor(floor_context(bad))


def test_a_server_sending_less_noise_gets_the_clipped_gradient_unless_the_node_has_a_floor():
    """The attack of a server that chooses σ: it sends σ = 0 (or a run without DP) and
    reads the share's clipped gradient exactly; at two noise seeds the node's answers
    are then the same. A node with --node-config dp-min-noise refuses both messages, and
    trains at σ at or above its floor."""

    def share(seed: int, sigma: float, floor: float | None = None) -> torch.Tensor:
        data = private_node(job(dp_noise=1.0, dp_clip=1.0, dp_seed=seed))
        record = ConfigRecord({"noise": sigma, "epoch": 1, "draw": 0})
        node.message_noise(data, RecordDict({"dp": record}), floor)
        grads, _ = node.share_sum(data, data.model, np.arange(4))
        return torch.cat([g.reshape(-1) for g in grads])

    # without a floor the server's σ = 0 is taken: the noise seeds no longer matter
    assert torch.equal(share(0, 0.0), share(1, 0.0))
    with pytest.raises(ConfigError, match="σ ≥ 1 .*asks for σ = 0"):
        share(0, 0.0, floor=1.0)
    with pytest.raises(ConfigError, match="σ ≥ 1 .*the run has no DP"):
        node.message_noise(private_node(job()), RecordDict(), 1.0)
    # at or above the floor the node trains, noised
    assert not torch.equal(share(0, 1.0, floor=1.0), share(1, 1.0, floor=1.0))


#: a node's own settings that refuse a run without DP: its floor, its ε budget
OWN_SETTINGS = {
    "dp-min-noise": {"dp-min-noise": 1.0},
    "dp-max-epsilon": {"dp-max-epsilon": 3.0, "dp-ledger": "unused.json"},
    None: {},
}


@pytest.mark.parametrize(
    "kind", ["train", "train.gradient", "train.hop", "train.norm", "train.secagg"]
)
@pytest.mark.parametrize("setting", list(OWN_SETTINGS))
def test_every_handler_that_sends_an_update_keeps_the_nodes_settings(kind, setting, monkeypatch):
    # a run without DP: with a floor or a budget every update-sending handler refuses
    # before it reads the message's model; without one it goes on (and here fails on the
    # empty message)
    for name in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)
    monkeypatch.setattr(node, "node_data", lambda content, context: private_node(job()))
    # SecAgg+'s share request, read: the plain run's, without σ
    request = dataclasses.make_dataclass("Request", ["run", "noise", "epoch", "draw"])
    monkeypatch.setattr(node, "read_request", lambda content: request("{}", None, 1, 0))
    handler = {
        "train": node.train,
        "train.gradient": node.gradient,
        "train.hop": node.hop,
        "train.norm": node.norm,
        "train.secagg": node.secure_share,
    }[kind]
    message = Message(RecordDict(), dst_node_id=0, message_type=kind)
    context = Context(0, 0, {"partition-id": 0, **OWN_SETTINGS[setting]}, RecordDict(), {})
    with pytest.raises(Exception) as refused:
        handler(message, context)
    for name in ("dp-min-noise", "dp-max-epsilon"):
        assert (name in str(refused.value)) is (name == setting)


def budget_context(settings: dict) -> Context:
    return Context(0, 0, {"partition-id": 0, **settings}, RecordDict(), {})


def test_a_node_reads_its_own_budget(tmp_path):
    assert node.node_budget(budget_context({})) is None
    # the setting as docs/flower.md writes it, parsed as flower-supernode parses it
    documented = 'partition-id=0 dp-max-epsilon=3 dp-ledger="/var/lib/node0/dp-ledger.json"'
    assert documented in " ".join((ROOT / "docs" / "flower.md").read_text().split())
    parsed = node.node_budget(Context(0, 0, parse_config_args([documented]), RecordDict(), {}))
    assert (parsed.budget, str(parsed.path)) == (3.0, "/var/lib/node0/dp-ledger.json")
    path = str(tmp_path / "ledger.json")
    ledger = node.node_budget(budget_context({"dp-max-epsilon": "2.5", "dp-ledger": path}))
    assert (ledger.budget, ledger.delta, str(ledger.path)) == (2.5, 1e-5, path)
    settings = {"dp-max-epsilon": 2.5, "dp-ledger": path, "dp-budget-delta": 1e-6}
    assert node.node_budget(budget_context(settings)).delta == 1e-6
    for bad, message in [
        ({"dp-max-epsilon": 2.5}, "needs dp-ledger=PATH"),
        ({"dp-ledger": path}, "dp-ledger goes with dp-max-epsilon"),
        ({"dp-max-epsilon": 0, "dp-ledger": path}, "dp-max-epsilon takes a finite ε > 0"),
        ({"dp-max-epsilon": 1, "dp-ledger": path, "dp-budget-delta": 2}, "takes a δ in"),
    ]:
        with pytest.raises(ConfigError, match=message):
            node.node_budget(budget_context(bad))


def hop_message(
    data: node.NodeData, sigma: float, epoch: int, steps: list[int], run: str = "the run's settings"
) -> Message:
    """A single-sample hop over the node's ``steps``, as the server app sends it."""
    content = RecordDict(
        {
            "run": ConfigRecord({"config": run}),
            "dp": ConfigRecord({"noise": sigma, "epoch": epoch, "draw": 0}),
            "model": state_record(data.model.state_dict()),
            "steps": index_record(positions=np.array(steps)),
            "hop": ConfigRecord({"lr": 0.1}),
        }
    )
    return Message(content, dst_node_id=0, message_type="train.hop")


def update_message(data: node.NodeData, kind: str) -> Message:
    """A message of ``kind`` that uses the node's samples 0, 1, 1 and 4 (a local training:
    two epochs over 0, 1 and 4, 1); a SecAgg+ share's request is read by
    :func:`node.read_request`, patched in the test."""
    records = {
        "run": ConfigRecord({"config": "the run's settings"}),
        "dp": ConfigRecord({"noise": 1.0, "epoch": 1, "draw": 0}),
        "model": state_record(data.model.state_dict()),
    }
    if kind == "train":
        records["orders"] = index_record(**{"0": np.array([0, 1, 4]), "1": np.array([1])})
        job = {"term": "none", "batch_size": 2, "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}
        records["job"] = ConfigRecord(job)
    elif kind == "train.gradient":
        records["share"] = index_record(positions=np.array([0, 1, 1, 4]))
    elif kind == "train.hop":
        records["steps"] = index_record(positions=np.array([0, 1, 1, 4]))
        records["hop"] = ConfigRecord({"lr": 0.1})
    return Message(RecordDict(records), dst_node_id=0, message_type=kind)


@pytest.mark.parametrize("kind", ["train", "train.gradient", "train.hop", "train.secagg"])
def test_every_handler_counts_the_uses_its_update_holds(kind, tmp_path, monkeypatch):
    # one use of a sample per noised step it is in: a local mini-batch step, a share's
    # sum, a one-sample step
    for name in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)
    data = private_node(job(dp_noise=1.0, dp_seed=0))
    monkeypatch.setattr(node, "node_data", lambda content, context: data)
    model = [value.numpy() for value in data.model.state_dict().values()]
    request = ShareRequest("the run's settings", np.array([0, 1, 1, 4]), 1, 1e3, model, 1.0, 1)
    monkeypatch.setattr(node, "read_request", lambda content: request)
    handler = {
        "train": node.train,
        "train.gradient": node.gradient,
        "train.hop": node.hop,
        "train.secagg": node.secure_share,
    }[kind]
    path = tmp_path / "ledger.json"
    handler(update_message(data, kind), budget_context({"dp-max-epsilon": 50, "dp-ledger": path}))
    runs = json.loads(path.read_text())["runs"]
    assert runs == {run_key(1, "the run's settings"): {"1.0": [1, 2, 0, 0, 1, 0]}}


@pytest.mark.parametrize("budget", [True, False])
def test_a_server_spending_more_than_it_planned_is_stopped_by_the_nodes_budget(
    budget, tmp_path, monkeypatch
):
    """The attack of a server that calibrates σ for three uses of each sample (ε = 3)
    and then asks for a fourth: without a budget the node answers and its samples have
    spent more than ε = 3; with ``dp-max-epsilon=3`` the three planned hops are answered
    and the fourth is refused before the model leaves, under the run's settings or
    others."""
    for name in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)
    data = private_node(job(dp_noise=1.0, dp_seed=0))
    monkeypatch.setattr(node, "node_data", lambda content, context: data)
    sigma = calibrate_noise(3.0, 1e-5, 3)
    ledger = tmp_path / "ledger.json"
    settings = {"dp-max-epsilon": 3.0, "dp-ledger": str(ledger)} if budget else {}
    context = budget_context(settings)
    for epoch in (1, 2, 3):  # the planned uses: every sample once per epoch
        answer = node.hop(hop_message(data, sigma, epoch, list(range(data.size))), context)
        assert "model" in answer.content.array_records
    fourth = hop_message(data, sigma, 4, [2])
    if not budget:
        assert "model" in node.hop(fourth, context).content.array_records
        assert epsilon_spent(sigma, 1e-5, 4) > 3.0  # what sample 2 has now spent
        return
    spent = node.node_budget(context).epsilon()
    assert spent == pytest.approx(epsilon_spent(sigma, 1e-5, 3), rel=1e-12)
    assert spent <= 3.0
    with pytest.raises(ConfigError, match="at most ε = 3 .*would take it to"):
        node.hop(fourth, context)
    # nor does a run under other settings start a fresh count: the node cannot tell
    # whether its samples are the same ones, so it counts them as the same
    renamed = hop_message(data, sigma, 1, [2], run="the run's settings, renamed")
    with pytest.raises(ConfigError, match="at most ε = 3 .*would take it to"):
        node.hop(renamed, context)
    assert node.node_budget(context).epsilon() == spent


class Link:
    """The link's parts a RemoteTrainer reads when nothing is sent."""

    nodes = {0: 100, 1: 101}
    payloads = None
    traffic = Traffic()


@pytest.mark.parametrize("clips", [True, False])
def test_build_experiment_accepts_flowers_trainer_only_when_its_nodes_clip(clips):
    config = job(dp_epsilon=3.0)
    dataset = load_dataset("digits", seed=3)
    federation = partition_clients(dataset, config)
    sizes = [len(indices) for indices in federation.client_indices]
    trainer = RemoteTrainer(Link(), sizes, dataset.x_train, dataset.y_train, clips_on_nodes=clips)  # type: ignore[arg-type]
    if not clips:
        with pytest.raises(ConfigError, match="do not clip"):
            build_experiment(config, dataset=dataset, trainer=trainer)
        return
    built = build_experiment(config, dataset=dataset, trainer=trainer)
    assert built.engine.context.trainer is trainer
    # σ calibrated for the planned uses, to spend ε = 3 at δ = 1e-5
    planned = config.epochs * trainer.uses_per_epoch
    assert planned >= 1
    assert epsilon_spent(trainer.noise_multiplier, 1e-5, planned) == pytest.approx(3.0, rel=0.02)
    # every message tells the node where its noise draws start among its client's
    trainer.start_epoch(2)
    assert trainer.noise(1, 3) == {"noise": trainer.noise_multiplier, "epoch": 2, "draw": 0}
    assert trainer.noise(1, 1)["draw"] == 3
    assert trainer.noise(0, 1)["draw"] == 0


# -- a simulation: the same run in-process and on Flower ---------------------------------

#: DP runs: Stratify's batch mode, plain and under SecAgg+, and FedAvg's local rounds
DP = {"dp_epsilon": 3.0, "dp_delta": 1e-5, "dp_clip": 1.0}
CASES = {
    "stratify": job(epochs=2, dp_seed=11, **DP),
    # the model hops from holder to holder: each one-sample step clipped and noised
    "stratify-hops": job(
        mode="single-sample",
        lr=0.05,
        dp_seed=13,
        options={"chunk": 5, "repeat_count": 6},
        **DP,
    ),
    "fedavg": job(
        algorithm="fedavg", epochs=1, lr=0.1, dp_seed=12, options={"local_epochs": 1}, **DP
    ),
}


def in_process(config: TrainConfig):
    """The in-process run: its final weights and the (ε, planned uses) it reports."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        built = build_experiment(config)
        trainer = built.engine.context.trainer
        assert isinstance(trainer, PrivateTrainer)
        for epoch in range(1, config.epochs + 1):
            trainer.start_epoch(epoch)  # as Run does
            built.engine.run_epoch(epoch)
    finally:
        torch.set_num_threads(threads)
    uses = int(trainer.uses.max())
    epsilon = epsilon_spent(trainer.noise_multiplier, config.dp_delta, uses)
    return built.model.state_dict(), epsilon, uses


@pytest.fixture(scope="module")
def flower_runs() -> dict:
    return dict(zip(CASES, simulate(list(CASES.values()), timeout=300)))


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_flower_run_with_dp_ends_as_the_in_process_run(flower_runs, case):
    config = CASES[case]
    state, epsilon, uses = in_process(config)
    run = flower_runs[case]
    assert run.privacy is not None
    assert run.privacy["uses"] == uses == run.privacy["planned_uses"]
    assert run.privacy["epsilon"] == pytest.approx(epsilon, rel=1e-9)
    assert run.privacy["epsilon"] <= 3.0 + 1e-6
    start = build_experiment(config).model.state_dict()
    moved = max(float((state[k] - start[k]).abs().max()) for k in state)
    assert moved > 1e-2, "the run must train for the comparison to mean something"
    difference = max(float((state[k] - run.state[k]).abs().max()) for k in state)
    assert difference < TOLERANCE


@pytest.mark.slow
def test_another_dp_seed_ends_elsewhere(flower_runs):
    # the weights' agreement above is the noise's: another seed in-process ends elsewhere
    config = CASES["stratify"]
    other = TrainConfig(**{**config.__dict__, "dp_seed": 99})
    state, _, _ = in_process(other)
    run = flower_runs["stratify"]
    difference = max(float((state[k] - run.state[k]).abs().max()) for k in state)
    assert difference > 100 * TOLERANCE


# -- the label attack on the SecAgg+ sums, with and without DP ---------------------------


#: SecAgg+ runs: no DP, and ε = 3 at two noise seeds
SECURE = {
    "none": job(),
    "eps3-a": job(dp_seed=1, **DP),
    "eps3-b": job(dp_seed=2, **DP),
}


@pytest.fixture(scope="module")
def secure_runs() -> dict:
    runs = simulate(list(SECURE.values()), timeout=300, record=True, secagg=SecAggSettings())
    return dict(zip(SECURE, runs))


@pytest.mark.slow
def test_the_label_attack_on_secagg_sums_with_and_without_dp(secure_runs):
    dataset = load_dataset("digits", seed=3)
    recovered = {name: sum_label_attack(run, dataset) for name, run in secure_runs.items()}
    accuracy = {name: run.accuracies[-1] for name, run in secure_runs.items()}
    print(f"label attack on SecAgg+ sums: {recovered}; test accuracy: {accuracy}")
    # without DP the sums give each batch's label counts away
    assert recovered["none"] >= 0.9
    plain, first, second = (secure_runs[name] for name in SECURE)
    assert plain.privacy is None
    assert first.privacy["epsilon"] <= 3.0 + 1e-6
    # with DP the server's sums are noised: the same schedule (same --seed) at two noise
    # seeds gives different sums for the same first batch
    assert np.array_equal(first.batches[0]["samples"], second.batches[0]["samples"])
    a = np.concatenate([np.ravel(v) for v in first.batches[0]["sum"]])
    b = np.concatenate([np.ravel(v) for v in second.batches[0]["sum"]])
    assert not np.allclose(a, b, atol=1e-3)


def test_a_deployed_run_takes_dp_and_reports_its_epsilon(tmp_path):
    config = job(dp_epsilon=3.0, dp_seed=None)
    checked = check_run_config({**run_config_of(config), "result-dir": str(tmp_path)})
    assert checked.config.dp_epsilon == 3.0
    run = FlowerRun(config, {}, privacy={"epsilon": 2.99, "delta": 1e-5})
    assert run_summary(run)["privacy"] == {"epsilon": 2.99, "delta": 1e-5}
    # a run without DP reports none
    assert "privacy" not in run_summary(FlowerRun(job(), {}))
