"""`stratify bench stream`: the command line's stream against a bare eager PyTorch loop.

Two streams, each written as JSON Lines: a synthetic tabular one (Gaussian classes in
``features`` dimensions, spread over clients) and scikit-learn's digits (64 pixels, 10
classes, in a shuffled order). Each is replayed twice, in fresh processes:

* by ``stratify stream --source FILE`` with its defaults, timed as the command times
  itself (events per second of ingestion, JSON parsing included, the event that builds
  the model left out), with the seconds from the process start to its first prediction
  and the process's peak resident memory;
* by :func:`bare_torch_loop`: for each line, ``json.loads``, a prediction, and one SGD
  step of the same MLP (``zero_grad``, forward, cross-entropy, ``backward``, ``step``),
  on one thread with oneDNN off as the stream runs (docs/architecture.md, "Performance");
* where ``river`` is installed, by :func:`river_loop`: river's OvR logistic regression
  behind its ``StandardScaler``, test-then-train on the same lines, JSON parsed per line.

And a class that appears late (:func:`late_class`): on tabular streams whose fifth class
comes only halfway, how many of its first 5 and first 20 examples the stream learner
(defaults, plain registry, through the Python API) and river's OvR logistic regression
predict right, test-then-train.

The stream's second line has no label, so the command predicts it (``--predictions``) as
soon as the first event has built the model: that line's appearance is the first
prediction.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: seconds between two looks at the predictions file while waiting for the first one
POLL_SECONDS = 0.005


@dataclass(frozen=True)
class StreamFigures:
    """One stream's figures.

    Attributes
    ----------
    name : str
        The stream.
    events : int
        Labeled events in it.
    events_per_s : float
        ``stratify stream``'s ingestion rate.
    bare_torch_events_per_s : float
        The bare eager loop's rate on the same lines.
    ratio : float
        ``events_per_s / bare_torch_events_per_s``.
    first_prediction_s : float
        Seconds from starting ``stratify stream`` to its first prediction written.
    peak_rss_mb : float
        Peak resident memory of the ``stratify stream`` process, MiB.
    prequential_accuracy : float or None
        The stream's test-then-train accuracy.
    river_events_per_s, river_prequential_accuracy : float or None
        river's OvR logistic regression on the same lines (``None`` without ``river``).
    river_ratio : float or None
        ``events_per_s / river_events_per_s``.
    repeats : int
        Runs of each of the three; the events/s are each one's best, the first
        prediction the soonest, the peak RSS the largest.
    """

    name: str
    events: int
    events_per_s: float
    bare_torch_events_per_s: float
    ratio: float
    first_prediction_s: float
    peak_rss_mb: float
    prequential_accuracy: float | None
    river_events_per_s: float | None = None
    river_prequential_accuracy: float | None = None
    river_ratio: float | None = None
    repeats: int = 1


@dataclass(frozen=True)
class LateClassFigures:
    """How soon a class that appears late is predicted (:func:`late_class`).

    Attributes
    ----------
    seeds : int
        Streams measured (seeds ``0 … seeds − 1``).
    first_5, first_20 : float
        The share of the late class's first 5 (20) examples the stream learner predicted
        right, over every stream (the first example can never be right: 0.8 at most).
    river_first_5, river_first_20 : float or None
        The same for river's OvR logistic regression (``None`` without ``river``).
    """

    seeds: int
    first_5: float
    first_20: float
    river_first_5: float | None = None
    river_first_20: float | None = None


@dataclass(frozen=True)
class StreamBench:
    """Every stream's figures, the late class's, and the machine's load when they were
    taken."""

    streams: list[StreamFigures]
    load_average: tuple[float, float, float]
    late_class: LateClassFigures | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tabular_events(
    events: int, features: int, classes: int, clients: int, seed: int
) -> list[dict[str, Any]]:
    """Gaussian classes: class ``c``'s samples around a random centre, unit noise, the
    features on different scales (as real tabular features are), random clients."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1.5, (classes, features))
    scales = 10.0 ** rng.uniform(-1, 2, features)
    labels = rng.integers(0, classes, events)
    x = (centres[labels] + rng.normal(0, 1, (events, features))) * scales
    owners = rng.integers(0, clients, events)
    return [
        {"client": f"c{int(k)}", "label": int(y), "x": np.round(row, 5).tolist()}
        for k, y, row in zip(owners, labels, x)
    ]


def late_class_stream(
    seed: int, events: int = 3000, late_from: int = 1500, clients: int = 10
) -> list[tuple[dict[str, float], int]]:
    """``(x, y)`` pairs of the tabular stream (:func:`tabular_events`: 5 classes, 20
    named features of different scales) with class 4 left out until event ``late_from``."""
    stream: list[tuple[dict[str, float], int]] = []
    for event in tabular_events(2 * events, 20, 5, clients, seed):
        if event["label"] == 4 and len(stream) < late_from:
            continue
        stream.append(({f"f{i}": v for i, v in enumerate(event["x"])}, event["label"]))
        if len(stream) == events:
            break
    return stream


def new_class_hits(
    model: Any, stream: list[tuple[dict[str, float], int]], new: int = 4, clients: int = 10
) -> list[bool]:
    """Whether each example of class ``new`` was predicted right, test-then-train by
    ``model`` (``predict_one``/``learn_one``: a river model, or a stream learner, which
    gets client ``i mod clients`` for the ``i``-th event)."""
    from stratify.stream import StreamLearner

    hits = []
    for number, (x, y) in enumerate(stream):
        predicted = model.predict_one(x)
        if isinstance(model, StreamLearner):
            model.learn_one(x, y, client=number % clients)
        else:
            model.learn_one(x, y)
        if y == new:
            hits.append(predicted == y)
    return hits


def late_class(seeds: int = 5, river: bool | None = None, **settings: Any) -> LateClassFigures:
    """The late class's figures over the streams of seeds ``0 … seeds − 1``.

    Parameters
    ----------
    seeds : int
        Streams to measure.
    river : bool, optional
        Measure river's OvR logistic regression too (default: where it is installed).
    **settings
        :class:`~stratify.stream.StreamConfig` fields other than the defaults (the
        registry is plain, the device the CPU, the seed the stream's).
    """
    from stratify.stream import StreamConfig, StreamLearner

    with_river = river_installed() if river is None else river
    ours: list[list[bool]] = []
    theirs: list[list[bool]] = []
    for seed in range(seeds):
        stream = late_class_stream(seed)
        config = StreamConfig(**{"secure": False, "device": "cpu", "seed": seed, **settings})
        ours.append(new_class_hits(StreamLearner(config), stream))
        if with_river:
            from river import linear_model, multiclass, preprocessing

            model = preprocessing.StandardScaler() | multiclass.OneVsRestClassifier(
                linear_model.LogisticRegression()
            )
            theirs.append(new_class_hits(model, stream))

    def share(hits: list[list[bool]], first: int) -> float:
        return sum(sum(h[:first]) for h in hits) / (first * len(hits))

    return LateClassFigures(
        seeds,
        share(ours, 5),
        share(ours, 20),
        share(theirs, 5) if with_river else None,
        share(theirs, 20) if with_river else None,
    )


def digits_events(clients: int, seed: int) -> list[dict[str, Any]]:
    """scikit-learn's 1,797 digits (64 pixels 0–16) in a shuffled order, random clients."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(digits.target))
    owners = rng.integers(0, clients, len(order))
    return [
        {"client": f"c{int(k)}", "label": int(digits.target[i]), "x": digits.data[i].tolist()}
        for k, i in zip(owners, order)
    ]


def write_stream(path: Path, events: list[dict[str, Any]]) -> None:
    """``events`` as JSON Lines, the first one's features again, unlabeled, as line 2."""
    probe = {"client": events[0]["client"], "x": events[0]["x"]}
    lines = [events[0], probe, *events[1:]]
    path.write_text("".join(json.dumps(event) + "\n" for event in lines))


def bare_torch_loop(source: str) -> float:
    """Events per second of a bare eager PyTorch loop over ``source``'s labeled lines:
    parse, predict, one SGD step of the stream's default MLP (``lr`` 0.01), the first
    event (which builds the model) left out of the time.

    Parameters
    ----------
    source : str
        A JSON Lines stream as :func:`write_stream` writes.
    """
    import torch
    import torch.nn.functional as functional

    from stratify.backend import configure_cpu_for_single_sample
    from stratify.nn.models import build_model

    configure_cpu_for_single_sample()
    lines = Path(source).read_text().splitlines()
    first = json.loads(lines[0])
    labels = sorted({json.loads(line).get("label") for line in lines} - {None})
    row_of = {label: row for row, label in enumerate(labels)}
    model = build_model("mlp", (len(first["x"]),), len(labels))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    timed, start = 0, 0.0
    for number, line in enumerate(lines):
        if number == 1:
            start = time.perf_counter()
        event = json.loads(line)
        if event.get("label") is None:
            continue
        x = torch.tensor(event["x"], dtype=torch.float32).unsqueeze(0)
        target = torch.tensor([row_of[event["label"]]])
        with torch.no_grad():
            int(model(x).argmax(dim=1))
        optimizer.zero_grad()
        functional.cross_entropy(model(x), target).backward()
        optimizer.step()
        timed += number > 0
    return timed / (time.perf_counter() - start)


def river_loop(source: str) -> tuple[float, float]:
    """Events per second and prequential accuracy of river's OvR logistic regression
    (``StandardScaler() | OneVsRestClassifier(LogisticRegression())``, river's defaults)
    over ``source``'s labeled lines: parse, predict, learn; the first line left out of the
    time, as :func:`bare_torch_loop` does.

    Parameters
    ----------
    source : str
        A JSON Lines stream as :func:`write_stream` writes.
    """
    from river import linear_model, multiclass, preprocessing

    model = preprocessing.StandardScaler() | multiclass.OneVsRestClassifier(
        linear_model.LogisticRegression()
    )
    lines = Path(source).read_text().splitlines()
    correct, timed, start = 0, 0, 0.0
    for number, line in enumerate(lines):
        if number == 1:
            start = time.perf_counter()
        event = json.loads(line)
        if event.get("label") is None:
            continue
        x = dict(enumerate(event["x"]))
        correct += model.predict_one(x) == event["label"]
        model.learn_one(x, event["label"])
        timed += number > 0
    return timed / (time.perf_counter() - start), correct / (timed + 1)


def river_installed() -> bool:
    """Whether ``river`` can be imported (checked without importing it)."""
    import importlib.util

    return importlib.util.find_spec("river") is not None


def run_in_process(function: str, source: Path) -> Any:
    """``function`` of this module on ``source``, in a fresh process; its result."""
    code = f"import json, sys; from stratify.bench.stream import {function}; "
    code += f"print(json.dumps({function}(sys.argv[1])))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(source)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def written(path: Path) -> bool:
    """Whether ``path`` exists and holds something."""
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


def run_stream_command(source: Path, folder: Path) -> tuple[float, float, float, float | None]:
    """``stratify stream --source source`` with its defaults in a fresh process.

    Returns
    -------
    tuple
        Events per second, seconds to the first prediction, peak resident MiB, and the
        prequential accuracy.
    """
    predictions = folder / "predictions.jsonl"
    out = folder / "run"
    command = [
        sys.executable, "-c", "from stratify.cli.main import main; main()", "stream",
        "--source", str(source), "--out", str(out), "--predictions", str(predictions),
    ]  # fmt: skip
    errors = folder / "stderr.txt"
    with open(errors, "wb") as stderr:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        first_prediction = float("nan")
        peak: float | None = None
        # os.wait4 rather than Popen.poll: it reaps the process and gives its peak memory
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            peak = resident_peak_mib(process.pid) or peak
            if math.isnan(first_prediction) and written(predictions):
                first_prediction = time.perf_counter() - start
            time.sleep(POLL_SECONDS)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"stratify stream failed: {errors.read_text()[-2000:]}")
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    return (
        float(last["events_per_second"]),
        first_prediction,
        peak if peak is not None else usage.ru_maxrss / 1024,
        last["prequential_accuracy"],
    )


def resident_peak_mib(pid: int) -> float | None:
    """The peak resident memory of process ``pid`` since its program started (Linux's
    ``VmHWM``), in MiB; ``None`` where ``/proc`` does not say.

    Not ``wait4``'s ``ru_maxrss``: Linux folds the forking process's peak into it at
    ``exec``, so a child of this process (about 600 MB once torch is loaded here)
    would report at least that."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def stream_bench(
    events: int = 5000,
    features: int = 20,
    classes: int = 5,
    clients: int = 10,
    seed: int = 0,
    river: bool | None = None,
    late_seeds: int = 5,
    repeat: int = 1,
) -> StreamBench:
    """Measure both streams (module docstring).

    Parameters
    ----------
    events, features, classes, clients : int
        The tabular stream's size (digits has its own 1,797 samples, 64 features, 10
        classes; ``clients`` for both).
    seed : int
        Seeds both streams.
    river : bool, optional
        Measure river's OvR logistic regression too (default: where it is installed).
    late_seeds : int
        Streams of :func:`late_class` (0: not measured).
    repeat : int
        Runs of the command, the bare loop and river on each stream, alternating
        (:class:`StreamFigures` keeps each one's best).
    """
    with_river = river_installed() if river is None else river
    streams = {
        "tabular": tabular_events(events, features, classes, clients, seed),
        "digits": digits_events(clients, seed),
    }
    figures = []
    with tempfile.TemporaryDirectory(prefix="stratify-bench-stream-") as scratch:
        for name, stream in streams.items():
            folder = Path(scratch) / name
            folder.mkdir()
            source = folder / "events.jsonl"
            write_stream(source, stream)
            speeds, bares, firsts, rss, rivers = [], [], [], 0.0, []
            river_accuracy = None
            # the three alternate, so a change of the machine's load between repeats
            # reaches them all; each keeps its best (least disturbed) figure
            for attempt in range(repeat):
                place = folder / f"attempt-{attempt}"
                place.mkdir()
                speed, first, peak, accuracy = run_stream_command(source, place)
                speeds.append(speed)
                firsts.append(first)
                rss = max(rss, peak)
                bares.append(float(run_in_process("bare_torch_loop", source)))
                if with_river:
                    river_speed, river_accuracy = run_in_process("river_loop", source)
                    rivers.append(river_speed)
            speed, bare = max(speeds), max(bares)
            river_speed = max(rivers) if rivers else None
            figures.append(
                StreamFigures(
                    name,
                    len(stream),
                    speed,
                    bare,
                    speed / bare,
                    min(firsts),
                    rss,
                    accuracy,
                    river_speed,
                    river_accuracy,
                    None if river_speed is None else speed / river_speed,
                    repeat,
                )
            )
    late = late_class(late_seeds, river=with_river) if late_seeds else None
    return StreamBench(figures, os.getloadavg(), late)
