"""Every long piece of a stream's work is bounded up front or stops on a signal, and no
write waits forever (docs/architecture.md, "Streaming"): end to end, with real
processes, FIFOs and signals, each bounded in time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from streams import FLAGS, event_line

from stratify.stream.run import STOP_GRACE_SECONDS

COMMAND = [sys.executable, "-m", "stratify.cli.main", "stream"]


def write_events(path: Path, count: int, unlabeled: bool = False) -> None:
    rng = np.random.default_rng(0)
    lines = []
    for number in range(1, count + 1):
        event = json.loads(event_line(number, rng))
        if unlabeled and number > 10:
            del event["label"]
        lines.append(json.dumps(event))
    path.write_text("\n".join(lines) + "\n")


def stop_bound(startup: float) -> float:
    """Seconds a stopped stream may take to exit: the grace period, plus twice the time
    this machine took to start the same process up to its first checkpoint (imports,
    model, first events; at least 5 s), measured in the test. Beside a two-worker grid,
    leaving took 0.2-3.3 s beyond the grace against starts of 0.7-4.1 s; both slow alike
    under load, so the bound follows the load where a fixed figure failed under it. A
    stream that ignored the signal runs its round for minutes."""
    return STOP_GRACE_SECONDS + max(5.0, 2 * startup)


def stream(*arguments: str, timeout: float = 60, **options) -> subprocess.CompletedProcess:
    return subprocess.run([*COMMAND, *arguments], capture_output=True, timeout=timeout, **options)


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags",
    [
        ["--steps-per-event", "1000000000"],
        ["--algorithm", "fedavg-periodic", "--local-epochs", "1000000000"],
    ],
)
def test_an_unbounded_unit_of_work_is_refused_up_front(tmp_path, flags):
    source = tmp_path / "events.jsonl"
    write_events(source, 5)
    result = stream("--source", str(source), "--no-secure", *flags, timeout=60)
    err = result.stderr.decode().strip()
    assert result.returncode == 2 and "takes at most 10,000" in err
    assert len(err.splitlines()) == 1


@pytest.mark.slow
def test_predictions_to_a_fifo_nobody_reads_is_refused_at_once(tmp_path):
    source, fifo = tmp_path / "events.jsonl", tmp_path / "predictions"
    write_events(source, 20, unlabeled=True)
    os.mkfifo(fifo)
    start = time.monotonic()
    out = tmp_path / "run"
    result = stream("--source", str(source), "--predictions", str(fifo), "--out", str(out), *FLAGS)
    err = result.stderr.decode().strip()
    assert result.returncode == 2 and "a FIFO no process reads" in err, err
    assert len(err.splitlines()) == 1 and not out.exists()
    assert time.monotonic() - start < 30


@pytest.mark.slow
def test_closed_standard_input_is_one_line(tmp_path):
    result = stream("--source", "-", "--no-secure", stdin=subprocess.DEVNULL, timeout=60)
    assert result.returncode == 0  # an empty input is an empty stream
    process = subprocess.run(
        [*COMMAND, "--source", "-", "--no-secure", "--out", str(tmp_path / "run")],
        capture_output=True,
        timeout=60,
        preexec_fn=lambda: os.close(0),
    )
    err = process.stderr.decode().strip()
    assert process.returncode == 2 and "standard input is closed" in err, err
    assert len(err.splitlines()) == 1 and not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("stop", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_inside_a_long_round_stops_the_stream_within_seconds(tmp_path, stop, code):
    """A FedAvg round of 10,000 local epochs runs for minutes: the signal ends it within
    the grace period, the checkpoint before it kept, and a resume goes on from there."""
    source, out = tmp_path / "events.jsonl", tmp_path / "run"
    write_events(source, 60)
    err_path = tmp_path / "err.txt"
    flags = ["--algorithm", "fedavg-periodic", "--retrain-every", "30", "--local-epochs"]
    flags += ["10000", "--checkpoint-every", "20", "--eval-every", "10", "--no-secure"]
    with open(err_path, "w") as err:
        launched = time.monotonic()
        process = subprocess.Popen(
            [*COMMAND, "--source", str(source), "--out", str(out), "--capacity", "50", *flags],
            stderr=err,
            stdout=subprocess.DEVNULL,
        )
        # the first checkpoint (line 20) is written before the round at event 30
        deadline = time.monotonic() + 300
        while not (out / "checkpoint.pt").exists() and time.monotonic() < deadline:
            assert process.poll() is None, err_path.read_text()
            time.sleep(0.1)
        startup = time.monotonic() - launched
        time.sleep(2.0)  # inside the round by now
        sent = time.monotonic()
        process.send_signal(stop)
        # the round alone runs for minutes: a stream that ignored the signal fails here
        process.wait(timeout=max(60.0, 2 * stop_bound(startup)))
    took = time.monotonic() - sent
    message = err_path.read_text().strip().splitlines()[-1]
    assert process.returncode == code, message
    assert took < stop_bound(startup), (took, startup)
    assert "was abandoned" in message and "the checkpoint after line 20 is kept" in message
    summary = json.loads((out / "summary.json").read_text())
    assert summary["lines"] == 20


@pytest.mark.slow
def test_a_predictions_fifo_whose_reader_stops_reading_does_not_hold_the_stream(tmp_path):
    """The reader keeps the FIFO open but reads nothing: the pipe fills, the write
    blocks, and SIGTERM still ends the stream within seconds."""
    source, fifo, out = tmp_path / "events.jsonl", tmp_path / "predictions", tmp_path / "run"
    write_events(source, 3000, unlabeled=True)
    os.mkfifo(fifo)
    opened = threading.Event()
    holder: list[int] = []

    def hold() -> None:
        holder.append(os.open(fifo, os.O_RDONLY))  # waits for the stream, never reads
        opened.set()

    threading.Thread(target=hold, daemon=True).start()
    err_path = tmp_path / "err.txt"
    try:
        with open(err_path, "w") as err:
            launched = time.monotonic()
            process = subprocess.Popen(
                [*COMMAND, "--source", str(source), "--predictions", str(fifo), "--out", str(out)]
                + [*FLAGS, "--checkpoint-every", "5"],
                stderr=err,
                stdout=subprocess.DEVNULL,
            )
            assert opened.wait(300)
            deadline = time.monotonic() + 300
            while not (out / "checkpoint.pt").exists() and time.monotonic() < deadline:
                assert process.poll() is None, err_path.read_text()
                time.sleep(0.1)
            startup = time.monotonic() - launched
            time.sleep(8.0)  # the pipe's 64 KiB fill long before the 3,000 predictions
            assert process.poll() is None, err_path.read_text()
            sent = time.monotonic()
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=max(60.0, 2 * stop_bound(startup)))
        took = time.monotonic() - sent
        assert took < stop_bound(startup), (took, startup)
        assert process.returncode == 143, err_path.read_text()
    finally:
        for fd in holder:
            os.close(fd)
