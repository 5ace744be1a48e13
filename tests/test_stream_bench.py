"""The stream's speed work keeps its promises: the stream path imports nothing heavy it
does not need, its predictions are the eager model's, and `stratify bench stream` reports
its figures."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from stratify.nn.models import build_model
from stratify.stream import Event, StreamConfig, StreamLearner
from stratify.stream.numpy_model import NumpyStreamModel
from tests.streams import event_line

#: modules the stream path must not import with its defaults: seconds of start-up and
#: hundreds of MB each (``import torch`` alone peaks at about 630 MB)
HEAVY = ("torch", "torchvision", "ray", "matplotlib")


def test_the_stream_command_imports_no_torch_torchvision_ray_or_matplotlib(tmp_path):
    rng = np.random.default_rng(0)
    source = tmp_path / "events.jsonl"
    source.write_text("".join(event_line(line, rng) + "\n" for line in range(1, 41)))
    code = f"""
import sys
from stratify.cli.main import main
try:
    main(["stream", "--source", {str(source)!r}, "--out", {str(tmp_path / "run")!r},
          "--momentum", "0.5"])
except SystemExit as stop:
    assert not stop.code, stop.code
print("heavy:" + ",".join(name for name in {HEAVY!r} if name in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "metrics.jsonl").exists()
    assert done.stdout.strip().splitlines()[-1] == "heavy:"


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_predictions_are_the_eager_models(model):
    """The learner's prediction (NumPy for an MLP on CPU) is the softmax of the model's
    own forward pass on the standardised sample, within float tolerance."""
    shape = (1, 4, 4) if model == "cnn" else (16,)
    learner = StreamLearner(
        StreamConfig(secure=False, device="cpu", model=model, input_shape=shape, momentum=0.5)
    )
    rng = np.random.default_rng(2)
    for number in range(80):
        label = int(rng.integers(4))
        x = rng.normal(0, 1, 16) + label
        learner.ingest(Event(f"c{number % 3}", label, x, number + 1))
    assert isinstance(learner.model, NumpyStreamModel) == (model == "mlp")
    torch_model, transform = learner.model.network, learner.features.tensor
    if model == "mlp":  # the NumPy MLP's weights in the torch MLP
        torch_model = build_model("mlp", shape, learner.model.rows)
        weights = learner.model.state_dict()
        torch_model.load_state_dict({name: torch.from_numpy(v) for name, v in weights.items()})
        transform = lambda raw: torch.from_numpy(learner.features.array(raw.numpy()))  # noqa: E731
    for _ in range(5):
        x = rng.normal(0, 1, 16)
        raw = torch.tensor(x, dtype=torch.float32).reshape(shape)
        with torch.no_grad():
            logits = torch_model(transform(raw).unsqueeze(0))[0]
        # the known classes' rows, keyed (docs/streaming.md, "Placeholders")
        expected = torch.softmax(logits[learner.class_rows.model_rows], dim=0)
        probabilities = learner.predict_proba_one(x)
        got = torch.tensor([probabilities[label] for label in learner.classes])
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_the_late_class_figures_count_its_first_examples_and_see_imprinting():
    from stratify.bench.stream import late_class, late_class_stream

    stream = late_class_stream(0)
    labels = [y for _, y in stream]
    assert len(stream) == 3000 and 4 not in labels[:1500] and labels[1500:].count(4) > 100
    imprinted = late_class(1, river=False)
    drawn = late_class(1, river=False, new_class="random")
    assert imprinted.river_first_5 is None and imprinted.seeds == 1
    assert 0 <= drawn.first_5 <= drawn.first_20 <= 1
    assert imprinted.first_5 <= 0.8  # its first example cannot be right
    assert imprinted.first_5 >= drawn.first_5 + 0.4
    assert imprinted.first_20 > drawn.first_20


@pytest.mark.slow
def test_bench_stream_writes_its_figures(monkeypatch, tmp_path):
    """The command end to end (each stream's runs in fresh processes, as measured); the
    late class's streams shortened to 600 events (class 4 from event 300), whose full
    figures test_the_late_class_figures_are_todays checks."""
    from stratify.bench import stream as bench
    from stratify.cli.main import main

    full = bench.late_class_stream
    monkeypatch.setattr(
        bench, "late_class_stream", lambda seed: full(seed, events=600, late_from=300)
    )
    output = tmp_path / "bench.json"
    argv = ["bench", "stream", "--events", "300", "--features", "6", "--classes", "3"]
    main([*argv, "--json", str(output)])
    figures = json.loads(output.read_text())
    assert [row["name"] for row in figures["streams"]] == ["tabular", "digits"]
    for row in figures["streams"]:
        for key in ("events_per_s", "bare_torch_events_per_s", "first_prediction_s"):
            assert row[key] > 0
        assert row["peak_rss_mb"] > 50 and row["ratio"] == pytest.approx(
            row["events_per_s"] / row["bare_torch_events_per_s"]
        )
    assert figures["streams"][0]["events"] == 300
    assert [row["repeats"] for row in figures["streams"]] == [1, 1]
    river = importlib.util.find_spec("river") is not None
    late = figures["late_class"]
    assert late["seeds"] == 5 and 0 <= late["first_5"] <= 0.8
    assert (late["river_first_5"] is not None) == river
    for row in figures["streams"]:
        assert (row["river_events_per_s"] is not None) == river
        if river:
            assert row["river_events_per_s"] > 0 and 0 <= row["river_prequential_accuracy"] <= 1
            assert row["river_ratio"] == pytest.approx(
                row["events_per_s"] / row["river_events_per_s"]
            )


def test_repeats_alternate_and_keep_each_ones_best(monkeypatch, tmp_path):
    """``--repeat`` runs the command, the bare loop and river in turn that many times per
    stream and keeps each one's best events/s (the measurements stand in for the fresh
    processes the test above runs once)."""
    from stratify.bench import stream as bench
    from stratify.cli.main import main

    calls: list[str] = []
    speeds = iter(range(1, 1000))

    def command(source, folder):
        calls.append("command")
        return float(next(speeds)), 0.5, 60.0, 0.9

    def in_process(function, source):
        calls.append(function)
        speed = float(next(speeds))
        return [speed, 0.8] if function == "river_loop" else speed

    monkeypatch.setattr(bench, "run_stream_command", command)
    monkeypatch.setattr(bench, "run_in_process", in_process)
    monkeypatch.setattr(bench, "river_installed", lambda: True)
    monkeypatch.setattr(bench, "late_class", lambda seeds, river: None)
    monkeypatch.setattr(
        bench, "digits_events", lambda clients, seed: bench.tabular_events(20, 4, 3, clients, seed)
    )
    output = tmp_path / "bench.json"
    main(["bench", "stream", "--events", "20", "--repeat", "3", "--json", str(output)])
    assert calls == ["command", "bare_torch_loop", "river_loop"] * 6
    tabular, digits = json.loads(output.read_text())["streams"]
    # the speeds were handed out in call order: 1, 2, 3 for the first round of tabular…
    assert (tabular["events_per_s"], tabular["bare_torch_events_per_s"]) == (7.0, 8.0)
    assert (tabular["river_events_per_s"], digits["events_per_s"]) == (9.0, 16.0)
    assert tabular["repeats"] == digits["repeats"] == 3


def test_the_peak_memory_is_the_childs_own_not_its_parents():
    """Linux folds the parent's peak into a child's ``ru_maxrss`` at exec: with torch
    loaded here (hundreds of MB), a child that holds a few MB reports the parent's size
    there, and its own through ``VmHWM``."""
    import os
    import time

    from stratify.bench.stream import resident_peak_mib

    if not os.path.exists(f"/proc/{os.getpid()}/status"):
        pytest.skip("no /proc on this system: the bench falls back to ru_maxrss")
    torch.zeros(1)  # torch is loaded in this process
    own = resident_peak_mib(os.getpid())
    assert own is not None and own > 200
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"])
    time.sleep(0.5)
    peak = resident_peak_mib(child.pid)
    _, _, usage = os.wait4(child.pid, 0)
    assert peak is not None and peak < 50 < own
    assert usage.ru_maxrss / 1024 > own / 2  # the parent's size, not the child's


def test_the_river_suite_measures_each_learner_in_its_own_process(monkeypatch, tmp_path):
    """A tiny slice of `stratify bench stream --river-suite` (one drifting stream, two
    learners, 200 events): its rows, their ratios and the after-drift window, and the
    CSV the command writes, which `stratify tables` renders into docs/streaming.md."""
    pytest.importorskip("river")
    from stratify.bench import river_suite
    from stratify.cli import bench_stream
    from stratify.cli.main import main
    from stratify.reproduce.tables import TABLES

    rows, load = river_suite.run_suite(
        200, ("Agrawal 0→2",), ("stratify", "river LR"), drift_at=60, after_drift=(20, 60)
    )
    assert [(row.stream, row.learner) for row in rows] == [
        ("Agrawal 0→2", "stratify"),
        ("Agrawal 0→2", "river LR"),
    ]
    ours, lr = rows
    for row in rows:
        assert row.events == 200 and row.drift_at == 60
        assert 0 <= row.after_drift_accuracy <= 1 and 0.3 < row.accuracy <= 1
        assert row.first_prediction_s > 0 and row.peak_rss_mb > 20
    assert ours.stratify_ratio == 1.0
    assert 0 < ours.model_share < 1 and lr.model_share is None  # river's model is all it does
    assert lr.stratify_ratio == pytest.approx(ours.events_per_s / lr.events_per_s)
    assert len(load) == 3
    # the change is where it is said to be: the events before it are the unchanged
    # stream's, the ones after it are not
    events = river_suite.stream_events("Agrawal 0→2", 200, drift_at=60)
    unchanged = river_suite.stream_events("Agrawal 0→2", 200, drift_at=200)
    assert events[:60] == unchanged[:60] and events[60:] != unchanged[60:]
    # the command prints the rows and writes them as the results file the table reads
    monkeypatch.setattr(bench_stream, "run_suite", lambda limit, repeat: (rows, load))
    csv_path = tmp_path / "stream-river.csv"
    main(["bench", "stream", "--river-suite", "--river-csv", str(csv_path)])
    assert csv_path.read_text() == river_suite.results_csv(rows)
    assert TABLES["stream-river"].columns == river_suite.COLUMNS
    with csv_path.open(newline="") as handle:
        table = TABLES["stream-river"].table(list(csv.DictReader(handle)))
    assert "| Agrawal 0→2 | river LR | 200 | 60 |" in table


def test_the_river_suite_keeps_each_learners_fastest_replay():
    """Repeated replays become one: the fastest loop with its model share, the fastest
    first prediction, the largest peak memory; replays that predicted differently are an
    error (the learners are deterministic)."""
    from stratify.bench.river_suite import fastest

    def replay(seconds, first, peak, share, right=(True, False)):
        return dict(right=list(right), seconds=seconds, first=first, peak=peak, model_share=share)

    kept = fastest(
        [replay(2.0, 0.5, 140, 0.4), replay(1.5, 0.9, 150, 0.6), replay(3.0, 0.7, 145, 0.5)]
    )
    assert kept == replay(1.5, 0.5, 150, 0.6)
    with pytest.raises(RuntimeError, match="predicted differently"):
        fastest([replay(1.0, 1.0, 1, 0.5), replay(1.0, 1.0, 1, 0.5, right=(True, True))])
