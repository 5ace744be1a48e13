"""`stratify stream` against real pipelines: poisoned lines, stops by signal, resumes that
replay or continue, growing files, FIFOs, late labels and predictions, append-only metrics."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from streams import FLAGS, event_line, stream_config

from stratify.cli.main import main
from stratify.errors import ConfigError
from stratify.runfolder import read_checkpoint
from stratify.stream.buffers import ClientBuffers
from stratify.stream.run import StreamRun

COMMAND = [sys.executable, "-m", "stratify.cli.main", "stream"]
TIMING = ("events_per_second", "ingest_seconds")


def event_lines(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [event_line(number, rng) for number in range(1, count + 1)]


def metrics_of(out: Path) -> list[dict]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def assert_same_model(first: StreamRun, second: StreamRun) -> None:
    for a, b in zip(
        first.learner.model.state_dict().values(), second.learner.model.state_dict().values()
    ):
        assert np.array_equal(a, b)
    assert first.learner.stats.events == second.learner.stats.events


def wait_for(path: Path, text: str, process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.1)
    process.kill()
    pytest.fail(f"{text!r} did not appear in {path} in time")


def poisoned_stream(count: int = 600) -> list[str]:
    """A stream with three poisoned lines: a huge integer at 100, a deeply nested array
    at 200, a line over --max-line-bytes at 300."""
    lines = event_lines(count, seed=7)
    lines[99] = '{"client": "c0", "label": 1, "x": [' + "9" * 5000 + ", 0, 0, 0, 0]}"
    lines[199] = '{"client": "c1", "label": 2, "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    lines[299] = json.dumps({"client": "c2", "label": 0, "x": [0.5] * 60_000})
    return lines


# -- poisoned lines --------------------------------------------------------------------------


def test_poisoned_lines_are_skipped_and_the_stream_goes_on(tmp_path, capsys):
    source = tmp_path / "events.jsonl"
    source.write_text("\n".join(poisoned_stream()) + "\n")
    out = tmp_path / "run"
    main(["stream", "--source", str(source), "--out", str(out), "--max-line-bytes", "100000",
          *FLAGS])  # fmt: skip
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warn")]
    assert [w.split(":")[1].strip() for w in warnings] == ["line 100", "line 200", "line 300"]
    assert "longer than --max-line-bytes (100,000 bytes)" in warnings[2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events"] == 597 and summary["rejected"] == 3 and summary["lines"] == 600


@pytest.mark.slow
def test_a_poisoned_stream_killed_mid_way_resumes_to_the_same_end(tmp_path):
    lines = poisoned_stream()
    source, out = tmp_path / "events.jsonl", tmp_path / "run"
    source.write_text("\n".join(lines) + "\n")
    flags = [*FLAGS, "--max-line-bytes", "100000", "--out", str(out)]
    process = subprocess.Popen(
        [*COMMAND, "--source", "-", *flags],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert process.stdin is not None
    process.stdin.write(("\n".join(lines[:460]) + "\n").encode())
    process.stdin.flush()
    wait_for(out / "metrics.jsonl", '"events": 450', process)
    process.kill()  # SIGKILL: no chance to checkpoint; the last one is at 400 events
    _, err = process.communicate()
    assert err.decode().count("warning:") == 3
    assert read_checkpoint(out / "checkpoint.pt")["lines"] == 403
    resumed = subprocess.run(
        [*COMMAND, "--source", str(source), "--resume", *flags], capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "warning:" not in resumed.stderr  # the poisoned lines were before the checkpoint
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events"] == 597 and summary["rejected"] == 3 and summary["lines"] == 600


def test_a_bad_test_file_is_one_error(tmp_path, capsys):
    source, test = tmp_path / "events.jsonl", tmp_path / "test.jsonl"
    source.write_text("\n".join(event_lines(10)) + "\n")
    for content, reason in [
        ('{"label": 1, "x": [' + "9" * 5000 + "]}\n", "line 1: unreadable JSON"),
        ('{"label": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n", "line 1: JSON nested"),
        ('{"label": 1, "x": [1e999]}\n', "line 1: the features hold NaN"),
        (b'{"label": 1, "x": [1]}\n\xff\xfe\n', "line 2: not UTF-8"),
    ]:
        test.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(SystemExit) as exit_:
            main(["stream", "--source", str(source), "--test", str(test), "--out",
                  str(tmp_path / "run"), "--no-secure"])  # fmt: skip
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and len(err) == 1 and reason in err[0], err
        assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_invalid_utf8_on_standard_input_is_one_skipped_line(tmp_path):
    lines = [line.encode() for line in event_lines(30)]
    lines[9] = b'{"client": "c0", "label": 1, "x": [1, 2, 3, 4, \xff]}'
    result = subprocess.run(
        [*COMMAND, "--source", "-", "--out", str(tmp_path / "run"), *FLAGS],
        input=b"\n".join(lines) + b"\n",
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"},
    )
    err = result.stderr.decode()
    assert result.returncode == 0, err
    assert [line for line in err.splitlines() if line.startswith("warning")] == [
        "warning: line 10: not UTF-8 text (byte 48); event skipped"
    ]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["events"] == 29


@pytest.mark.slow
def test_a_fifo_as_npy_file_or_test_set_does_not_hang(tmp_path, capsys):
    root = tmp_path / "files"  # the run folder is not under it: outputs never are
    root.mkdir()
    fifo = root / "rows.npy"
    os.mkfifo(fifo)
    source = tmp_path / "events.jsonl"
    lines = event_lines(5)
    lines.append(json.dumps({"client": "c0", "label": 1, "path": "rows.npy", "row": 0}))
    source.write_text("\n".join(lines) + "\n")
    start = time.monotonic()
    main(
        ["stream", "--source", str(source), "--files-root", str(root)]
        + ["--out", str(tmp_path / "run"), *FLAGS]
    )
    err = capsys.readouterr().err
    assert "warning: line 6: cannot read" in err and "not a regular file" in err
    with pytest.raises(SystemExit) as exit_:
        main(["stream", "--source", str(source), "--test", str(fifo), "--no-secure"])
    assert exit_.value.code == 2 and "not a regular file" in capsys.readouterr().err
    assert time.monotonic() - start < 10


# -- stops by signal and resumes -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("stop", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_the_stream_with_a_checkpoint_and_resume_ends_as_uninterrupted(
    tmp_path, stop, code
):
    lines = event_lines(400, seed=4)
    source, out = tmp_path / "events.jsonl", tmp_path / "stopped"
    source.write_text("\n".join(lines) + "\n")
    reference = StreamRun(stream_config(source, tmp_path / "reference"))
    reference.run()
    process = subprocess.Popen(
        [*COMMAND, "--source", "-", "--out", str(out), *FLAGS],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdin is not None
    process.stdin.write("\n".join(lines[:260]) + "\n")
    process.stdin.flush()
    wait_for(out / "metrics.jsonl", '"events": 250', process)
    process.send_signal(stop)  # waiting for more input, or learning the last lines
    _, err = process.communicate(timeout=60)
    assert process.returncode == code
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"stopped by {stop.name} after line ")
    assert "checkpoint written; resume with: stratify stream --source - --out" in last
    consumed = read_checkpoint(out / "checkpoint.pt")["lines"]
    assert 250 <= consumed <= 260 and f"after line {consumed} " in last
    # a producer that continues after the consumed lines loses none
    continued = tmp_path / "continued.jsonl"
    continued.write_text("\n".join(lines[consumed:]) + "\n")
    resumed = StreamRun(stream_config(continued, out), resume=True)
    resumed.run()
    assert_same_model(resumed, reference)
    assert metrics_of(out) == metrics_of(tmp_path / "reference")


def test_resume_tells_a_replay_from_a_continuation_and_refuses_an_ambiguous_source(
    tmp_path, monkeypatch
):
    lines = event_lines(330, seed=3)
    full, first, rest = (tmp_path / name for name in ("full.jsonl", "first.jsonl", "rest.jsonl"))
    full.write_text("\n".join(lines) + "\n")
    first.write_text("\n".join(lines[:200]) + "\n")
    rest.write_text("\n".join(lines[200:]) + "\n")
    trained: list[int] = []
    use = ClientBuffers.use

    def recording_use(buffers, slot, times=1):
        trained.append(int(buffers.sample_id[slot]))
        return use(buffers, slot, times)

    monkeypatch.setattr(ClientBuffers, "use", recording_use)
    reference = StreamRun(stream_config(full, tmp_path / "reference"))
    reference.run()
    reference_trained = list(trained)
    for name, source in [("replays", full), ("continues", rest)]:
        out = tmp_path / name
        trained.clear()
        StreamRun(stream_config(first, out)).run()
        messages: list[str] = []
        resumed = StreamRun(stream_config(source, out), resume=True, on_message=messages.append)
        resumed.run()
        assert messages[0].startswith(f"the source {name} the stream"), messages
        # every event learned once: both runs together made exactly the reference's steps
        assert trained == reference_trained
        assert_same_model(resumed, reference)
        assert metrics_of(out) == metrics_of(tmp_path / "reference")
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(lines[:3]) + "\n")
    with pytest.raises(ConfigError, match="cannot tell whether --source replays .* --source-pos"):
        StreamRun(stream_config(short, tmp_path / "replays"), resume=True).run()
    changed = tmp_path / "changed.jsonl"
    edited = lines[:320]
    edited[318] = event_line(319, np.random.default_rng(5))
    changed.write_text("\n".join(edited) + "\n")
    with pytest.raises(ConfigError, match="line 319 of --source differs"):
        StreamRun(stream_config(changed, tmp_path / "replays"), resume=True).run()
    with pytest.raises(ConfigError, match="--source-position applies to --resume only"):
        StreamRun(stream_config(full, tmp_path / "new"), source_position="replay")


def test_train_loss_after_resume_equals_an_uninterrupted_run(tmp_path):
    """Checkpoints every 70 events, metrics every 50: the loss since the last metrics
    line is carried by the checkpoint (issue 31, item 9)."""
    lines = event_lines(330, seed=5)
    source = tmp_path / "events.jsonl"
    source.write_text("\n".join(lines) + "\n")
    reference = StreamRun(stream_config(source, tmp_path / "reference", checkpoint_every=70))
    reference.run()
    crashing = StreamRun(stream_config(source, tmp_path / "crashed", checkpoint_every=70))
    ingest = crashing.learner.ingest

    def ingest_until_killed(event, prediction=None):
        if event.line == 250:
            raise KeyboardInterrupt  # after the checkpoint at 210, the metrics line at 200
        return ingest(event, prediction)

    crashing.learner.ingest = ingest_until_killed  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        crashing.run()
    StreamRun(stream_config(source, tmp_path / "crashed", checkpoint_every=70), resume=True).run()
    resumed, expected = metrics_of(tmp_path / "crashed"), metrics_of(tmp_path / "reference")
    assert [r["train_loss"] for r in resumed] == [r["train_loss"] for r in expected]
    assert resumed == expected


def test_a_private_stream_with_a_dp_seed_resumes_as_an_uninterrupted_one(tmp_path):
    """--dp-seed (simulations only): a stream killed after its checkpoint at event 210
    and resumed ends with the weights and metrics of one never stopped; its noise went on
    from the checkpoint instead of starting its sequence again (which drew, on other
    samples, noise already used)."""
    lines = event_lines(330, seed=5)
    source = tmp_path / "events.jsonl"
    source.write_text("\n".join(lines) + "\n")
    private = {"dp_noise": 1.0, "dp_clip": 1.0, "dp_seed": 7, "new_class": "random"}
    settings = {**private, "scale": "none", "checkpoint_every": 70}
    reference = StreamRun(stream_config(source, tmp_path / "reference", **settings))
    reference.run()
    crashing = StreamRun(stream_config(source, tmp_path / "crashed", **settings))
    ingest = crashing.learner.ingest

    def ingest_until_killed(event, prediction=None):
        if event.line == 250:
            raise KeyboardInterrupt  # after the checkpoint at 210
        return ingest(event, prediction)

    crashing.learner.ingest = ingest_until_killed  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        crashing.run()
    resumed = StreamRun(stream_config(source, tmp_path / "crashed", **settings), resume=True)
    resumed.run()
    expected = reference.learner.model.state_dict()
    for name, value in resumed.learner.model.state_dict().items():
        assert np.array_equal(value, expected[name]), name
    assert metrics_of(tmp_path / "crashed") == metrics_of(tmp_path / "reference")


def test_a_partial_last_line_is_consumed_only_once_complete(tmp_path):
    """A writer still writing the last line: it is not consumed, and a resume after the
    writer finished learns it (issue 31, item 8)."""
    lines = event_lines(60, seed=6)
    source, out = tmp_path / "events.jsonl", tmp_path / "run"
    source.write_text("\n".join(lines[:50]) + "\n" + lines[50][:17])
    rejected: list[tuple[int, str]] = []
    summary = StreamRun(
        stream_config(source, out), on_reject=lambda line, why: rejected.append((line, why))
    ).run()
    assert summary["events"] == 50 and rejected[0][0] == 51 and "not consumed" in rejected[0][1]
    assert read_checkpoint(out / "checkpoint.pt")["lines"] == 50
    source.write_text("\n".join(lines) + "\n")
    summary = StreamRun(stream_config(source, out), resume=True).run()
    assert summary["events"] == 60 and summary["rejected"] == 0
    complete = tmp_path / "complete.jsonl"
    complete.write_text("\n".join(lines))  # a whole last line without its newline
    assert StreamRun(stream_config(complete, None)).run()["events"] == 60


# -- labels later, predictions, metrics ------------------------------------------------------


def test_unlabeled_events_are_predicted_and_late_labels_learned(tmp_path, capsys):
    rng = np.random.default_rng(8)
    lines = []
    for number in range(1, 201):
        event = json.loads(event_line(number, rng))
        if number % 4 == 0:
            label = event.pop("label")
            event["id"] = f"e{number}"
            lines += [json.dumps(event), json.dumps({"id": f"e{number}", "label": label})]
        elif number % 4 == 1 and number > 1:
            del event["label"]
            lines.append(json.dumps(event))
        else:
            lines.append(json.dumps(event))
    lines.append(json.dumps({"id": "nobody", "label": 1}))
    source, predictions = tmp_path / "events.jsonl", tmp_path / "predictions.jsonl"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    main(["stream", "--source", str(source), "--out", str(out), "--predictions",
          str(predictions), *FLAGS])  # fmt: skip
    err = capsys.readouterr().err
    assert "no unlabeled event with id 'nobody' is waiting for its label" in err
    written = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert len(written) == 50 + 49 and {w["id"] for w in written if w["id"]} == {
        f"e{n}" for n in range(4, 201, 4)
    }
    assert all(w["prediction"] in (0, 1, 2, 3) and 0 < w["probability"] <= 1 for w in written)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events"] == 200 - 49 and summary["predicted"] == 99
    with pytest.raises(SystemExit) as exit_:  # a new run would lose the predictions written
        main(["stream", "--source", str(source), "--out", str(tmp_path / "other"),
              "--predictions", str(predictions), *FLAGS])  # fmt: skip
    assert exit_.value.code == 2 and "is a file that is not empty" in capsys.readouterr().err


def test_metrics_are_appended_and_memory_does_not_grow_with_reports(tmp_path):
    source, out = tmp_path / "events.jsonl", tmp_path / "run"
    source.write_text("\n".join(event_lines(300)) + "\n")
    run = StreamRun(stream_config(source, out, eval_every=1))
    run.run()
    records = metrics_of(out)
    assert [r["events"] for r in records] == list(range(1, 301))
    assert len(run.records) == 10 and run.record_count == 300
    checkpoint = read_checkpoint(out / "checkpoint.pt")
    assert checkpoint["metrics_bytes"] == (out / "metrics.jsonl").stat().st_size
    assert len(checkpoint["recent_records"]) == 10 and "records" not in checkpoint
    last = records[-1]
    for key in ("macro_f1", "log_loss", "majority_accuracy", "class_recall", "train_loss"):
        assert last[key] is not None, key
    assert all(r["train_loss"] is not None for r in records[1:])


def test_a_folder_holding_metrics_is_kept_when_the_stream_dies_before_a_checkpoint(tmp_path):
    source, out = tmp_path / "events.jsonl", tmp_path / "run"
    source.write_text("\n".join(event_lines(120)) + "\n")
    run = StreamRun(stream_config(source, out, checkpoint_every=1000))
    ingest = run.learner.ingest

    def dying(event, prediction=None):
        if event.line == 110:
            raise KeyboardInterrupt
        return ingest(event, prediction)

    run.learner.ingest = dying  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        run.run()
    assert [r["events"] for r in metrics_of(out)] == [50, 100]
    assert not (out / "checkpoint.pt").exists()


def test_the_periodic_fedavg_baseline_runs_from_the_command_line(tmp_path):
    source, out = tmp_path / "events.jsonl", tmp_path / "run"
    source.write_text("\n".join(event_lines(200)) + "\n")
    flags = [flag for flag in FLAGS if flag not in ("--max-uses", "3")]
    main(["stream", "--source", str(source), "--out", str(out), *flags, "--algorithm",
          "fedavg-periodic", "--retrain-every", "40", "--local-epochs", "2"])  # fmt: skip
    records = metrics_of(out)
    assert records[-1]["rounds"] == 5 and records[-1]["steps"] > 0
    assert json.loads((out / "config.json").read_text())["algorithm"] == "fedavg-periodic"


def scaled_stream(count: int, spike_at: int | None = None, scale: float = 1000) -> list[str]:
    """Raw tabular events, one feature ``scale`` times the others; optionally a spike, in
    the rarest class (the majority class's samples wait longer in the buffers to be
    trained: the schedule gives every class the same steps)."""
    rng = np.random.default_rng(11)
    lines = []
    for number in range(1, count + 1):
        label = int(rng.choice(3, p=[0.6, 0.25, 0.15]))
        x = rng.normal(0, 1, 4)
        x[label + 1] += 2.0
        x[0] = scale * (x[0] + label)
        if number == spike_at:
            x[:], label = 1e30, 2
        lines.append(json.dumps({"client": f"c{number % 4}", "label": label, "x": x.tolist()}))
    return lines


def test_raw_features_of_different_scales_are_learned_and_divergence_stops_in_one_line(
    tmp_path, capsys
):
    source = tmp_path / "events.jsonl"
    source.write_text("\n".join(scaled_stream(1500)) + "\n")
    main(["stream", "--source", str(source), "--out", str(tmp_path / "scaled"), "--no-secure",
          "--eval-every", "100"])  # fmt: skip
    records = metrics_of(tmp_path / "scaled")
    assert all(r["train_loss"] is not None for r in records)
    assert records[-1]["prequential_accuracy"] >= records[-1]["majority_accuracy"] + 0.1
    capsys.readouterr()
    source.write_text("\n".join(scaled_stream(300, spike_at=150, scale=1)) + "\n")
    out = tmp_path / "diverged"
    flags = ["--source", str(source), "--out", str(out), "--no-secure", "--scale", "none",
             "--eval-every", "50", "--checkpoint-every", "100"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        main(["stream", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 1 and len(err) == 1, err
    diverged = re.match(r"error: training diverged at event (\d+) \(line (\d+)\)", err[0])
    assert diverged and diverged[1] == diverged[2] and int(diverged[1]) >= 150  # the spike
    assert "--lr 0.01 --momentum 0 --steps-per-event 1 --scale none" in err[0]
    assert "the last checkpoint is kept" in err[0]
    checkpoint = read_checkpoint(out / "checkpoint.pt")
    event = int(diverged[1])
    assert checkpoint["lines"] == (event - 1) // 100 * 100  # the last one before it
    assert all(np.isfinite(w).all() for w in checkpoint["learner"]["model"].values())
    assert [r["events"] for r in metrics_of(out)] == list(range(50, event, 50))
    main(["stream", *flags, "--resume", "--on-diverge", "skip"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events"] == 300 and summary["undone_updates"] >= 1
    assert all(r["train_loss"] is not None for r in metrics_of(out))


def test_progress_is_a_plain_line_when_stderr_is_not_a_terminal(monkeypatch, capsys):
    import io

    from rich.console import Console

    import stratify.cli.stream as command

    monkeypatch.setattr(command, "PLAIN_PROGRESS_SECONDS", 0.0)
    display = command.StreamProgress(Console(file=io.StringIO()))
    assert not display.terminal
    status = {"events": 10, "window_accuracy": 0.5, "buffer_fill": 0.25, "classes": 2,
              "clients": 3, "rejected": 1}  # fmt: skip
    display.progress_update(status)
    time.sleep(0.01)
    display.progress_update({**status, "events": 20})
    display.reject(7, "malformed JSON")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("stream: 20 events · ") and "window acc 50.0%" in lines[0]
    assert lines[1] == "warning: line 7: malformed JSON; event skipped"
