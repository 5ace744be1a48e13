"""No output ever replaces an input of the same command, nor a file its run owns
(docs/architecture.md, "Run folder"): every command that writes, every way of naming the
same file (the path, a symlink, a hard link), refused in one line with exit 2 before
anything is written, whatever --overwrite says."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from streams import FLAGS, event_line

from stratify.cli.main import main


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def events(count: int, unlabeled_every: int = 4) -> str:
    rng = np.random.default_rng(0)
    lines = []
    for number in range(1, count + 1):
        event = json.loads(event_line(number, rng))
        if number % unlabeled_every == 0:
            del event["label"]  # a prediction is asked for
        lines.append(json.dumps(event))
    return "\n".join(lines) + "\n"


@pytest.fixture
def stream_files(tmp_path: Path) -> dict[str, Path]:
    """A source, a held-out set, and a finished stream run folder ``done`` of them."""
    source, test = tmp_path / "events.jsonl", tmp_path / "test.jsonl"
    source.write_text(events(60))
    test.write_text(events(20, unlabeled_every=10**6))
    done = tmp_path / "done"
    main(["stream", "--source", str(source), "--out", str(done), *FLAGS])
    assert (done / "metrics.jsonl").is_file()
    return {"S": source, "T": test, "RUN": done, "DIR": tmp_path}


def symlink(dir_: Path, target: Path) -> Path:
    link = dir_ / "link.png"
    link.symlink_to(target)
    return link


def hardlink(dir_: Path, target: Path) -> Path:
    link = dir_ / "hard.jsonl"
    os.link(target, link)
    return link


#: (case, argv with S/T/RUN/NEW/LINK placeholders, the protected file, how it is named)
CASES = [
    (
        "predictions over the source, --overwrite",
        ["stream", "--source", "S", "--predictions", "S", "--out", "NEW", "--overwrite"],
        "S",
        "the --source events of this stream",
    ),
    (
        "predictions over the held-out set",
        ["stream", "--source", "S", "--test", "T", "--predictions", "T", "--overwrite"],
        "T",
        "the --test samples of this stream",
    ),
    (
        "predictions through a symlink to the source",
        ["stream", "--source", "S", "--predictions", "LINK:S", "--out", "NEW"],
        "S",
        "the --source events of this stream",
    ),
    (
        "predictions through a hard link to the source",
        ["stream", "--source", "S", "--predictions", "HARD:S", "--out", "NEW", "--overwrite"],
        "S",
        "the --source events of this stream",
    ),
    (
        "predictions into the resumed run's metrics",
        ["stream", "--source", "S", "--predictions", "RUN/metrics.jsonl", "--out", "RUN"]
        + ["--resume"],
        "RUN/metrics.jsonl",
        "the metrics.jsonl of the run in",
    ),
    (
        "predictions into the resumed run's checkpoint",
        ["stream", "--source", "S", "--predictions", "RUN/checkpoint.pt", "--out", "RUN"]
        + ["--resume"],
        "RUN/checkpoint.pt",
        "the checkpoint.pt of the run in",
    ),
    (
        "the run's own metrics as the source of its resumption",
        ["stream", "--source", "RUN/metrics.jsonl", "--out", "RUN", "--resume"],
        "RUN/metrics.jsonl",
        "its metrics.jsonl would be the --source events",
    ),
    (
        "replacing the run folder that holds the source",
        ["stream", "--source", "RUN/copy.jsonl", "--out", "RUN", "--overwrite"],
        "RUN/copy.jsonl",
        "would delete",
    ),
    (
        "a plot written through a symlink to the run's metrics",
        ["plot", "RUN", "--out", "LINK:RUN/metrics.jsonl"],
        "RUN/metrics.jsonl",
        "a file this command reads",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "argv", "protected", "named"), CASES, ids=[c[0] for c in CASES])
def test_an_output_naming_an_input_is_refused_before_anything_is_written(
    stream_files, capsys, case, argv, protected, named
):
    files = stream_files
    (files["RUN"] / "copy.jsonl").write_bytes(files["S"].read_bytes())

    def place(word: str) -> str:
        if word.startswith("LINK:"):
            return str(symlink(files["DIR"], Path(place(word[5:]))))
        if word.startswith("HARD:"):
            return str(hardlink(files["DIR"], Path(place(word[5:]))))
        head, _, tail = word.partition("/")
        if head in files:
            return str(files[head] / tail) if tail else str(files[head])
        return str(files["DIR"] / "new") if word == "NEW" else word

    target = Path(place(protected))
    command = [place(word) for word in argv] + (FLAGS if argv[0] == "stream" else [])
    before = {path: digest(path) for path in files["DIR"].rglob("*") if path.is_file()}
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(command)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2, err
    assert len(err.splitlines()) == 1 and named in err, err
    assert "already holds predictions" not in err
    after = {path: digest(path) for path in files["DIR"].rglob("*") if path.is_file()}
    assert after == before  # nothing written, the protected file included
    assert digest(target) == before[target]
    assert not (files["DIR"] / "new").exists()


@pytest.mark.slow
def test_a_non_empty_predictions_file_is_refused_for_what_it_is(stream_files, capsys):
    other = stream_files["DIR"] / "notes.txt"
    other.write_text("my notes\n")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["stream", "--source", str(stream_files["S"]), "--predictions", str(other), *FLAGS])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "is a file that is not empty" in err
    assert other.read_text() == "my notes\n"


@pytest.mark.slow
def test_the_guard_ends_with_the_stream(stream_files, capsys):
    """A library stream releases its inputs: the same process may write there later."""
    source = stream_files["S"]
    main(["stream", "--source", str(source), "--out", str(stream_files["DIR"] / "b"), *FLAGS])
    from stratify.files import guarded_as

    assert guarded_as(source) is None


def test_a_guard_is_released_only_by_its_owner(tmp_path):
    from stratify.files import guard_input, guarded_as, release_input

    checkpoint = tmp_path / "checkpoint.pt"
    run, other_run = object(), object()
    guard_input(checkpoint, "a file of another run", owner=run)
    try:
        release_input(checkpoint, owner=other_run)  # another run ending frees nothing
        assert guarded_as(checkpoint, owner=other_run) is not None
        assert guarded_as(checkpoint, owner=run) is None  # its own writer may write it
        release_input(checkpoint, owner=run)
        assert guarded_as(checkpoint, owner=other_run) is None
    finally:
        release_input(checkpoint)
