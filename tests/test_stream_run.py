"""`stratify stream` and its run folder: bad lines reported and skipped, files as for
`train`, and resuming after a kill without training a sample twice or losing one."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from streams import FEATURES, FLAGS, SETTINGS, event_line, stream_config

from stratify.cli.main import main
from stratify.errors import ConfigError, StratifyError
from stratify.runfolder import read_checkpoint
from stratify.stream import StreamConfig
from stratify.stream.buffers import ClientBuffers
from stratify.stream.learner import StreamLearner
from stratify.stream.run import StreamRun


def write_events(path: Path, count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    lines = [event_line(number, rng) for number in range(1, count + 1)]
    path.write_text("\n".join(lines) + "\n")
    return lines


def record_training(monkeypatch) -> list[int]:
    """The event (line number) behind every single-sample step, in order."""
    trained: list[int] = []
    use = ClientBuffers.use

    def recording_use(buffers, slot, times=1):
        trained.append(int(buffers.sample_id[slot]))
        return use(buffers, slot, times)

    monkeypatch.setattr(ClientBuffers, "use", recording_use)
    return trained


def metrics_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def comparable_records(records: list[dict]) -> list[dict]:
    timing = ("events_per_second", "ingest_seconds")
    return [{k: v for k, v in r.items() if k not in timing} for r in records]


def assert_same_learner(first: StreamLearner, second: StreamLearner) -> None:
    for a, b in zip(first.model.state_dict().values(), second.model.state_dict().values()):
        assert np.array_equal(a, b)
    assert first.buffers.num_clients == second.buffers.num_clients
    used = first.buffers.num_clients * first.buffers.capacity  # storage may be allocated beyond
    for name in ("occupied", "sample_id", "uses", "placeholder", "counts"):
        first_values, second_values = getattr(first.buffers, name), getattr(second.buffers, name)
        np.testing.assert_array_equal(first_values[:used], second_values[:used])
    assert torch.equal(first.buffers.x[:used], second.buffers.x[:used])
    assert first.registry.result.client_maps == second.registry.result.client_maps


# -- bad lines ------------------------------------------------------------------------------


def test_bad_lines_are_reported_with_their_number_and_the_stream_goes_on(tmp_path):
    rng = np.random.default_rng(1)
    good = [event_line(n, rng) for n in range(1, 41)]
    bad = {
        41: "not json at all",
        42: json.dumps({"client": "c0", "label": 1, "x": [1.0, 2.0]}),
        43: json.dumps({"client": "c0", "x": [0.0] * FEATURES}),
        44: '{"client": "c0", "label": 1, "x": [1, NaN, 0, 0, 0]}',
        45: '{"client": "c0", "label": 1, "x": [1, 0, Infinity, 0, 0]}',
        46: json.dumps({"client": "intruder", "label": 1, "x": [0.0] * FEATURES}),
    }
    after = [event_line(n, rng) for n in range(47, 67)]
    source = tmp_path / "events.jsonl"
    source.write_text("\n".join(good + list(bad.values()) + after) + "\n")
    rejected: list[tuple[int, str]] = []
    run = StreamRun(
        stream_config(source, None, max_clients=3),
        on_reject=lambda line, reason: rejected.append((line, reason)),
    )
    summary = run.run()
    assert [line for line, _ in rejected] == list(bad)
    reasons = [reason for _, reason in rejected]
    assert reasons[0].startswith("malformed JSON")
    assert reasons[1] == "2 features, the stream's samples have 5"
    assert reasons[2].startswith("no label: give --predictions FILE")
    assert reasons[3] == reasons[4]
    assert reasons[3].startswith("the features hold NaN or infinity")
    assert reasons[5] == "client 'intruder' is new and --max-clients 3 clients are registered"
    assert summary["events"] == 60 and summary["rejected"] == 6 and summary["lines"] == 66


def test_the_command_prints_one_line_per_skipped_event_and_reads_standard_input(
    tmp_path, monkeypatch, capsys
):
    rng = np.random.default_rng(2)
    lines = [event_line(n, rng) for n in range(1, 31)]
    lines.insert(10, "{oops")
    lines.insert(20, json.dumps({"client": "c1", "label": 2, "x": [1.0] * (FEATURES + 2)}))
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    main(["stream", "--source", "-", "--out", str(tmp_path / "run"), *FLAGS])
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: line 11: malformed JSON (Expecting property name enclosed in double quotes "
        "at column 2); event skipped",
        "warning: line 21: 7 features, the stream's samples have 5; event skipped",
    ]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["events"] == 30 and summary["rejected"] == 2


def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default run folder is relative to it
    for argv, message in [
        (["stream"], "error: --source is required"),
        (["stream", "--source", str(tmp_path / "none.jsonl")], "no such file"),
        (["stream", "--source", "-", "--capacity", "0"], "--capacity must be a positive"),
        (["stream", "--source", "-", "--test", str(tmp_path / "t.jsonl")], "--test"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert exit_.value.code == 2 and err.startswith("error: ") and message in err
        assert len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # nothing written for a refused stream


# -- run folder -----------------------------------------------------------------------------


def test_the_run_folder_holds_the_files_of_train_and_is_not_overwritten(tmp_path):
    source, out = tmp_path / "events.jsonl", tmp_path / "run"
    write_events(source, 120)
    test = tmp_path / "test.jsonl"
    rng = np.random.default_rng(5)
    test.write_text("".join(event_line(0, rng) + "\n" for _ in range(30)))
    summary = StreamRun(stream_config(source, out, test=str(test))).run()
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint.pt", "config.json", "metrics.jsonl", "summary.json"
    ]  # fmt: skip
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["events"] for r in records] == [50, 100, 120]
    assert all(0 <= r["test_accuracy"] <= 1 and 0 <= r["window_accuracy"] <= 1 for r in records)
    assert records[-1]["buffered"] <= 3 * 8 and records[-1]["steps"] == 120
    assert summary["final_test_accuracy"] == records[-1]["test_accuracy"]
    assert json.loads((out / "config.json").read_text())["capacity"] == 8
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(StratifyError, match="already holds a run"):
        StreamRun(stream_config(source, out))
    assert (out / "metrics.jsonl").read_text() == before
    with pytest.raises(ConfigError, match="contradict"):
        StreamRun(stream_config(source, out), resume=True, overwrite=True)
    with pytest.raises(ConfigError, match="configuration differs from the checkpoint .*capacity"):
        StreamRun(
            StreamConfig(**{**SETTINGS, "capacity": 9}, source=str(source), out=str(out)),
            resume=True,
        )
    with pytest.raises(StratifyError, match="--resume: no run in"):
        StreamRun(stream_config(source, tmp_path / "empty"), resume=True)
    StreamRun(stream_config(source, out), overwrite=True).run()
    assert not (out / "metrics.jsonl").read_text() == "" and (out / "summary.json").exists()


def test_an_unreadable_checkpoint_is_one_error(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"not a checkpoint")
    source = tmp_path / "events.jsonl"
    write_events(source, 5)
    with pytest.raises(ConfigError, match="is unreadable"):
        StreamRun(stream_config(source, out), resume=True)


# -- resume -------------------------------------------------------------------------------


def as_tensors(state):
    """``state`` with its arrays as tensors, as a format-2 checkpoint (torch.save) had."""
    if isinstance(state, np.ndarray):
        return torch.from_numpy(state)
    if isinstance(state, dict):
        return {key: as_tensors(value) for key, value in state.items()}
    if isinstance(state, list):
        return [as_tensors(value) for value in state]
    return state


def test_a_checkpoint_from_before_imprinting_resumes_with_random_rows_only(tmp_path):
    """A checkpoint written before --new-class existed (format 2: torch.save of tensors)
    drew new rows at random: it resumes with --new-class random, and the default is
    refused in one line naming it."""
    source = tmp_path / "events.jsonl"
    write_events(source, 120)
    out = tmp_path / "run"
    StreamRun(stream_config(source, out, new_class="random")).run()
    checkpoint = read_checkpoint(out / "checkpoint.pt")
    assert checkpoint["format"] == 3  # an array checkpoint, torch-free
    del checkpoint["config"]["new_class"]
    torch.save({**as_tensors(checkpoint), "format": 2}, out / "checkpoint.pt")
    with pytest.raises(ConfigError, match="new_class: checkpoint 'random' vs now 'auto'"):
        StreamRun(stream_config(source, out), resume=True)
    StreamRun(stream_config(source, out, new_class="random"), resume=True).run()


def test_resume_after_a_crash_continues_exactly_where_the_checkpoint_was(tmp_path, monkeypatch):
    source = tmp_path / "events.jsonl"
    write_events(source, 330, seed=3)
    trained = record_training(monkeypatch)
    reference = StreamRun(stream_config(source, tmp_path / "reference"))
    reference.run()
    reference_trained = list(trained)

    trained.clear()
    crashing = StreamRun(stream_config(source, tmp_path / "crashed"))
    ingest = crashing.learner.ingest

    def ingest_until_killed(event):
        if event.line == 260:
            raise KeyboardInterrupt  # killed between two checkpoints (lines 200 and 300)
        return ingest(event)

    crashing.learner.ingest = ingest_until_killed  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        crashing.run()
    before_crash = list(trained)
    checkpoint = read_checkpoint(tmp_path / "crashed" / "checkpoint.pt")
    assert checkpoint["lines"] == 200
    saved_buffers = checkpoint["learner"]["buffers"]
    buffered = set(saved_buffers["sample_id"][saved_buffers["occupied"]].tolist())

    trained.clear()
    resumed = StreamRun(stream_config(source, tmp_path / "crashed"), resume=True)
    restored = resumed.learner.buffers
    assert set(restored.sample_id[restored.occupied].tolist()) == buffered  # none lost
    metrics = (tmp_path / "crashed" / "metrics.jsonl").read_text().splitlines()
    # kept until the resumed stream learns again: then cut back to the checkpoint's
    assert [json.loads(line)["events"] for line in metrics] == [50, 100, 150, 200, 250]
    resumed.run()
    steps_at_checkpoint = checkpoint["learner"]["stats"]["steps"]
    # the steps after the checkpoint were undone with the crash and made once, afterwards
    assert before_crash[:steps_at_checkpoint] + trained == reference_trained
    assert len(before_crash) > steps_at_checkpoint
    assert_same_learner(resumed.learner, reference.learner)
    assert comparable_records(metrics_of(tmp_path / "crashed")) == comparable_records(
        metrics_of(tmp_path / "reference")
    )


@pytest.mark.slow
def test_resume_after_a_kill_of_the_command_fed_by_a_pipe(tmp_path):
    """The real thing: `stratify stream --source -` killed with SIGKILL mid-stream."""
    source, out = tmp_path / "events.jsonl", tmp_path / "killed"
    lines = write_events(source, 300, seed=4)
    reference = StreamRun(stream_config(source, tmp_path / "reference"))
    reference.run()

    command = [sys.executable, "-m", "stratify.cli.main", "stream", "--source", "-"]
    process = subprocess.Popen(
        [*command, "--out", str(out), *FLAGS],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdin is not None
    process.stdin.write("\n".join(lines[:260]) + "\n")
    process.stdin.flush()
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 240
    # events 201-250 are learned (the metrics line of event 250 shows it) but not saved
    while time.monotonic() < deadline:
        if metrics.exists() and '"events": 250' in metrics.read_text():
            break
        time.sleep(0.2)
    else:
        process.kill()
        pytest.fail("the command did not reach event 250 in time")
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert read_checkpoint(out / "checkpoint.pt")["lines"] == 200

    resumed = StreamRun(stream_config(source, out), resume=True)
    assert resumed.lines == 200
    resumed.run()
    assert_same_learner(resumed.learner, reference.learner)
    assert comparable_records(metrics_of(out)) == comparable_records(
        metrics_of(tmp_path / "reference")
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["events"] == 300 and summary["steps"] == reference.learner.stats.steps


@pytest.mark.parametrize("position", ["replay", "continue"])
def test_resume_with_an_explicit_position_never_learns_a_line_twice(tmp_path, position):
    """A stream stopped after 150 lines, resumed with --source-position replay (the whole
    source again) or continue (only the new lines): every line learned once, the learner
    as an uninterrupted stream's."""
    lines = write_events(tmp_path / "all.jsonl", 300, seed=5)
    reference = StreamRun(stream_config(tmp_path / "all.jsonl", tmp_path / "reference"))
    reference.run()
    first = tmp_path / "first.jsonl"
    first.write_text("\n".join(lines[:150]) + "\n")
    StreamRun(stream_config(first, tmp_path / "stopped")).run()
    rest = tmp_path / "rest.jsonl"
    rest.write_text("\n".join(lines[150:]) + "\n")
    source = tmp_path / ("all.jsonl" if position == "replay" else "rest.jsonl")
    resumed = StreamRun(
        stream_config(source, tmp_path / "stopped"), resume=True, source_position=position
    )
    summary = resumed.run()
    assert summary["events"] == 300 and summary["lines"] == 300
    assert_same_learner(resumed.learner, reference.learner)
