"""The stream's speed work keeps its promises: the stream path imports nothing heavy it
does not need, its predictions are the eager model's, and `stratify bench stream` reports
its figures."""

from __future__ import annotations

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
def test_bench_stream_writes_its_figures(tmp_path):
    output = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-c", "from stratify.cli.main import main; main()", "bench", "stream",
         "--events", "300", "--features", "6", "--classes", "3", "--repeat", "2",
         "--json", str(output)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(output.read_text())
    assert [row["name"] for row in figures["streams"]] == ["tabular", "digits"]
    for row in figures["streams"]:
        for key in ("events_per_s", "bare_torch_events_per_s", "first_prediction_s"):
            assert row[key] > 0
        assert row["peak_rss_mb"] > 50 and row["ratio"] == pytest.approx(
            row["events_per_s"] / row["bare_torch_events_per_s"]
        )
    assert figures["streams"][0]["events"] == 300
    assert [row["repeats"] for row in figures["streams"]] == [2, 2]
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
