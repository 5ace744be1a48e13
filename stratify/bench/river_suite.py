"""`stratify bench stream --river-suite`: the stream learner beside river's own models on
river's streams (docs/streaming.md, "Against river").

Every classification stream river ships as a file (no download: Phishing, Bananas,
ImageSegments, Shuttle), two drifting synthetic ones (Agrawal's function 0 turning into
its function 2, SINE's labels flipped, each at a stated event) and scikit-learn's digits
are replayed, test-then-train (``predict_one`` then ``learn_one``), by four learners:
Stratify's :class:`~stratify.stream.river.StreamClassifier` (defaults, plain registry),
river's ``StandardScaler | OneVsRestClassifier(LogisticRegression)`` (LR), its Hoeffding
Adaptive Tree (HAT) and its Adaptive Random Forest (ARF). Each learner runs each stream in
a fresh process (:func:`measure`), which reports the prequential accuracy, events per
second, the seconds from before the learner's library is imported to its first prediction,
its peak resident memory and, on a drifting stream, the accuracy over the events
``AFTER_DRIFT`` after the change; for Stratify's learner also the share of its time spent
in its model's own work (:func:`model_share`), the rest being its bookkeeping.
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

#: the learners, in the table's order
LEARNERS = ("stratify", "river LR", "river HAT", "river ARF")
#: the streams, in the table's order
STREAMS = ("Phishing", "Bananas", "ImageSegments", "Shuttle", "Agrawal 0→2", "SINE flip", "digits")
#: where the synthetic streams change concept
DRIFT_AT = 3000
#: the synthetic streams' length
SYNTHETIC_EVENTS = 6000
#: the events after a change whose accuracy is reported (+500 to +1,000)
AFTER_DRIFT = (500, 1000)


@dataclass(frozen=True)
class SuiteRow:
    """One learner on one stream.

    Attributes
    ----------
    stream, learner : str
        Which.
    events : int
        Events replayed (test-then-train).
    drift_at : int or None
        The event at which the stream changes concept (``None``: it does not).
    accuracy : float
        Prequential accuracy over every event.
    after_drift_accuracy : float or None
        Prequential accuracy over events ``drift_at + AFTER_DRIFT[0]`` to
        ``drift_at + AFTER_DRIFT[1]`` (``None`` without a drift).
    events_per_s : float
        Events per second of the test-then-train loop.
    stratify_ratio : float
        Stratify's events per second over this learner's on the same stream.
    first_prediction_s : float
        Seconds from before the learner's library is imported to its first prediction
        (after one learned event).
    peak_rss_mb : float
        The process's peak resident memory, in MiB.
    model_share : float or None
        Stratify's learner: the fraction of its test-then-train time spent in its model's
        own work (:func:`model_share`); ``None`` for river's.
    """

    stream: str
    learner: str
    events: int
    drift_at: int | None
    accuracy: float
    after_drift_accuracy: float | None
    events_per_s: float
    stratify_ratio: float
    first_prediction_s: float
    peak_rss_mb: float
    model_share: float | None = None

    def csv_row(self) -> dict[str, str]:
        """The row as the results file writes it (rounded as the docs show it)."""
        after = self.after_drift_accuracy
        return {
            "stream": self.stream,
            "learner": self.learner,
            "events": str(self.events),
            "drift_at": "" if self.drift_at is None else str(self.drift_at),
            "accuracy": f"{100 * self.accuracy:.2f}",
            "after_drift_accuracy": "" if after is None else f"{100 * after:.2f}",
            "events_per_s": f"{self.events_per_s:.0f}",
            "stratify_ratio": f"{self.stratify_ratio:.2f}",
            "first_prediction_s": f"{self.first_prediction_s:.2f}",
            "peak_rss_mb": f"{self.peak_rss_mb:.0f}",
            "model_share": "" if self.model_share is None else f"{100 * self.model_share:.0f}",
        }


#: the results file's columns, in order
COLUMNS = tuple(field.name for field in fields(SuiteRow))


def stream_events(name: str, limit: int, drift_at: int = DRIFT_AT) -> list[tuple[dict, Any]]:
    """The first ``limit`` ``(x, y)`` pairs of stream ``name`` (one of :data:`STREAMS`).

    Parameters
    ----------
    name : str
        The stream.
    limit : int
        At most this many events.
    drift_at : int
        Where a synthetic stream changes concept.
    """
    from river import datasets
    from river.datasets import synth

    if name in ("Phishing", "Bananas", "ImageSegments", "Shuttle"):
        source: Any = getattr(datasets, name)()
    elif name == "Agrawal 0→2":
        source = abrupt_change(
            synth.Agrawal(classification_function=0, seed=42),
            synth.Agrawal(classification_function=2, seed=43),
            drift_at,
        )
    elif name == "SINE flip":
        # Sine's function 1 is function 0 with the labels reversed (its points drawn anew)
        source = abrupt_change(
            synth.Sine(classification_function=0, seed=42),
            synth.Sine(classification_function=1, seed=43),
            drift_at,
        )
    elif name == "digits":
        import numpy as np
        from sklearn.datasets import load_digits

        digits = load_digits()
        order = np.random.default_rng(0).permutation(len(digits.target))
        source = (
            ({f"p{i}": float(v) for i, v in enumerate(digits.data[k])}, int(digits.target[k]))
            for k in order
        )
    else:
        raise ValueError(f"unknown stream {name!r}; choose from {', '.join(STREAMS)}")
    return [(dict(x), y) for x, y in itertools.islice(source, limit)]


def abrupt_change(before: Any, after: Any, at: int) -> Any:
    """The first ``at`` events of stream ``before``, then stream ``after``'s.

    river's ``ConceptDriftStream`` with ``width=1`` overflows (``math.exp``) a few
    hundred events away from its change, so the change is made here.

    Parameters
    ----------
    before, after : iterable
        ``(x, y)`` streams.
    at : int
        The event at which ``after`` takes over.
    """
    return itertools.chain(itertools.islice(before, at), after)


def make_learner(name: str) -> Any:
    """A fresh learner ``name`` (one of :data:`LEARNERS`), river's with its defaults."""
    if name == "stratify":
        from stratify.stream.river import StreamClassifier

        return StreamClassifier(secure=False)
    if name == "river LR":
        from river import linear_model, multiclass, preprocessing

        return preprocessing.StandardScaler() | multiclass.OneVsRestClassifier(
            linear_model.LogisticRegression()
        )
    if name == "river HAT":
        from river import tree

        return tree.HoeffdingAdaptiveTreeClassifier(seed=42)
    if name == "river ARF":
        from river import forest

        return forest.ARFClassifier(seed=42)
    raise ValueError(f"unknown learner {name!r}; choose from {', '.join(LEARNERS)}")


def peak_rss_mib() -> float:
    """This process's peak resident memory (Linux's ``VmHWM``), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def replay(learner: str, events_file: str) -> dict[str, Any]:
    """Test-then-train ``learner`` over the pickled events of ``events_file``, in this
    process (run by :func:`measure` in a fresh one): the right predictions one by one,
    the loop's seconds, the first prediction's seconds and the peak memory.

    Parameters
    ----------
    learner : str
        One of :data:`LEARNERS`.
    events_file : str
        A pickle of ``(x, y)`` pairs, written by :func:`run_suite`.
    """
    with open(events_file, "rb") as handle:
        events = pickle.load(handle)
    start = time.perf_counter()
    model = make_learner(learner)
    x, y = events[0]
    model.learn_one(x, y)
    model.predict_one(events[1][0])
    first = time.perf_counter() - start
    model = make_learner(learner)  # the timed run starts afresh
    right = []
    start = time.perf_counter()
    for x, y in events:
        right.append(model.predict_one(x) == y)
        model.learn_one(x, y)
    seconds = time.perf_counter() - start
    share = model_share(events) if learner == "stratify" else None
    return {
        "right": right,
        "seconds": seconds,
        "first": first,
        "peak": peak_rss_mib(),
        "model_share": share,
    }


def model_share(events: list[tuple[Any, Any]]) -> float:
    """The fraction of Stratify's test-then-train time over ``events`` spent in its
    model's own work, from a second replay with that work timed: the prediction's
    forward pass and softmax (``probabilities``) and the training steps (``learn``), the
    standardisation of their samples included; everything else (reading the features,
    the buffers, the schedule, the registrations, the scaler's statistics, drift
    detection, the finiteness check) is bookkeeping. The timing itself, two clock reads
    per call, is a fraction of a microsecond per call.

    Parameters
    ----------
    events : list
        ``(x, y)`` pairs; the first starts the learner (its model is built by it) and is
        left out.
    """
    learner = make_learner("stratify")
    x, y = events[0]
    learner.learn_one(x, y)
    model = learner.learner.model
    spent = [0.0]

    def timed(method: Any) -> Any:
        def call(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args)
            finally:
                spent[0] += time.perf_counter() - start

        return call

    model.probabilities = timed(model.probabilities)
    model.learn = timed(model.learn)
    start = time.perf_counter()
    for x, y in events[1:]:
        learner.predict_one(x)
        learner.learn_one(x, y)
    return spent[0] / (time.perf_counter() - start)


def measure(learner: str, events_file: Path) -> dict[str, Any]:
    """:func:`replay` in a fresh process; its result.

    The process's string hashing is seeded (``PYTHONHASHSEED=0``): river's Hoeffding
    trees go through sets of feature names, whose order follows it, and on ImageSegments
    HAT predicted 1,794 or 1,795 events right from one process to the next without it.
    """
    code = "import json, sys; from stratify.bench.river_suite import replay; "
    code += "print(json.dumps(replay(sys.argv[1], sys.argv[2])))"
    done = subprocess.run(
        [sys.executable, "-c", code, learner, str(events_file)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{learner} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_suite(
    limit: int = 10_000,
    streams: tuple[str, ...] = STREAMS,
    learners: tuple[str, ...] = LEARNERS,
    drift_at: int = DRIFT_AT,
    after_drift: tuple[int, int] = AFTER_DRIFT,
    repeat: int = 1,
) -> tuple[list[SuiteRow], tuple[float, float, float]]:
    """Every learner on every stream; the rows and the load average after the run.

    Parameters
    ----------
    limit : int
        At most this many events of each stream (Shuttle has 49,097; the synthetic
        streams :data:`SYNTHETIC_EVENTS`).
    streams, learners : tuple of str
        Which (default: all); ``learners`` must start with ``"stratify"``, the ratios'
        reference.
    drift_at : int
        Where the synthetic streams change concept.
    after_drift : tuple of int
        The events after the change whose accuracy is reported.
    repeat : int
        Replays of each learner on each stream, the learners in turn (so a change of the
        machine's load falls on all of them): each keeps its fastest loop and first
        prediction (:func:`fastest`).
    """
    if learners[:1] != ("stratify",):
        raise ValueError("the suite's learners start with stratify, the ratios' reference")
    rows = []
    with tempfile.TemporaryDirectory(prefix="stratify-river-suite-") as scratch:
        for stream in streams:
            drifting = stream in ("Agrawal 0→2", "SINE flip")
            events = stream_events(
                stream, min(limit, SYNTHETIC_EVENTS) if drifting else limit, drift_at
            )
            events_file = Path(scratch) / "events.pickle"
            events_file.write_bytes(pickle.dumps(events))
            runs: dict[str, list[dict[str, Any]]] = {learner: [] for learner in learners}
            for _ in range(repeat):
                for learner in learners:
                    runs[learner].append(measure(learner, events_file))
            measured = {learner: fastest(results) for learner, results in runs.items()}
            ours = len(events) / measured["stratify"]["seconds"]
            for learner, result in measured.items():
                right = result["right"]
                window = right[drift_at + after_drift[0] : drift_at + after_drift[1]]
                speed = len(events) / result["seconds"]
                rows.append(
                    SuiteRow(
                        stream,
                        learner,
                        len(events),
                        drift_at if drifting else None,
                        sum(right) / len(right),
                        sum(window) / len(window) if drifting and window else None,
                        speed,
                        ours / speed,
                        result["first"],
                        result["peak"],
                        result["model_share"],
                    )
                )
    load = os.getloadavg()
    return rows, (load[0], load[1], load[2])


def fastest(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One learner's replays of one stream as one: the fastest loop (with its model
    share), the fastest first prediction, the largest peak memory. The learners are
    deterministic, so every replay predicts alike; one that did not is an error.

    Parameters
    ----------
    results : list of dict
        :func:`replay`'s results, at least one.
    """
    if any(result["right"] != results[0]["right"] for result in results):
        raise RuntimeError("two replays of a learner on one stream predicted differently")
    best = min(results, key=lambda result: result["seconds"])
    return {
        **best,
        "first": min(result["first"] for result in results),
        "peak": max(result["peak"] for result in results),
    }


def results_csv(rows: list[SuiteRow]) -> str:
    """The rows as the suite's results file (:data:`COLUMNS`, a header line first).

    Parameters
    ----------
    rows : list of SuiteRow
        :func:`run_suite`'s rows.
    """
    import csv
    import io

    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row.csv_row())
    return text.getvalue()
