"""Stratify and its baselines on Flower: a simulated run ends where the in-process run ends.

One Flower simulation (its Ray cluster started once) runs every case one after another
on three nodes, each holding one client's digits; the same configurations then run
in-process with one torch thread, as the simulation's nodes compute. The secure cases
register with the encrypted registry's parties on their own nodes, the nodes holding a
federation key file the in-process run gets the secrets of; every message the server
sends and receives is recorded, and the tests look in them, as the server and the key
holder would, for what each must not learn (docs/flower.md, "What each party sees").
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tenseal
import torch
from engines import FEATURES, bn_mlp, mlp, tiny_engine
from scipy import stats as scipy_stats

pytest.importorskip(
    "flwr", reason="the flower extra is not installed (pip install -e '.[flower]' in the checkout)"
)

from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict  # noqa: E402
from flwr.common.config import parse_config_args  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from stratify.client import accumulate_batch_gradient  # noqa: E402
from stratify.config import TrainConfig  # noqa: E402
from stratify.errors import ConfigError, RegistryError  # noqa: E402
from stratify.experiment import Experiment, build_experiment  # noqa: E402
from stratify.flower import apps, node  # noqa: E402
from stratify.flower.apps import run_summary  # noqa: E402
from stratify.flower.deploy import node_config  # noqa: E402
from stratify.flower.keys import (  # noqa: E402
    FederationKeys,
    main,
    read_federation_keys,
    write_federation_keys,
)
from stratify.flower.link import ClientLostError, NodeLink  # noqa: E402
from stratify.flower.messages import (  # noqa: E402
    HELLO,
    MATCHES,
    SECURE_PROTOCOLS,
    TOTAL,
    check_flower_config,
    config_json,
    flower_methods,
    read_indices,
)
from stratify.flower.run_config import run_config_of  # noqa: E402
from stratify.flower.server import (  # noqa: E402
    FlowerRun,
    RemoteTrainer,
    register_over_flower,
    run_over_link,
)
from stratify.flower.simulation import ray_init_args, simulate  # noqa: E402
from stratify.method import EpochStats  # noqa: E402
from stratify.nn.models import build_model  # noqa: E402
from stratify.registry import OrderKey, RegistrySecrets, make_registry  # noqa: E402
from stratify.registry.ckks import (  # noqa: E402
    BLIND_PLAIN_MODULUS,
    COUNT_LIMIT,
    KeyedLabelHash,
    ProtocolStats,
)
from stratify.registry.ckks.protocols import PackedLayout  # noqa: E402
from stratify.registry.client_secrets import write_secret_file  # noqa: E402
from stratify.stratify import Stratify  # noqa: E402

#: every case: digits over three Dirichlet clients, batch mode unless it says otherwise,
#: the plain registry
CASES = {
    "stratify": {"algorithm": "stratify", "epochs": 2, "options": {"batch_labels": 128}},
    # the model hops from holder to holder, relayed by the server, a chunk at most a hop
    "stratify-hops": {
        "algorithm": "stratify",
        "mode": "single-sample",
        "epochs": 1,
        "lr": 0.05,
        "options": {"chunk": 5, "repeat_count": 6},
    },
    "fedavg": {"algorithm": "fedavg", "epochs": 2, "options": {"local_epochs": 1}},
    "fedprox": {"algorithm": "fedprox", "epochs": 1, "options": {"local_epochs": 1, "mu": 0.5}},
    "scaffold": {"algorithm": "scaffold", "epochs": 2, "options": {"local_epochs": 1}},
    # the encrypted registry, each party on its own node (client 0's is the key holder)
    "stratify-secure": {
        "algorithm": "stratify",
        "epochs": 1,
        "options": {"batch_labels": 128},
        "secure": True,
        "protocol": "packed-blind",
    },
    "stratify-packed": {
        "algorithm": "stratify",
        "epochs": 1,
        "options": {"batch_labels": 128},
        "secure": True,
        "protocol": "packed",
    },
}
SECURE = ["stratify-secure", "stratify-packed"]
#: float32 sums in another order (one forward per client's share): well below what a
#: wrong sample, step or weight moves (the runs move the weights by 0.03 to 0.5)
TOLERANCE = 1e-5


def config(case: str) -> TrainConfig:
    settings = {
        "dataset": "digits",
        "clients": 3,
        "partition": "dirichlet:0.5",
        "mode": "batch",
        "secure": False,
        "seed": 3,
        "device": "cpu",
    }
    return TrainConfig(**{**settings, **CASES[case]})


#: each node's own order key, written to the nodes' order-key files (:func:`order_dir`)
#: so that the in-process run can be given the same ones: a node without such a file
#: draws its own and no one else can know it
ORDER_KEYS = {client: OrderKey.draw() for client in range(3)}


def experiment(config: TrainConfig, keys: FederationKeys) -> Experiment:
    """The in-process run; a secure one with the federation's shared secret and the
    nodes' own order keys."""
    secrets = RegistrySecrets(keys.secrets, ORDER_KEYS)
    registry = make_registry(config.secure, config.seed, config.protocol, secrets=secrets)
    return build_experiment(config, registry=registry if config.secure else None)


def in_process(
    config: TrainConfig, keys: FederationKeys, batches: list | None = None
) -> tuple[dict[str, torch.Tensor], list[EpochStats]]:
    """The in-process run's final state and epochs; with ``batches``, every global batch
    appended to it as ``(state before it, samples, clients)``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        built = experiment(config, keys)
        if batches is not None:
            trainer = built.engine.context.trainer
            inner = trainer.batch_gradient

            def recording(
                model: torch.nn.Module,
                samples: np.ndarray,
                clients: np.ndarray,
                fused: bool = True,
                divisor: int | None = None,
            ) -> float:
                state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                batches.append((state, samples.copy(), clients.copy()))
                return inner(model, samples, clients, fused, divisor)

            trainer.batch_gradient = recording  # type: ignore[method-assign]
        stats = [built.engine.run_epoch(epoch) for epoch in range(1, config.epochs + 1)]
    finally:
        torch.set_num_threads(threads)
    return built.model.state_dict(), stats


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("federation") / "keys.json"
    write_federation_keys(path)
    return path


@pytest.fixture(scope="module")
def keys(key_file: Path) -> FederationKeys:
    """What the clients hold: the test may read it, the server may not."""
    return read_federation_keys(key_file)


@pytest.fixture(scope="module")
def order_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The nodes' order-key files, ``client-K.json``: each node's own, nobody else's."""
    folder = tmp_path_factory.mktemp("order-keys")
    for client, key in ORDER_KEYS.items():
        write_secret_file(folder / f"client-{client}.json", key.to_bytes())
    return folder


@pytest.fixture(scope="module")
def runs(key_file: Path, order_dir: Path) -> dict:
    configs = [config(case) for case in CASES]
    # a node's first answer waits for its Ray worker to start (torch and Flower imported):
    # beside two busy processes on two cores no node had answered after 60 s
    return dict(
        zip(
            CASES,
            simulate(configs, timeout=300, keys=key_file, record=True, order_keys=order_dir),
        )
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_simulated_run_ends_with_the_in_process_weights(
    runs: dict, keys: FederationKeys, case: str
) -> None:
    state, _ = in_process(config(case), keys)
    start = build_experiment(config(case)).model.state_dict()
    flower = runs[case].state
    assert set(flower) == set(state)
    moved = max(float((state[key] - start[key]).abs().max()) for key in state)
    assert moved > 1e-2, "the run must train for the comparison to mean something"
    difference = max(float((state[key] - flower[key]).abs().max()) for key in state)
    assert difference < TOLERANCE, first_divergence(case, runs[case], keys)


def first_divergence(case: str, flower: FlowerRun, keys: FederationKeys) -> str:
    """Where the in-process run and the Flower run part (a failure's diagnosis): the first
    global batch whose model state before it, samples or clients differ. A failure of the
    secure cases was seen once, beside a second suite on two cores, and could not be
    reproduced in 52 runs with fresh keys; this says where to look if it comes back."""
    if not flower.batches:
        return f"{case}: the Flower run recorded no global batch to compare"
    batches: list[tuple[dict[str, torch.Tensor], np.ndarray, np.ndarray]] = []
    in_process(config(case), keys, batches)
    members = build_experiment(config(case)).federation.client_indices
    offsets = np.concatenate([[0], np.cumsum([len(m) for m in members])])
    for number, ((state, samples, clients), theirs) in enumerate(zip(batches, flower.batches)):
        positions = np.array(
            [int(np.flatnonzero(members[c] == s)[0]) + offsets[c] for s, c in zip(samples, clients)]
        )
        apart = max(float((state[k] - theirs["state"][k]).abs().max()) for k in state)
        same_samples = np.array_equal(positions, theirs["samples"])
        same_clients = np.array_equal(clients, theirs["clients"])
        if apart > TOLERANCE / 10 or not same_samples or not same_clients:
            return (
                f"{case}: batch {number} of {len(batches)} (Flower: {len(flower.batches)}) "
                f"differs: state before it {apart:.3g} apart, same samples {same_samples}, "
                f"same clients {same_clients}"
            )
    return (
        f"{case}: all {len(batches)} batches (Flower: {len(flower.batches)}) start from the "
        "same state with the same samples and clients: the last step differs"
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", ["stratify", "stratify-hops", "fedavg", "fedprox"])
def test_the_messages_carry_the_transfers_the_engine_counts(
    runs: dict, keys: FederationKeys, case: str
) -> None:
    _, stats = in_process(config(case), keys)
    run = runs[case]
    assert run.traffic.transfers == sum(epoch.transfers for epoch in stats) > 0
    assert run.traffic.uploads == sum(epoch.uploads for epoch in stats)
    assert [epoch.transfers for epoch in run.epochs] == [epoch.transfers for epoch in stats]
    assert len(run.seconds) == len(run.accuracies) == config(case).epochs


def test_every_method_whose_card_claims_flower_is_compared_with_its_in_process_run() -> None:
    # the claim (MethodCard.flower) is what lets a method run over Flower; the simulated
    # runs above check it, so each claiming method has a case there
    claimed = set(flower_methods())
    assert claimed == {"stratify", "fedavg", "fedprox", "scaffold"}
    assert claimed <= {settings["algorithm"] for settings in CASES.values()}


@pytest.mark.slow
def test_simulated_nodes_run_at_the_simulating_process_priority() -> None:
    """Ray renices its workers by +15 unless told otherwise: beside two busy processes on
    two cores a node then got a few percent of a core and the suite's SecAgg+ runs timed
    out at their first exchange. A worker of the cluster ``simulate`` starts keeps ours."""
    import os

    import ray

    assert not ray.is_initialized()
    ray.init(**ray_init_args(1))
    try:

        @ray.remote(num_cpus=1)
        def niceness() -> int:
            return os.nice(0)

        assert ray.get(niceness.remote(), timeout=600) == os.nice(0)
    finally:
        ray.shutdown()


def test_a_flower_run_refuses_what_it_cannot_carry() -> None:
    check_flower_config(TrainConfig(dataset="digits", mode="batch", secure=True))
    with pytest.raises(ConfigError, match="runs --protocol packed-blind or packed, not naive"):
        check_flower_config(
            TrainConfig(dataset="digits", mode="batch", secure=True, protocol="naive-blind")
        )
    with pytest.raises(ConfigError, match="needs the federation's key file"):
        simulate([TrainConfig(dataset="digits", mode="batch", secure=True)])
    with pytest.raises(ConfigError, match="validation"):
        check_flower_config(
            TrainConfig(dataset="digits", mode="batch", secure=False, validation=0.1)
        )
    with pytest.raises(ConfigError, match="batch only"):
        check_flower_config(
            TrainConfig(dataset="digits", algorithm="fedavg", mode="single-sample", secure=False)
        )
    with pytest.raises(ConfigError, match="no momentum"):
        check_flower_config(
            TrainConfig(
                dataset="digits", mode="single-sample", secure=False, options={"momentum": 0.5}
            )
        )
    with pytest.raises(ConfigError, match="fedavgm does not run over Flower"):
        check_flower_config(
            TrainConfig(dataset="digits", algorithm="fedavgm", mode="batch", secure=False)
        )


def test_a_global_batch_of_a_model_with_torch_batchnorm_is_refused() -> None:
    # torch's BatchNorm has no sums to exchange: refused before any message is sent
    trainer = RemoteTrainer(None, [2, 2], torch.zeros(4, FEATURES), torch.zeros(4))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="use --norm sumbn"):
        trainer.batch_gradient(bn_mlp(), np.arange(4), np.array([0, 0, 1, 1]))


def test_hops_through_a_remote_trainer_never_take_the_compiled_or_vectorised_step() -> None:
    # both read the samples on the server, which holds only stand-ins
    engine = tiny_engine(Stratify(compile="on"), mlp(), mode="single-sample")
    strategy, context = engine.strategy, engine.context
    assert isinstance(strategy, Stratify) and strategy.uses_compiled_step(context)
    rounds = strategy.configure_rounds(context, 1, np.random.default_rng(0))
    assert strategy.local_work(context, list(rounds)[0], np.random.default_rng(0))
    context.trainer = RemoteTrainer(None, [3, 5], context.x_train, context.y_train)  # type: ignore[arg-type]
    assert not strategy.uses_compiled_step(context)
    assert strategy.local_work(context, list(rounds)[0], np.random.default_rng(0)) is None


def clients_labels(built: Experiment) -> list[np.ndarray]:
    """The label of each client's samples, in the node's order of its positions."""
    labels = built.dataset.y_train.cpu().numpy()
    return [labels[np.asarray(indices)] for indices in built.federation.client_indices]


def label_codes(keys: FederationKeys, labels: list[np.ndarray]) -> set[int]:
    """The clients' HMAC codes of their labels (computed with the key file)."""
    code = KeyedLabelHash(keys.secrets.hash_key)
    return {code(label) for label in np.unique(np.concatenate(labels)).tolist()}


def record_values(content: RecordDict) -> Iterator[Any]:
    """Every value a message carries: config values (a list's items one by one when they
    are bytes or text) and arrays."""
    for record in content.values():
        if isinstance(record, ConfigRecord):
            for value in record.values():
                if isinstance(value, list) and value and isinstance(value[0], (bytes, str)):
                    yield from value
                else:
                    yield value
        elif isinstance(record, ArrayRecord):
            for array in record.values():
                yield array.numpy()


def server_view_leaks(run: FlowerRun, labels: list[np.ndarray], codes: set[int]) -> list[str]:
    """What the server could read of the clients' labels in every message it sent and
    received and in its registry: label codes in the clear (as integers, in text, or as
    int64 bytes in a blob), a pair of sequences in one message that tabulates a client's
    labels against their counts or placeholders, a client's labels sample by sample, and
    a registry holding a client's label -> placeholder map. One finding per leak."""
    assert run.payloads and run.registry is not None and run.placeholders is not None
    ends = np.cumsum([len(own) for own in labels])[:-1]
    truths = []
    for own, placeholders in zip(labels, np.split(run.placeholders, ends)):
        values, counts = np.unique(own, return_counts=True)
        mapping = dict(zip(own.tolist(), placeholders.tolist()))
        truths.append((dict(zip(values.tolist(), counts.tolist())), mapping, own.tolist()))
    patterns = [code.to_bytes(8, "little") for code in codes]
    findings = []
    for direction, kind, content in run.payloads:
        where = f"{kind} ({direction})"
        sequences = []
        for value in record_values(content):
            if isinstance(value, bytes):
                if any(pattern in value for pattern in patterns):
                    findings.append(f"{where}: a label code in a blob")
            elif isinstance(value, str):
                if any(str(code) in value for code in codes):
                    findings.append(f"{where}: a label code in text")
            else:
                array = np.asarray(value).ravel()
                if array.dtype.kind not in "iu":
                    continue
                sequence = array.astype(np.int64).tolist()
                if codes & set(sequence):
                    findings.append(f"{where}: a label code")
                sequences.append(sequence)
        for first in sequences:
            for client, (counts, mapping, own) in enumerate(truths):
                if first == own:
                    findings.append(f"{where}: client {client}'s label of every sample")
                for second in sequences:
                    if second is first or len(second) != len(first):
                        continue
                    table = dict(zip(first, second))
                    if table == counts:
                        findings.append(f"{where}: client {client}'s labels and their counts")
                    if table == mapping:
                        findings.append(f"{where}: client {client}'s label -> placeholder map")
    for client, (_, mapping, _) in enumerate(truths):
        if run.registry.client_maps[client] == mapping:
            findings.append(f"the server's registry: client {client}'s label -> placeholder map")
    return findings


@pytest.mark.slow
@pytest.mark.parametrize("case", SECURE)
def test_a_secure_registration_over_flower_is_the_in_process_one(
    runs: dict, keys: FederationKeys, case: str
) -> None:
    built = experiment(config(case), keys)
    run = runs[case]
    maps = built.placeholders.client_maps
    expected = [
        maps[client][label]
        for client, own in enumerate(clients_labels(built))
        for label in own.tolist()
    ]
    assert run.placeholders.tolist() == expected
    assert run.registry.num_placeholders == built.placeholders.num_placeholders == 10
    assert np.array_equal(run.registry.global_counts, built.placeholders.global_counts)


@pytest.mark.slow
@pytest.mark.parametrize("case", SECURE)
def test_the_server_of_a_secure_run_cannot_read_a_label(
    runs: dict, keys: FederationKeys, case: str
) -> None:
    run = runs[case]
    labels = clients_labels(experiment(config(case), keys))
    assert {kind for _, kind, _ in run.payloads} >= {MATCHES, TOTAL, "train.gradient"}
    # the secret placeholders are not the labels, else a map to themselves would be one
    offsets = np.cumsum([0] + [len(own) for own in labels])
    assert any(
        (run.placeholders[offsets[k] : offsets[k + 1]] != own).any() for k, own in enumerate(labels)
    )
    assert server_view_leaks(run, labels, label_codes(keys, labels)) == []


@pytest.mark.slow
def test_the_same_check_reads_the_labels_the_plain_registry_sends(
    runs: dict, keys: FederationKeys
) -> None:
    run = runs["stratify"]
    labels = clients_labels(experiment(config("stratify"), keys))
    findings = "\n".join(server_view_leaks(run, labels, label_codes(keys, labels)))
    for leak in (
        "labels and their counts",
        "query.placeholders (sent): client 2's label ->",
        "the server's registry: client 0's label -> placeholder map",
    ):
        assert leak in findings


def key_holder_readings(
    run: FlowerRun, keys: FederationKeys, codes: set[int]
) -> tuple[list[str], list[int]]:
    """Decrypt, as the key holder does, every comparison and total the server sent it, and
    look for label codes, differences of two codes and the global counts; returns the
    findings and every non-zero compared value."""
    holder = keys.key_holder(run.config.protocol)
    readable = codes | {-code for code in codes} | {a - b for a in codes for b in codes if a != b}
    findings, nonzero = [], []
    for direction, kind, content in run.payloads:
        if direction != "sent" or kind not in (MATCHES, TOTAL):
            continue
        settings = content.config_records["registry"]
        if kind == MATCHES:
            compared = content.config_records["compared"]
            layout = PackedLayout(int(settings["block_size"]), holder.data_slots)
            for blob, labels in zip(compared["vectors"], compared["labels"]):
                values = np.rint(holder.decrypt(blob, "test", holder.hash_range, ProtocolStats()))
                values = values.astype(np.int64)
                seen = set(values.tolist()) | set((values - BLIND_PLAIN_MODULUS).tolist())
                if seen & readable:
                    findings.append("codes or their differences")
                rows = layout.rows(values, int(labels), int(settings["num_unique"])).ravel()
                nonzero.extend(rows[rows != 0].tolist())
        else:
            blob = content.config_records["total"]["vector"]
            values = np.rint(holder.decrypt(blob, "test", COUNT_LIMIT, ProtocolStats()))
            assert run.registry is not None
            if (values[: run.registry.num_placeholders] == run.registry.global_counts).any():
                findings.append("the global counts")
    return findings, nonzero


@pytest.mark.slow
def test_with_packed_blind_the_key_holder_decrypts_match_bits_only(
    runs: dict, keys: FederationKeys
) -> None:
    labels = clients_labels(experiment(config("stratify-secure"), keys))
    codes = label_codes(keys, labels)
    findings, nonzero = key_holder_readings(runs["stratify-secure"], keys, codes)
    assert findings == []
    # the non-matches it sees are uniform over [1, t), whatever the labels
    assert len(nonzero) > 100
    uniform = scipy_stats.kstest(np.array(nonzero) / BLIND_PLAIN_MODULUS, "uniform")
    assert uniform.pvalue > 1e-4
    # unblinded (packed, CKKS), the same check reads the codes and the counts
    findings, _ = key_holder_readings(runs["stratify-packed"], keys, codes)
    assert "codes or their differences" in findings and "the global counts" in findings


def test_a_federation_key_file_is_for_the_clients_alone(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    assert main([str(path)]) == 0
    assert path.stat().st_mode & 0o077 == 0, "readable by its owner only"
    keys = read_federation_keys(path)
    for protocol in SECURE_PROTOCOLS:
        public = keys.key_holder(protocol).public_context()
        assert not tenseal.context_from(public).has_secret_key()
    (tmp_path / "foreign.json").write_text('{"format": 1, "secret": "00"}')
    with pytest.raises(ConfigError, match="is not a federation key file"):
        read_federation_keys(tmp_path / "foreign.json")
    with pytest.raises(ConfigError, match="cannot read the federation key file"):
        read_federation_keys(tmp_path / "missing.json")


class HandlerLink(NodeLink):
    """The server's end of the messages, each delivered straight to the node's handler in
    this process, with the node configuration a deployed SuperNode parses from its
    ``--node-config`` (no Ray, no SuperLink)."""

    HANDLERS = {
        "query.hello": node.hello,
        "query.labels": node.labels,
        "query.unique": node.unique,
        "query.matches": node.matches,
        "query.counts": node.counts,
        "query.total": node.total,
        "query.placeholders": node.placeholders,
        "train.gradient": node.gradient,
        "train.norm": node.norm,
    }

    def __init__(self, config: TrainConfig, node_configs: list[dict]) -> None:
        super().__init__(None, config, timeout=1.0, retries=0)  # type: ignore[arg-type]
        self.node_configs = node_configs
        self.nodes = {client: client for client in range(config.clients)}

    def exchange(self, requests: Sequence[tuple[int, str, RecordDict]]) -> list[RecordDict]:
        replies = []
        for client, kind, content in requests:
            message = self.message(client, kind, RecordDict(dict(content)))
            context = Context(
                run_id=1,
                node_id=client,
                node_config=self.node_configs[client],
                state=RecordDict(),
                run_config={},
            )
            replies.append(self.HANDLERS[kind](message, context).content)
        return replies


def sumbn_batch(
    job: TrainConfig,
) -> tuple[list[int], np.ndarray, np.ndarray, torch.Tensor, torch.Tensor]:
    """A global batch over the three nodes that loaded ``job``'s data (after their
    hellos): every client's size, the batch's server positions and owners, and the
    nodes' samples and labels laid end to end, as the server's positions count them."""
    held = [node._NODES[(client, config_json(job))] for client in range(job.clients)]
    sizes = [held_node.size for held_node in held]
    assert min(sizes) >= 40
    shares = [np.arange(3, 40, 3), np.arange(0, 25), np.arange(5, 30, 2)]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    samples = np.concatenate([share + offsets[k] for k, share in enumerate(shares)])
    clients = np.repeat(np.arange(3), [len(share) for share in shares])
    x_all = torch.cat([h.trainer.x_train for h in held])
    y_all = torch.cat([h.trainer.y_train for h in held])
    return sizes, samples, clients, x_all, y_all


def test_a_global_batch_with_sum_based_batchnorm_over_the_nodes_equals_the_union(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stratify's batch mode with --norm sumbn: the server asks the three nodes for their
    BatchNorm sums, adjoints and gradients, message by message (delivered to the nodes'
    handlers), and gets BatchNorm's gradient on the union of their shares."""
    for name in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)
    monkeypatch.setattr(node, "_NODES", {})
    job = TrainConfig(
        **{**dataclasses.asdict(config("stratify")), "model": "resnet20", "norm": "sumbn"}
    )
    link = HandlerLink(job, [{"partition-id": client} for client in range(job.clients)])
    hellos = link.exchange([(client, HELLO, RecordDict()) for client in range(job.clients)])
    assert len(hellos) == 3
    sizes, samples, clients, x_all, y_all = sumbn_batch(job)
    torch.manual_seed(0)
    model = build_model("resnet20", tuple(x_all.shape[1:]), 10, norm="sumbn")
    initial = copy.deepcopy(model)
    expected = accumulate_batch_gradient(copy.deepcopy(model), x_all, y_all, samples, clients)
    trainer = RemoteTrainer(link, sizes, torch.zeros_like(x_all), torch.zeros(len(x_all)))
    sent = link.traffic.messages
    loss = trainer.batch_gradient(model, samples, clients)
    assert loss == pytest.approx(expected, rel=1e-5)
    assert_batchnorm_gradient_as_close_as_in_process(model, initial, x_all, y_all, samples, clients)
    # 19 layers: (19 + 19 + 1) exchanges, one message to each of the 3 participants
    assert link.traffic.messages - sent == 3 * (2 * 19 + 1)


def assert_batchnorm_gradient_as_close_as_in_process(
    exchanged: torch.nn.Module,
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    samples: np.ndarray,
    clients: np.ndarray,
) -> None:
    """``exchanged``'s gradient and running statistics (one global batch through the
    nodes) against the same batch in float64 in-process from ``model``'s state: no
    further than the in-process float32 layer is. On `digits` some ResNet-20 channels
    have a variance near zero, where float32 BatchNorm gradients move by up to ~1% with
    the summation order (the thread count), in-process too."""
    truth, reference = copy.deepcopy(model).double(), copy.deepcopy(model)
    accumulate_batch_gradient(truth, x.double(), y, samples, clients)
    accumulate_batch_gradient(reference, x, y, samples, clients)

    def error(trained: torch.nn.Module) -> float:
        return max(
            float((p.grad.double() - t.grad).abs().max() / t.grad.abs().max())
            for p, t in zip(trained.parameters(), truth.parameters())
        )

    assert error(exchanged) <= 2 * error(reference) + 1e-5
    for (name, value), wanted in zip(exchanged.state_dict().items(), truth.state_dict().values()):
        if "running" in name or "num_batches" in name:
            assert torch.allclose(value.double(), wanted.double(), atol=1e-5), name


class DyingLink(HandlerLink):
    """:class:`HandlerLink` whose client ``dies`` stops answering after its ``answers``-th
    global-batch message: an exchange holding a request to it then fails as
    :meth:`NodeLink.exchange` fails after its retries."""

    def __init__(
        self, config: TrainConfig, dies: int, answers: int, kind: str = "train.gradient"
    ) -> None:
        super().__init__(config, [{"partition-id": k} for k in range(config.clients)])
        self.dies, self.answers, self.kind = dies, answers, kind
        self.asked: list[tuple[int, str]] = []
        #: the samples of the global-batch gradients answered
        self.trained = 0

    def connect(self) -> list[RecordDict]:
        return self.exchange([(client, HELLO, RecordDict()) for client in range(3)])

    def exchange(self, requests: Sequence[tuple[int, str, RecordDict]]) -> list[RecordDict]:
        self.asked += [(client, kind) for client, kind, _ in requests]
        asked = sum(client == self.dies and kind == self.kind for client, kind in self.asked)
        if any(client == self.dies for client, _, _ in requests) and asked > self.answers:
            raise ClientLostError(
                f"client {self.dies} (node {self.dies}): no reply within 1 s; sent 1 times",
                [self.dies],
            )
        self.trained += sum(
            len(read_indices(content.array_records["share"], "positions"))
            for _, kind, content in requests
            if kind == "train.gradient"
        )
        return super().exchange(requests)


@pytest.mark.parametrize("on_lost", ["stop", "drop"])
def test_a_client_lost_in_a_global_batch_stops_the_run_or_leaves_the_pools(
    monkeypatch: pytest.MonkeyPatch, on_lost: str
) -> None:
    """Client 2 stops answering in its 4th global batch of epoch 1: with on-lost stop the
    run stops naming it; with drop the batch goes on with the others, client 2 is asked
    nothing more, and from epoch 2 the schedule plans none of its samples."""
    for name in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)
    monkeypatch.setattr(node, "_NODES", {})
    job = config("stratify")
    link = DyingLink(job, dies=2, answers=3)
    if on_lost == "stop":
        with pytest.raises(ClientLostError, match="client 2 "):
            run_over_link(link, job, on_lost)
        return
    run = run_over_link(link, job, on_lost)
    assert list(run.dropped) == [2] and run.dropped[2]["epoch"] == 1
    assert "client 2 (node 2)" in run.dropped[2]["reason"]
    batches = [kind for client, kind in link.asked if kind == "train.gradient"]
    to_two = [
        i for i, (client, kind) in enumerate(link.asked) if client == 2 and kind == "train.gradient"
    ]
    assert len(to_two) == 4  # three answered, the fourth lost, none after
    assert len(batches) > to_two[-1] + 10  # the run went on: epoch 1's rest and epoch 2
    assert len(run.epochs) == 2 and run.epochs[1].steps > 0
    assert np.isfinite(run.epochs[1].train_loss)
    # the budget counts the samples trained, not those planned for the dropped client
    assert sum(epoch.sample_gradients for epoch in run.epochs) == link.trained
    # epoch 2's schedule skips the entries of placeholders only client 2 held, which
    # epoch 1 could still draw from its pools
    assert run.epochs[1].skipped > run.epochs[0].skipped
    # result.json's epochs add up to the traffic the messages carried (50 against 42
    # before: epoch 1 counted client 2's planned shares after it was lost)
    epochs = run_summary(run)["epochs"]
    assert sum(epoch["transfers"] for epoch in epochs) == run.traffic.transfers > 0
    assert sum(epoch["uploads"] for epoch in epochs) == run.traffic.uploads


def test_a_client_lost_amid_the_batchnorm_exchanges_leaves_the_batch_to_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Client 2 stops answering at its 26th BatchNorm exchange, among a global batch's
    adjoints (after all 19 layers' sums were folded into the running statistics): the
    batch starts again without it, those statistics undone, and ends as BatchNorm on the
    union of the other two shares."""
    for name in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)
    monkeypatch.setattr(node, "_NODES", {})
    job = TrainConfig(
        **{**dataclasses.asdict(config("stratify")), "model": "resnet20", "norm": "sumbn"}
    )
    link = DyingLink(job, dies=2, answers=25, kind="train.norm")
    link.connect()
    sizes, samples, clients, x_all, y_all = sumbn_batch(job)
    torch.manual_seed(0)
    model = build_model("resnet20", tuple(x_all.shape[1:]), 10, norm="sumbn")
    initial = copy.deepcopy(model)
    kept = clients < 2
    expected = accumulate_batch_gradient(
        copy.deepcopy(model), x_all, y_all, samples[kept], clients[kept]
    )
    trainer = RemoteTrainer(
        link, sizes, torch.zeros_like(x_all), torch.zeros(len(x_all)), on_lost="drop"
    )
    loss = trainer.batch_gradient(model, samples, clients)
    assert list(trainer.dropped) == [2]
    assert loss == pytest.approx(expected, rel=1e-5)
    assert_batchnorm_gradient_as_close_as_in_process(
        model, initial, x_all, y_all, samples[kept], clients[kept]
    )


def test_on_lost_drop_is_for_stratifys_batch_mode() -> None:
    with pytest.raises(ConfigError, match="Stratify's batch mode only"):
        run_over_link(None, config("fedavg"), on_lost="drop")  # type: ignore[arg-type]


def test_a_deployed_node_loads_the_key_file_its_node_config_names(
    monkeypatch: pytest.MonkeyPatch, key_file: Path, keys: FederationKeys, order_dir: Path
) -> None:
    # a message is made inside a Flower task, whose identity the runtime sets
    for name in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)
    monkeypatch.setattr(node, "_NODES", {})  # the nodes' data, as a fresh node process holds
    job = config("stratify-secure")
    node_configs = [
        parse_config_args([node_config(k, key_file, order_dir / f"client-{k}.json")])
        for k in range(job.clients)
    ]
    assert node_configs[1] == {
        "partition-id": 1,
        "registry-keys": str(key_file),
        "order-key": str(order_dir / "client-1.json"),  # its own order key, nobody else's
    }
    link = HandlerLink(job, node_configs)
    hellos = link.exchange([(client, HELLO, RecordDict()) for client in range(job.clients)])
    result, placeholders = register_over_flower(link, job, hellos, num_classes=10)
    built = experiment(job, keys)
    assert np.array_equal(result.global_counts, built.placeholders.global_counts)
    maps = built.placeholders.client_maps
    own = clients_labels(built)
    assert placeholders.tolist() == [
        maps[k][y] for k in range(job.clients) for y in own[k].tolist()
    ]
    # without a key file, a secure run's node refuses in its hello
    link = HandlerLink(job, [{"partition-id": k} for k in range(job.clients)])
    monkeypatch.setattr(node, "_NODES", {})
    with pytest.raises(ConfigError, match="needs the federation key file"):
        link.exchange([(0, HELLO, RecordDict())])
    with pytest.raises(ConfigError, match="no quote"):
        node_config(0, 'keys".json')


def test_a_deployed_server_app_reports_a_refused_registration(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def refused(*args: object, **kwargs: object) -> None:
        raise RegistryError("client 2 brings unique label number 11, more than the bound")

    monkeypatch.setattr(apps, "run_on_grid", refused)
    settings = {**run_config_of(config("stratify-secure")), "result-dir": str(tmp_path)}
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=settings)
    apps.server_main(None, context)  # type: ignore[arg-type]
    failure = json.loads((tmp_path / "failure.json").read_text())
    assert failure["error"].startswith("client 2 brings unique label number 11")
