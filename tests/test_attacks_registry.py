"""Attacks on the registry's outputs (stratify.privacy.registry_attacks), each run on a
leaky variant, where it must succeed, and on the defended one (docs/privacy.md, "Threat
model"):

* a stream's row order: the server guesses "row i is the i-th label in natural order";
  exact on a class-ordered stream with arrival-order rows, at chance with keyed rows. The
  time at which each row first has a sample still gives a class-ordered stream away:
  keyed rows do not defend that.
* a server with one public labelled sample per class runs the model it holds on them:
  keyed rows do not defend it either.
* frequency analysis of the exact global counts the server schedules with.
* the key holder as a client: its own labels and the match bits name other clients'.

Run as ``python tests/test_attacks_registry.py`` to print every figure (mean over 3 seeds).
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
from collections.abc import Sequence

import numpy as np
import pytest

from stratify.privacy.registry_attacks import (
    arrival_rows,
    binomial_pmf,
    chance_bound,
    coarsen,
    first_appearance_recovery,
    held_share_named,
    named_from_match_rows,
    natural_order_recovery,
    public_sample_rows,
    rank_match,
)
from stratify.registry.base import STREAM_BLOCK, stream_placeholder
from stratify.stream import Event, StreamConfig, StreamLearner

CLASSES = 10
#: the figures' seeds (the tests use the first)
SEEDS = (0, 1, 2)


# -- the pure functions, against hand-computed values ------------------------------------


def test_chance_bound_is_the_binomial_upper_quantile():
    # B(10, 0.1): P(X >= 5) = 0.00163, P(X >= 6) = 0.000147
    assert chance_bound(10, 0.1, alpha=1e-3) == 0.5
    assert chance_bound(10, 0.1, alpha=1e-2) == 0.4
    assert chance_bound(1, 0.5, alpha=0.6) == 0.0
    assert chance_bound(4, 1.0, alpha=1e-3) == 1.0
    assert binomial_pmf(10, 5, 0.1) == pytest.approx(math.comb(10, 5) * 0.1**5 * 0.9**5)
    assert 0.1 < chance_bound(6000, 0.1) < 0.12  # sd 0.0039: 3.1 sd above 0.10


def test_row_order_guesses_by_hand():
    assert arrival_rows([2, 0, 2, 1]) == {2: 0, 0: 1, 1: 2}
    assert natural_order_recovery(arrival_rows([2, 0, 2, 1])) == 0.0
    assert natural_order_recovery(arrival_rows([0, 0, 1, 2, 1])) == 1.0
    assert natural_order_recovery({"a": 1, "b": 0, "c": 2}) == pytest.approx(1 / 3)
    # rows 5, 3, 9 first trained at events 0, 4, 7: named 0, 1, 2
    assert first_appearance_recovery({0: 5, 1: 3, 2: 9}, {0: 0, 1: 4, 2: 7}) == 1.0
    assert first_appearance_recovery({0: 5, 1: 3, 2: 9}, {0: 4, 1: 0, 2: 7}) == pytest.approx(1 / 3)


def test_public_sample_rows_is_the_best_assignment():
    # class 0 scores rows (2, 1, 0) highest in that order; class 1 wants row 2 as well, more
    scores = np.array([[0.0, 0.5, 1.0], [0.0, 0.0, 3.0], [2.0, 0.0, 0.0]])
    assert public_sample_rows(scores).tolist() == [1, 2, 0]


def test_rank_match_and_coarsening_by_hand():
    observed = np.array([30, 10, 20])  # placeholders 0, 1, 2 hold classes 2, 0, 1
    assert rank_match(observed, np.array([100, 200, 300])).tolist() == [2, 0, 1]
    assert coarsen(np.array([149, 150, 151, 174]), 50).tolist() == [150, 150, 150, 150]
    assert coarsen(observed, 1).tolist() == observed.tolist()
    # all tied: a random assignment, each seed one
    guesses = {tuple(rank_match(np.zeros(3), np.arange(3), seed=s)) for s in range(30)}
    assert len(guesses) == 6


def test_held_share_and_naming_by_hand():
    labels = [{0, 1}, {1, 2}, {3}]
    assert held_share_named(labels) == pytest.approx(1 / 3)  # (1, 1) of 3 pairs
    # the key holder's row matched unique labels 4 and 7, which are its labels 1 and 0
    rows = [[4, 7], [7, 2], [5]]
    assert named_from_match_rows(rows, [1, 0]) == [{4: 1, 7: 0}, {7: 0}, {}]


# -- a stream's rows ---------------------------------------------------------------------


def cluster(label: int, rng: np.random.Generator, features: int = 12) -> np.ndarray:
    x = rng.normal(0.0, 0.5, size=features).astype(np.float32)
    x[label % features] += 3.0
    return x


def stream_labels(order: str, per_class: int, seed: int) -> list[int]:
    """``class``: every class's samples, class by class in natural order; ``random``: the
    same samples shuffled."""
    labels = np.repeat(np.arange(CLASSES), per_class)
    if order == "random":
        labels = np.random.default_rng(seed).permutation(labels)
    return labels.tolist()


def run_stream(
    labels: Sequence[int], *, keyed: bool, secure: bool, seed: int, num_classes: int | None
) -> StreamLearner:
    """A stream learner fed ``labels`` (clients round-robin); ``keyed=False`` is the
    earlier arrival-order placement (the leaky variant)."""
    config = StreamConfig(
        secure=secure, device="cpu", seed=seed, num_classes=num_classes, mlp_hidden=(16,)
    )
    learner = StreamLearner(config)
    if not keyed:
        learner.registry.place_stream(None)
    rng = np.random.default_rng(seed)
    for line, label in enumerate(labels, start=1):
        learner.ingest(Event(f"c{line % 3}", label, cluster(label, rng), line))
    return learner


def server_rows(learner: StreamLearner) -> dict[int, int]:
    """Each label's classifier row, and (checked) its placeholder: what the server sees."""
    rows = {
        label: learner.class_rows.model_rows[index] for index, label in enumerate(learner.classes)
    }
    for mapping in learner.registry.result.client_maps:
        assert all(mapping[label] == rows[label] for label in mapping)
    return rows


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("num_classes", [CLASSES, None])
def test_a_class_ordered_streams_rows_name_its_labels_unless_keyed(keyed, num_classes):
    learner = run_stream(
        stream_labels("class", 6, 0), keyed=keyed, secure=True, seed=0, num_classes=num_classes
    )
    recovery = natural_order_recovery(server_rows(learner))
    if not keyed:
        assert recovery == 1.0  # the earlier placement: row = arrival order = label
    else:
        # the secure registry's key comes from its secrets, drawn from the OS, not the seed
        secrets = learner.registry.secrets
        shared = getattr(secrets, "shared", secrets)
        assert learner.class_rows.row_key == shared.derive(b"stream placeholders")
        assert (
            learner.class_rows.row_key != hashlib.sha256(b"stratify stream placeholders 0").digest()
        )
        assert recovery <= chance_bound(CLASSES, 1 / CLASSES)
    # predictions read the model's known rows and map them back to labels on the client
    # side, keyed or not; and the stream has learned its classes (chance 0.10)
    rng = np.random.default_rng(9)
    hits = 0
    for label in np.repeat(np.arange(CLASSES), 5):
        x = cluster(int(label), rng)
        logits = learner.model.network.logits(learner.features.array(x[None]))[0]
        best = learner.classes[int(np.argmax(logits[learner.class_rows.model_rows]))]
        assert learner.predict_one(x) == best
        hits += best == label
    assert hits >= 25


def test_keyed_rows_are_at_chance_over_many_keys():
    """The natural-order guess over 300 keys (a uniform keyed permutation has one fixed
    point on average): at chance, within the binomial bound; the arrival order, 1.00."""
    trials, matches = 0, 0
    for key in range(300):
        secret = key.to_bytes(32, "big")
        for capacity in (CLASSES, None):
            rows = {i: stream_placeholder(secret, i, capacity) for i in range(CLASSES)}
            assert len(set(rows.values())) == CLASSES
            matches += round(natural_order_recovery(rows) * CLASSES)
            trials += CLASSES
    chance = (1 / CLASSES + 1 / STREAM_BLOCK) / 2  # half over 10 rows, half in blocks of 8
    assert matches / trials <= chance_bound(trials, chance)
    assert matches / trials >= chance / 2  # a placement that avoided fixed points would leak


def test_a_resumed_stream_keeps_its_keyed_rows():
    learner = run_stream(
        stream_labels("random", 3, 1), keyed=True, secure=True, seed=1, num_classes=None
    )
    again = StreamLearner(learner.config)
    again.load_state_dict(learner.state_dict())
    assert (
        again.class_rows.model_rows == learner.class_rows.model_rows
        and again.class_rows.row_key == learner.class_rows.row_key
    )
    assert again.registry.result.client_maps == learner.registry.result.client_maps


def test_a_stream_runs_checkpoint_holding_the_key_is_its_owners_only(tmp_path):
    """checkpoint.pt holds the clients' placement key and buffers: mode 0600; a resumed
    run places labels as before."""
    import json

    from stratify.registry.client_secrets import SECRETS_MODE
    from stratify.runfolder import read_checkpoint
    from stratify.stream.run import StreamRun

    rng = np.random.default_rng(0)
    source = tmp_path / "events.jsonl"
    lines = [
        json.dumps({"client": f"c{i % 3}", "label": int(label), "x": cluster(label, rng).tolist()})
        for i, label in enumerate(stream_labels("class", 4, 0))
    ]
    source.write_text("\n".join(lines[:24]) + "\n")
    out = tmp_path / "run"
    config = StreamConfig(source=str(source), out=str(out), device="cpu", num_classes=CLASSES)
    StreamRun(config).run()
    path = out / "checkpoint.pt"
    assert path.stat().st_mode & 0o777 == SECRETS_MODE
    before = read_checkpoint(path)["learner"]
    assert before["row_key"] is not None
    source.write_text("\n".join(lines) + "\n")
    resumed = StreamRun(config, resume=True)
    resumed.run()
    assert resumed.learner.class_rows.row_key.hex() == before["row_key"]
    known = len(before["classes"])
    key = bytes.fromhex(before["row_key"])
    assert resumed.learner.class_rows.model_rows[:known] == [
        stream_placeholder(key, index, CLASSES) for index in range(known)
    ]
    assert path.stat().st_mode & 0o777 == SECRETS_MODE


def first_events(labels: Sequence[int]) -> dict[int, int]:
    first: dict[int, int] = {}
    for event, label in enumerate(labels):
        first.setdefault(label, event)
    return first


@pytest.mark.parametrize("keyed", [False, True])
def test_when_a_row_first_trains_gives_a_class_ordered_stream_away(keyed):
    """Not defended: the server sees when each placeholder first has a sample; on a
    class-ordered stream that is the label order, keyed or not. On a random-order stream
    it is not."""
    labels = stream_labels("class", 2, 0)
    learner = run_stream(labels, keyed=keyed, secure=False, seed=0, num_classes=CLASSES)
    assert first_appearance_recovery(server_rows(learner), first_events(labels)) == 1.0
    shuffled = stream_labels("random", 2, 0)
    learner = run_stream(shuffled, keyed=keyed, secure=False, seed=0, num_classes=CLASSES)
    # the server's guess is the natural order, the stream's first events are shuffled
    recovery = first_appearance_recovery(server_rows(learner), first_events(shuffled))
    assert recovery <= chance_bound(CLASSES, 1 / CLASSES)


# -- a server with public samples --------------------------------------------------------


def digits_stream(
    order: str, keyed: bool, seed: int, num_classes: int | None = CLASSES
) -> tuple[float, StreamLearner]:
    """One pass of digits' training split as a stream (10 clients), then the server's
    public-sample attack with the first test sample of each class; its recovery."""
    from stratify.data.datasets import load_dataset

    data = load_dataset("digits")
    x, y = data.x_train.numpy().reshape(len(data.y_train), -1), data.y_train.numpy()
    if order == "class":
        order_of = np.argsort(y, kind="stable")
    else:
        order_of = np.random.default_rng(seed).permutation(len(y))
    learner = StreamLearner(StreamConfig(device="cpu", seed=seed, num_classes=num_classes))
    if not keyed:
        learner.registry.place_stream(None)
    for line, index in enumerate(order_of, start=1):
        learner.ingest(Event(f"c{line % 10}", int(y[index]), x[index], line))
    x_test, y_test = data.x_test.numpy().reshape(len(data.y_test), -1), data.y_test.numpy()
    public = np.stack([x_test[np.flatnonzero(y_test == c)[0]] for c in range(CLASSES)])
    # the server holds the model; it is given the features' scaling too (an upper bound)
    logits = learner.model.network.logits(learner.features.array(public))
    guess = public_sample_rows(logits)
    rows = server_rows(learner)
    return float(np.mean([guess[c] == rows[c] for c in range(CLASSES)])), learner


@pytest.mark.parametrize("keyed", [False, True])
def test_public_samples_map_rows_to_labels_keyed_or_not(keyed):
    """Not defended by keyed rows: the model's own outputs on one sample per class name
    the rows (random order: the class-ordered pass forgets early classes)."""
    recovery, learner = digits_stream("random", keyed, SEEDS[0])
    assert recovery >= 0.7
    # the attack needs the trained model: scores that carry nothing of it are at chance
    scores = np.random.default_rng(0).normal(size=(CLASSES, CLASSES))
    rows = server_rows(learner)
    blind = np.mean([public_sample_rows(scores)[c] == rows[c] for c in range(CLASSES)])
    assert blind <= chance_bound(CLASSES, 1 / CLASSES)


# -- global counts -----------------------------------------------------------------------


def federation_counts(labels: np.ndarray, spec: str, seed: int) -> tuple[np.ndarray, list[int]]:
    """The server's exact global count per placeholder after a registration of ``labels``
    split over 10 clients by ``spec`` (plain registry, secrets fixed by ``seed`` so that
    the figures repeat), and the class of
    each placeholder (the truth the server lacks)."""
    from privacy_attacks import fixed_secrets

    from stratify.data.partition import partition
    from stratify.federation import Federation
    from stratify.registry import PlainRegistry

    indices = partition(labels, 10, spec, seed=seed)
    counts = Federation(indices, labels).label_counts()
    result = PlainRegistry(secrets=fixed_secrets(seed)).register(counts)
    truth = [0] * result.num_placeholders
    for mapping in result.client_maps:
        for label, placeholder in mapping.items():
            truth[placeholder] = int(label)
    return result.global_counts, truth


def frequency_recovery(labels: np.ndarray, public: np.ndarray, spec: str, seed: int, step: int = 1):
    observed, truth = federation_counts(labels, spec, seed)
    guess = rank_match(coarsen(observed, step), public, seed=seed)
    return float(np.mean(guess == np.array(truth)))


def dataset_labels(name: str, data_dir: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A dataset's training labels and its public class totals (training split)."""
    from stratify.data.datasets import load_dataset

    data = load_dataset(name, data_dir=data_dir)
    labels = data.y_train.numpy()
    return labels, np.bincount(labels)


@pytest.mark.data
@pytest.mark.parametrize("spec", ["iid", "dirichlet:0.1"])
def test_exact_global_counts_name_every_mnist_placeholder(shared_data_dir, spec):
    """Inherent (the server schedules with the counts): mnist-10k's class totals are
    distinct, so the exact counts name every placeholder, however the clients split
    them; counts rounded to 100 (coarser than any gap between two totals) do not."""
    labels, public = dataset_labels("mnist-10k", shared_data_dir)
    assert len(set(public.tolist())) == CLASSES
    assert frequency_recovery(labels, public, spec, SEEDS[0]) == 1.0
    coarse = np.mean([frequency_recovery(labels, public, spec, s, step=200) for s in range(5)])
    assert coarse < 1.0


def test_exact_global_counts_name_the_digits_placeholders():
    """digits' training totals tie twice (148, and nothing else): all but the tied pair."""
    labels, public = dataset_labels("digits")
    recovery = frequency_recovery(labels, public, "dirichlet:0.5", SEEDS[0])
    assert recovery >= 0.8
    shuffled = np.random.default_rng(0).permutation(public)  # totals of other classes
    assert frequency_recovery(labels, shuffled, "iid", SEEDS[0]) <= chance_bound(CLASSES, 0.1)


# -- the key holder as a client ----------------------------------------------------------


def key_holder_naming(spec: str, seed: int) -> tuple[float, float]:
    """Digits, 10 clients split by ``spec``, through the secure registry's roles: the
    share of the other clients' labels the key holder (client 0) names from the match
    rows it decrypted, and the same share by set algebra (they must agree)."""
    from privacy_attacks import observe

    from stratify.data.partition import partition
    from stratify.federation import Federation
    from stratify.registry.ckks import CKKSRegistry

    labels, _ = dataset_labels("digits")
    counts = Federation(partition(labels, 10, spec, seed=seed), labels).label_counts()
    registry = CKKSRegistry(seed=seed, protocol="packed-blind")
    with observe() as views:
        registry.register(counts)
    own_order = list(registry.encoding_order(counts)[0])  # the key holder encoded these
    named = named_from_match_rows(views.key_holder_rows, own_order)
    right = sum(
        sum(counts[client].get(label, 0) > 0 for label in named[client].values())
        for client in range(1, len(counts))
    )
    wrong = sum(
        sum(counts[client].get(label, 0) == 0 for label in named[client].values())
        for client in range(1, len(counts))
    )
    assert wrong == 0
    total = sum(len(counts[client]) for client in range(1, len(counts)))
    return right / total, held_share_named([set(c) for c in counts])


@pytest.mark.parametrize(("spec", "least"), [("iid", 1.0), ("dirichlet:0.1", 0.05)])
def test_the_key_holder_names_other_clients_labels_it_holds(spec, least):
    """Not defended: the key holder, also a client, names every label another client
    shares with it (all of them on iid, where every client holds every class); a key
    holder holding no labels (a separate party) names none."""
    share, by_sets = key_holder_naming(spec, SEEDS[0])
    assert share == pytest.approx(by_sets) and share >= least
    assert held_share_named([set(), {1, 2}, {3}]) == 0.0


def figures() -> None:
    """Every figure of these attacks, mean over :data:`SEEDS`."""
    mean = lambda values: float(np.mean(list(values)))  # noqa: E731
    row_seeds = range(20)  # cheap: 20 streams of 30 events per line
    for order in ("class", "random"):
        for keyed in (False, True):
            for capacity in (CLASSES, None):
                runs = [
                    run_stream(
                        stream_labels(order, 3, s),
                        keyed=keyed,
                        secure=False,
                        seed=s,
                        num_classes=capacity,
                    )
                    for s in row_seeds
                ]
                labels = [stream_labels(order, 3, s) for s in row_seeds]
                static = mean(natural_order_recovery(server_rows(r)) for r in runs)
                timing = mean(
                    first_appearance_recovery(server_rows(r), first_events(ls))
                    for r, ls in zip(runs, labels)
                )
                print(
                    f"row order: {order} stream, {'keyed' if keyed else 'arrival'} rows, "
                    f"capacity {capacity}: natural-order {static:.2f}, first-trained {timing:.2f} "
                    f"({len(row_seeds)} streams)"
                )
    for order in ("random", "class"):
        for keyed in (False, True):
            for capacity in (CLASSES, None):
                runs = [digits_stream(order, keyed, s, capacity) for s in SEEDS]
                print(
                    f"public samples: digits {order} stream, keyed={keyed}, capacity "
                    f"{capacity}: {mean(r for r, _ in runs):.2f} {[r for r, _ in runs]}; "
                    "prequential accuracy "
                    f"{mean(learner.prequential.accuracy for _, learner in runs):.4f}"
                )
    sources = [("digits", None)]
    data_dir = os.environ.get("STRATIFY_DATA_DIR", "/work/shared/data")
    if os.path.isdir(os.path.join(data_dir, "mnist")):
        sources.append(("mnist-10k", data_dir))
    for name, folder in sources:
        labels, public = dataset_labels(name, folder)
        from stratify.data.datasets import load_dataset

        data = load_dataset(name, data_dir=folder)
        # the whole dataset's class totals (training and test split), a weaker prior
        population = np.bincount(np.concatenate([labels, data.y_test.numpy()]))
        for spec in ("iid", "dirichlet:0.5", "dirichlet:0.1"):
            for step in (1, 10, 50, 100):
                value = mean(frequency_recovery(labels, public, spec, s, step) for s in SEEDS)
                print(f"global counts: {name} {spec}, counts to {step}: {value:.2f}")
            value = mean(frequency_recovery(labels, population, spec, s) for s in SEEDS)
            print(f"global counts: {name} {spec}, exact, whole-dataset totals: {value:.2f}")
    for spec in ("iid", "dirichlet:0.5", "dirichlet:0.1"):
        shares = [key_holder_naming(spec, s)[0] for s in SEEDS]
        print(f"key holder as client 0: digits {spec}: {mean(shares):.2f} {shares}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    figures()
