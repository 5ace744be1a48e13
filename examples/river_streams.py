"""Real tabular streams against an online-learning library: the classification datasets
that ship inside the ``river`` package, in their original order, spread over 10 clients.

Two uses (``pip install river``, or ``pip install -e '.[compare]'``)::

    # a producer for a pipeline: one JSON event per line on standard output
    python examples/river_streams.py produce Phishing \
        | stratify stream --source - --out runs/phishing

    # docs/streaming.md's table: Stratify and river's models, prequential accuracy and events/s
    python examples/river_streams.py compare --datasets Phishing Bananas ImageSegments Shuttle

    # a class that appears late: how often its first 5 and 20 examples are predicted right
    python examples/river_streams.py late --seeds 5

    # drift detection (StreamClassifier(drift=True)): stationary streams with and without,
    # and Agrawal 0 -> 2 abrupt drift against river's ARF
    python examples/river_streams.py drift

river's events/s on the streams of ``stratify bench stream`` are part of that bench.

Every learner sees the same events in the same order and is scored test-then-train
(each event predicted before it is learned): river with ``evaluate.progressive_val_score``
and its ``Accuracy``, Stratify with its own ``prequential_accuracy``. Events/s is wall time
over the whole stream: river's includes reading its CSV, Stratify's reading and parsing
the JSON Lines file (the command line's path), without the process start.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CLIENTS = 10


def river_dataset(name: str) -> Any:
    from river import datasets

    return getattr(datasets, name)()


def events(name: str) -> Iterator[dict[str, Any]]:
    """The dataset's samples as stream events: client ``i mod 10``, named features."""
    for number, (x, y) in enumerate(river_dataset(name)):
        yield {"client": f"site-{number % CLIENTS}", "label": y, "x": x}


def produce(name: str) -> None:
    try:
        for event in events(name):
            sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the consumer stopped reading: so do we
        sys.stderr.close()


def river_models(classes: int) -> dict[str, Any]:
    """river's standard classifiers, with the defaults of its documentation."""
    from river import forest, linear_model, multiclass, naive_bayes, preprocessing, tree

    logistic: Any = linear_model.LogisticRegression()
    if classes > 2:
        logistic = multiclass.OneVsRestClassifier(logistic)
    return {
        "river LogisticRegression (StandardScaler)": preprocessing.StandardScaler() | logistic,
        "river GaussianNB": naive_bayes.GaussianNB(),
        "river HoeffdingTree": tree.HoeffdingTreeClassifier(),
        "river ARF (10 trees)": forest.ARFClassifier(n_models=10, seed=0),
    }


def score_river(name: str, model: Any) -> tuple[float, float]:
    from river import evaluate, metrics

    start = time.perf_counter()
    accuracy = evaluate.progressive_val_score(river_dataset(name), model, metrics.Accuracy())
    seconds = time.perf_counter() - start
    return accuracy.get(), river_dataset(name).n_samples / seconds


def score_stratify(source: Path, out: Path, **options: Any) -> tuple[dict[str, Any], float]:
    from stratify.stream import StreamConfig
    from stratify.stream.run import StreamRun

    config = StreamConfig(source=str(source), out=str(out), secure=False, device="cpu", **options)
    start = time.perf_counter()
    summary = StreamRun(config).run()
    return summary, summary["events"] / (time.perf_counter() - start)


def compare(names: list[str], folder: Path) -> list[str]:
    rows = ["| stream (events, classes) | learner | prequential accuracy | events/s |",
            "|---|---|---|---|"]  # fmt: skip
    for name in names:
        source = folder / f"{name}.jsonl"
        with source.open("w") as handle:
            for event in events(name):
                handle.write(json.dumps(event) + "\n")
        learners: list[tuple[str, float, float]] = []
        for label, options in [
            ("Stratify (defaults)", {}),
            ("Stratify, 4 updates per event", {"steps_per_event": 4}),
            ("Stratify, --scale none", {"scale": "none", "on_diverge": "skip"}),
        ]:
            out = folder / f"{name}-{len(learners)}"
            summary, speed = score_stratify(source, out, **options)
            learners.append((label, summary["prequential_accuracy"], speed))
            if not learners[1:]:
                majority = summary["majority_accuracy"]
                classes = summary["classes"]
        for label, model in river_models(classes).items():
            accuracy, speed = score_river(name, model)
            learners.append((label, accuracy, speed))
        learners.append(("majority class so far", majority, float("nan")))
        events_count = sum(1 for _ in source.open())
        for label, accuracy, speed in learners:
            shown = "–" if speed != speed else f"{speed:,.0f}"
            stream = f"{name} ({events_count:,}, {classes})"
            rows.append(f"| {stream} | {label} | {100 * accuracy:.2f}% | {shown} |")
            print(rows[-1], flush=True)
    return rows


def late(seeds: int) -> list[str]:
    """Accuracy on the first 5 and 20 examples of a class that appears mid-stream:
    Stratify's learner (defaults, plain registry) against river's OvR logistic
    regression, the same streams (``stratify bench stream`` measures the same)."""
    from stratify.bench.stream import late_class

    figures = late_class(seeds, river=True)
    rows = ["| learner | first 5 of the new class | first 20 |", "|---|---|---|"]
    for name, first5, first20 in (
        ("Stratify (defaults)", figures.first_5, figures.first_20),
        ("river OvR LR", figures.river_first_5, figures.river_first_20),
    ):
        assert first5 is not None and first20 is not None
        rows.append(f"| {name} | {100 * first5:.0f}% | {100 * first20:.0f}% |")
        print(rows[-1], flush=True)
    return rows


def labelled_stream(name: str) -> list[tuple[dict[Any, float], Any]]:
    """A river dataset's samples, or ``digits`` (scikit-learn's, in its order, the
    pixels named by their index)."""
    if name != "digits":
        return list(river_dataset(name))
    from sklearn.datasets import load_digits

    digits = load_digits()
    return [
        (dict(enumerate(map(float, row))), int(y)) for row, y in zip(digits.data, digits.target)
    ]


def agrawal_drift(events: int = 10_000, position: int = 5_000) -> list[tuple[dict[Any, Any], Any]]:
    """Agrawal's function 0, then function 2 from ``position`` on: an abrupt drift, what
    ``synth.ConceptDriftStream(..., width=1)`` means (which overflows in river 0.26's
    sigmoid, so the two streams are joined here)."""
    import itertools

    from river.datasets import synth

    before = synth.Agrawal(classification_function=0, seed=0).take(position)
    after = synth.Agrawal(classification_function=2, seed=1).take(events - position)
    return list(itertools.chain(before, after))


def prequential(model: Any, samples: list[tuple[dict[Any, Any], Any]], clients: bool) -> list[bool]:
    """Each sample predicted, then learned: whether each prediction was right (a first
    prediction of ``None`` counts wrong, as in ``stratify stream``); Stratify's samples
    arrive at client ``i mod 10``."""
    right = []
    for number, (x, y) in enumerate(samples):
        right.append(model.predict_one(x) == y)
        if clients:
            model.learn_one(x, y, client=f"site-{number % CLIENTS}")
        else:
            model.learn_one(x, y)
    return right


def drift(names: list[str]) -> list[str]:
    """Prequential accuracy without and with drift detection on stationary streams, and
    the accuracy over events +500 to +1,000 after Agrawal's abrupt change, against ARF."""
    from river import forest

    from stratify.stream.river import StreamClassifier

    rows = ["| stream | learner | prequential accuracy | events +500–1,000 after the change |",
            "|---|---|---|---|"]  # fmt: skip
    streams = [(name, labelled_stream(name), None) for name in names]
    streams.append(("Agrawal 0→2 at 5,000", agrawal_drift(), 5_000))
    twice: dict[str, Any] = {"secure": False, "steps_per_event": 2}
    for name, samples, change in streams:
        learners: list[tuple[str, Any, bool]] = [
            ("Stratify", StreamClassifier(secure=False, drift=False), True),
            ("Stratify, drift detection (the default)", StreamClassifier(secure=False), True),
        ]
        if change is not None:
            learners += [
                ("Stratify, 2 updates per event", StreamClassifier(**twice, drift=False), True),
                ("Stratify, 2 updates per event, drift detection", StreamClassifier(**twice), True),
            ]
            learners.append(
                ("river ARF (10 trees)", forest.ARFClassifier(n_models=10, seed=0), False)
            )
        for label, model, clients in learners:
            right = prequential(model, samples, clients)
            after = "–"
            if change is not None:
                after = f"{100 * sum(right[change + 500 : change + 1000]) / 500:.2f}%"
            if hasattr(model, "learner") and model.learner.drift is not None:
                label += f" ({model.learner.drift.detections} detections)"
            rows.append(f"| {name} | {label} | {100 * sum(right) / len(right):.2f}% | {after} |")
            print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    producer = commands.add_parser("produce", help="print a dataset as JSON Lines events")
    producer.add_argument("dataset", help="a river dataset, e.g. Phishing")
    comparison = commands.add_parser("compare", help="the table of docs/streaming.md")
    comparison.add_argument(
        "--datasets", nargs="+", default=["Phishing", "Bananas", "ImageSegments", "Shuttle"]
    )
    lateness = commands.add_parser("late", help="accuracy on a class that appears late")
    lateness.add_argument("--seeds", type=int, default=5)
    drifting = commands.add_parser("drift", help="drift detection with and without")
    drifting.add_argument(
        "--datasets", nargs="+", default=["Phishing", "Bananas", "ImageSegments", "digits"]
    )
    args = parser.parse_args(argv)
    if args.command == "drift":
        drift(args.datasets)
        return
    if args.command == "late":
        late(args.seeds)
        return
    if args.command == "produce":
        produce(args.dataset)
        return
    with tempfile.TemporaryDirectory() as folder:
        compare(args.datasets, Path(folder))


if __name__ == "__main__":
    main()
