"""Grids and plots against damaged folders and bad values (issues 26 and 31): a cell whose
files cannot be read back is reported ``corrupt`` and run again (or left), a bad value is
refused before a grid folder is stamped, one grid process per folder, ``plot`` refuses
records it cannot read and draws stream run folders, and outputs are whole files even on
a full disk."""

import csv
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from stratify.algorithms import strategy_class
from stratify.cli.main import main
from stratify.parallel import LocalBackend, RunOutcome
from stratify.reproduce.grids import GRIDS, Grid, Settings, method_column, partition_row
from stratify.reproduce.runner import reproduce

# two methods, one partition, batch mode on the embedded digits: a second or two per cell
TINY = Grid(
    "tiny",
    "FedAvg and Stratify on digits",
    {"dataset": "digits", "mode": "batch", "epochs": 2},
    (partition_row("classes:2", "#C=2"),),
    (method_column("fedavg", local_epochs=1), method_column("stratify", repeat_count=20)),
)


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(GRIDS, "tiny", TINY)
    return TINY


def run_cli(capsys, *args):
    """``stratify ARGS`` in this process: ``(exit code, stdout, stderr lines)``."""
    code = 0
    try:
        main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def assert_one_line(capsys, *args, match=""):
    """Exit code 2 and exactly one line on stderr, holding ``match``."""
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and len(err) == 1, (code, err)
    assert err[0].startswith("error: ") and match in err[0], err
    return err[0]


def snapshot(folder):
    return {path: path.read_bytes() for path in sorted(Path(folder).rglob("*")) if path.is_file()}


def outcomes_of(display_events):
    return {item.name: item for item in display_events if isinstance(item, RunOutcome)}


def recorder():
    events = []

    def display(title, specs):
        from contextlib import nullcontext

        return nullcontext(events.append)

    return display, events


# -- corrupt cells ------------------------------------------------------------------------


def damage_cells(out):
    """Damage the four cells of a tiny two-seed grid, each in another way; returns the
    damaged folders and what each damage is reported as."""
    cells = out / "cells" / "classes-2"
    metrics = cells / "fedavg" / "seed-0" / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes()[:-25])  # cut short in its last line
    (cells / "fedavg" / "seed-1" / "config.json").write_text("[1, 2, 3]\n")  # an array
    (cells / "stratify" / "seed-0" / "summary.json").write_bytes(b'{"a": "\xff\xfe"}')
    # the last cell stopped after epoch 1, its checkpoint then tampered with: it looks
    # resumable, and only the resume finds its zeroed random-generator state
    last = cells / "stratify" / "seed-1"
    checkpoint = torch.load(last / "checkpoint.pt", weights_only=True)
    checkpoint["torch_rng"] = torch.zeros_like(checkpoint["torch_rng"])
    checkpoint["epoch"], checkpoint["records"] = 1, checkpoint["records"][:1]
    torch.save(checkpoint, last / "checkpoint.pt")
    lines = (last / "metrics.jsonl").read_text().splitlines(keepends=True)
    (last / "metrics.jsonl").write_text(lines[0])
    return {
        "classes-2/fedavg/seed-0": "metrics.jsonl line 2 is not valid JSON",
        "classes-2/fedavg/seed-1": "config.json holds a JSON array, not an object",
        "classes-2/stratify/seed-0": "summary.json is not UTF-8 text (byte 7)",
        "classes-2/stratify/seed-1": "checkpoint refused: torch_rng is not a state of torch's",
    }


def test_corrupt_cells_are_reported_left_or_run_again_and_the_grid_goes_on(tiny, tmp_path, capsys):
    settings = Settings(seeds=(0, 1))
    reproduce("tiny", tmp_path, settings, backend=LocalBackend(1))
    (tmp_path / "results.csv").write_bytes(b"\x00\x01 not a csv file")  # replaced whole
    damage = damage_cells(tmp_path)
    damaged = snapshot(tmp_path / "cells")

    # --dry-run reads every cell without failing and names each unreadable one
    arguments = ["reproduce", "tiny", "--out", str(tmp_path), "--seeds", "0,1", "--workers", "1"]
    code, _, err = run_cli(capsys, *arguments, "--dry-run")
    assert code == 0, err
    assert "cells: 4 runs, 0 finished, 4 to run, 7 epochs left, 3 corrupt" in err[0], err
    for key, reason in list(damage.items())[:3]:
        assert any(line.startswith(f"  corrupt: {key}: ") and reason in line for line in err), err

    # --keep-corrupt: every damaged cell is left byte for byte, reported with its reason
    display, events = recorder()
    report = reproduce(
        "tiny", tmp_path, settings, backend=LocalBackend(1), display=display, keep_corrupt=True
    )
    assert snapshot(tmp_path / "cells") == damaged
    outcomes = outcomes_of(events)
    for key, reason in damage.items():
        assert outcomes[key].status == "corrupt" and reason in outcomes[key].message, key
        assert "--overwrite" not in outcomes[key].message  # reproduce has no such flag
    assert [result.status for result in report.results] == ["corrupt"] * 4
    table = (tmp_path / "results.md").read_text()
    for key, reason in damage.items():
        line = next(line for line in table.splitlines() if line.startswith(f"- {key}: "))
        assert line.startswith(f"- {key}: corrupt (") and reason in line
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert [row["status"] for row in rows] == ["corrupt"] * 4

    # without it, each is run again from epoch 1 and the grid finishes
    display, events = recorder()
    report = reproduce("tiny", tmp_path, settings, backend=LocalBackend(1), display=display)
    assert [result.status for result in report.results] == ["finished"] * 4
    outcomes = outcomes_of(events)
    table = (tmp_path / "results.md").read_text()
    for key, reason in damage.items():
        assert outcomes[key].status == "finished" and reason in outcomes[key].corrupt
        assert f"- {key}: was corrupt (" in table
    for folder in (tmp_path / "cells" / "classes-2").glob("*/seed-*"):
        lines = (folder / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["epoch"] for line in lines] == [1, 2]
    assert len(list(csv.DictReader(open(tmp_path / "results.csv")))) == 4


def test_the_command_reports_kept_corrupt_cells_in_one_line(tiny, tmp_path, capsys):
    arguments = ["reproduce", "tiny", "--out", str(tmp_path), "--seeds", "0", "--epochs", "1"]
    assert run_cli(capsys, *arguments, "--workers", "1")[0] == 0
    config = tmp_path / "cells" / "classes-2" / "fedavg" / "seed-0" / "config.json"
    config.write_bytes(b"\xff")
    code, _, err = run_cli(capsys, *arguments, "--keep-corrupt")
    # the board and the files written come first; the error is the one last line
    assert code == 2 and [line for line in err if line.startswith("error:")] == [err[-1]], err
    line = err[-1]
    assert "1 of 2 runs did not finish" in line
    assert "classes-2/fedavg/seed-0: corrupt: " in line and "is not UTF-8 text" in line
    assert line.endswith("without --keep-corrupt to run the corrupt ones again")
    code, out, _ = run_cli(capsys, *arguments, "--workers", "1")
    assert code == 0 and "was corrupt (" in out


def test_grid_outputs_that_are_folders_are_refused_before_anything_runs(tiny, tmp_path, capsys):
    (tmp_path / "results.md").mkdir()
    assert_one_line(
        capsys,
        "reproduce", "tiny", "--out", str(tmp_path), "--seeds", "0", "--epochs", "1",
        match=f"{tmp_path / 'results.md'} is a folder",
    )  # fmt: skip
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["results.md"]


# -- values refused before the folder is stamped ---------------------------------------


FEDAVG_DIGITS_LR = strategy_class("fedavg").card.rates.tuned["digits", "single-sample"]
BAD_GRID_VALUES = [
    (["--model", "vgg"], "unknown --model 'vgg'"),
    (["--dataset", "synthetic", "--model", "resnet9"], "model 'resnet9' needs image inputs"),
    (["--clients", "5000"], "5000 clients but only"),
    (["--clients", "3"], "are held by no client under classes:1 with 3 clients"),
    (["--dataset", "mnist-10k", "--data-dir", "{tmp}/nowhere"], "mnist-10k: missing"),
    (["--dataset", "synthetic", "-o", "n_train=5"], "10 clients but only 5 training samples"),
    # the first tuning cell: 0.3 × FedAvg's own rate on the digits in single-sample mode
    (
        ["--tune", "--validation", "0.999"],
        f"tune/classes-3/fedavg/lr-{0.3 * FEDAVG_DIGITS_LR:.6g}: client 3 received",
    ),
]
if not torch.cuda.is_available():
    BAD_GRID_VALUES.append((["--device", "cuda"], "--device cuda asked for"))


@pytest.mark.parametrize("dry_run", [False, True])
@pytest.mark.parametrize("values, message", BAD_GRID_VALUES)
def test_a_value_only_a_cell_would_refuse_stamps_nothing(
    tmp_path, capsys, values, message, dry_run
):
    out = tmp_path / "grid"
    values = [value.replace("{tmp}", str(tmp_path)) for value in values]
    if "--dataset" not in values:
        values += ["--dataset", "digits"]
    if "--clients" not in values and "n_train=5" not in values:
        values += ["--clients", "10"]
    flags = ["--dry-run"] if dry_run else ["--workers", "1"]
    assert_one_line(
        capsys, "reproduce", "table1", "--out", str(out), "--seeds", "0", "--epochs", "1",
        *values, *flags, match=message,
    )  # fmt: skip
    assert not out.exists()


def test_a_corrected_value_then_runs(tmp_path, capsys):
    out = tmp_path / "grid"
    base = ["reproduce", "ablation-chunk", "--out", str(out), "--dataset", "digits"]
    base += ["--seeds", "0", "--epochs", "1"]
    assert_one_line(capsys, *base, "--model", "vgg", "--workers", "1", match="unknown --model")
    assert not out.exists()
    code, _, err = run_cli(capsys, *base, "--model", "cnn", "--dry-run")
    assert code == 0 and "cells: 8 runs, 0 finished, 8 to run, 8 epochs left" in err, err


@pytest.mark.slow
def test_two_grid_processes_on_one_out(tmp_path):
    out = tmp_path / "grid"
    command = [sys.executable, "-m", "stratify.cli.main", "reproduce", "table2", "--out"]
    flags = ["--dataset", "digits", "--methods", "fedavg", "--seeds", "0,1", "--epochs", "2"]
    flags += ["--workers", "1", "--no-secure"]
    first = subprocess.Popen(
        [*command, str(out), *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while not (out / "grid.json").exists():  # written once the lock is held
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # the second through another spelling of the same folder
        (tmp_path / "link").symlink_to("grid")
        second = subprocess.run(
            [*command, str(tmp_path / "link"), *flags], capture_output=True, text=True, timeout=300
        )
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "is in use by another grid (process" in lines[0], lines
        assert f"process {first.pid})" in lines[0]
        _, err = first.communicate(timeout=600)
    finally:
        first.kill()
    assert first.returncode == 0, err
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [row["status"] for row in rows] == ["finished"] * 10


# -- plot -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def train_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("plot") / "train"
    main_args = ["train", "--no-secure", "--repeat-count", "3", "--epochs", "2", "--out", str(out)]
    try:
        main(main_args)
    except SystemExit as exit_:
        assert exit_.code == 0
    return out


def copy_run(source, target):
    target.mkdir()
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"epoch": 1, "test_accuracy": 0.5}\n\xff\xfe\n', "is not UTF-8 text"),
        (b"[1, 0.5]\n", "metrics.jsonl line 1 is a JSON array, not a record"),
        (b'{\n  "epoch": 1,\n  "test_accuracy": 0.5\n}\n', "line 1 is not valid JSON"),
        (b'"epoch"\n', "line 1 is a JSON string, not a record"),
        (b'{"epoch": 1, "test_accuracy": 1e400}\n', "test_accuracy is inf, not a number"),
        (b'{"epoch": 1, "test_accuracy": 1e39}\n', "test_accuracy is 1e+39, not a number"),
        (b'{"epoch": 1, "test_accuracy": ' + b"9" * 5000 + b"}\n", "line 1 is not valid JSON"),
        (b'{"epoch": 1, "test_accuracy": "0.5"}\n', "test_accuracy is '0.5', not a number"),
        (b'{"epoch": 1, "test_accuracy": NaN}\n', "line 1 is not valid JSON (NaN is not"),
        (b'{"epoch": -1, "test_accuracy": 0.5}\n', "epoch is -1, not a count"),
        (b'{"epoch": 1e300, "test_accuracy": 0.5}\n', "epoch is 1e+300, not a count"),
        (b'{"x": 1}\n', "line 1 has neither epoch nor events"),
        (b"[" * 100000 + b"\n", "line 1 is not valid JSON"),
    ],
)
def test_plot_refuses_records_it_cannot_read_in_one_line(
    train_run, tmp_path, capsys, content, message
):
    run = copy_run(train_run, tmp_path / "run")
    (run / "metrics.jsonl").write_bytes(content)
    image = tmp_path / "p.png"
    assert_one_line(capsys, "plot", str(run), "--out", str(image), match=message)
    assert not image.exists()


@pytest.mark.parametrize("name", ["p.txt", "p.pt", "p.PNG.bak"])
def test_plot_refuses_a_format_it_cannot_write(train_run, tmp_path, capsys, name):
    line = assert_one_line(
        capsys, "plot", str(train_run), "--out", str(tmp_path / name), match="--out "
    )
    assert "plots are written as .png, .pdf, .svg" in line
    assert list(tmp_path.iterdir()) == []


def test_plot_writes_pdf_svg_and_png_without_a_suffix(train_run, tmp_path, capsys):
    for name, magic in (("p.pdf", b"%PDF"), ("p.svg", b"<?xml"), ("p", b"\x89PNG")):
        assert run_cli(capsys, "plot", str(train_run), "--out", str(tmp_path / name))[0] == 0
        assert (tmp_path / name).read_bytes().startswith(magic)


def test_plot_refuses_a_metric_the_run_lacks(train_run, tmp_path, capsys):
    line = assert_one_line(
        capsys, "plot", str(train_run), "--out", str(tmp_path / "p.png"), "--metric", "f1",
        match="metrics.jsonl has no f1; its numeric fields: bytes_sent, epoch",
    )  # fmt: skip
    assert "test_accuracy" in line


@pytest.fixture(scope="module")
def stream_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream")
    lines, test = [], []
    for index in range(240):
        label = index % 3
        event = {"client": f"c{index % 4}", "label": label, "x": [label + 0.1 * (index % 5), 1]}
        lines.append(json.dumps(event))
        if index % 4 == 0:
            test.append(json.dumps({"label": label, "x": event["x"]}))
    (folder / "events.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "test.jsonl").write_text("\n".join(test) + "\n")
    out = folder / "run"
    try:
        main(
            ["stream", "--source", str(folder / "events.jsonl"), "--test",
             str(folder / "test.jsonl"), "--eval-every", "60", "--no-secure", "--device", "cpu",
             "--out", str(out)]
        )  # fmt: skip
    except SystemExit as exit_:
        assert exit_.code == 0
    return out


def test_plot_draws_a_stream_run_per_event(stream_run, tmp_path, capsys, monkeypatch):
    from stratify.reproduce import plots

    drawn = {}
    real = plots.line_plot

    def keep(series, path, **labels):
        drawn.update(series=series, **labels)
        return real(series, path, **labels)

    monkeypatch.setattr(plots, "line_plot", keep)
    image = tmp_path / "stream.png"
    assert run_cli(capsys, "plot", str(stream_run), "--out", str(image))[0] == 0
    assert image.read_bytes()[:4] == b"\x89PNG"
    records = [json.loads(line) for line in (stream_run / "metrics.jsonl").read_text().splitlines()]
    assert [record["events"] for record in records] == [60, 120, 180, 240]
    # accuracies and F1 scores are drawn by default (macro_f1 is a stream metric too)
    fields = [name for name in records[0] if "accuracy" in name or "f1" in name]
    assert drawn["xlabel"] == "events"
    assert sorted(label.split(" · ")[-1] for label in drawn["series"]) == sorted(fields)
    for label, (xs, ys) in drawn["series"].items():
        field = label.split(" · ")[-1]
        assert xs == [60, 120, 180, 240]
        assert ys == [record[field] for record in records]
    # any numeric field on request; a training run beside a stream is refused
    args = ["plot", str(stream_run), "--out", str(image), "--metric", "train_loss"]
    assert run_cli(capsys, *args)[0] == 0
    assert drawn["series"][next(iter(drawn["series"]))][1] == [r["train_loss"] for r in records]


def test_plot_refuses_a_training_run_beside_a_stream_run(stream_run, train_run, tmp_path, capsys):
    assert_one_line(
        capsys, "plot", str(train_run), str(stream_run), "--out", str(tmp_path / "p.png"),
        match="training runs (per epoch) and stream runs (per event) cannot share an x axis",
    )  # fmt: skip


def test_plot_waits_on_no_fifo(train_run, tmp_path, capsys):
    run = copy_run(train_run, tmp_path / "run")
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")
    started = time.monotonic()
    assert_one_line(
        capsys, "plot", str(run), "--out", str(tmp_path / "p.png"),
        match="metrics.jsonl is a FIFO, not a regular file",
    )  # fmt: skip
    assert time.monotonic() - started < 10


def limit_file_size(size):
    def limit():
        # Python ignores SIGXFSZ, so a write past the limit fails with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return limit


def environment_without_data_dir():
    # CI exports STRATIFY_DATA_DIR; the CLI would record it as the grid's data_dir, and the
    # in-process grid it must match was made without one
    return {name: value for name, value in os.environ.items() if name != "STRATIFY_DATA_DIR"}


@pytest.mark.slow
def test_a_full_disk_keeps_the_previous_plot_whole(train_run, tmp_path):
    image = tmp_path / "p.png"
    image.write_bytes(b"the previous plot")
    process = subprocess.run(
        [sys.executable, "-m", "stratify.cli.main", "plot", str(train_run), "--out", str(image)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit_file_size(1000),
    )
    assert process.returncode == 2, process.stderr
    assert process.stderr.strip().splitlines() == [
        f"error: cannot write {image}: File too large (its previous version is kept)"
    ]
    assert image.read_bytes() == b"the previous plot"
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["p.png"]  # no temporary


@pytest.mark.slow
def test_a_full_disk_keeps_the_previous_grid_outputs_whole(tmp_path):
    settings = Settings(dataset="digits", seeds=(0,), epochs=1, methods=("fedavg",), secure=False)
    reproduce("table2", tmp_path, settings, backend=LocalBackend(1))
    before = {name: (tmp_path / name).read_bytes() for name in ("results.csv", "results.md")}
    process = subprocess.run(
        [sys.executable, "-m", "stratify.cli.main", "reproduce", "table2", "--out",
         str(tmp_path), "--dataset", "digits", "--seeds", "0", "--epochs", "1", "--methods",
         "fedavg", "--no-secure", "--workers", "1"],
        capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size(100),
        env=environment_without_data_dir(),
    )  # fmt: skip
    assert process.returncode == 2, process.stderr
    lines = process.stderr.strip().splitlines()
    assert lines[-1] == (
        f"error: cannot write {tmp_path / 'results.csv'}: File too large "
        "(its previous version is kept)"
    ), lines
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    assert not list(tmp_path.glob(".tmp-*"))


def test_an_empty_out_is_refused_not_read_as_the_current_folder(
    tiny, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    for flags in ([], ["--dry-run"]):
        assert_one_line(
            capsys, "reproduce", "tiny", "--out", "", "--seeds", "0", *flags,
            match="--out needs a folder name, got an empty one",
        )  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_plot_writes_through_a_symlink_and_a_device(train_run, tmp_path, capsys):
    (tmp_path / "figures").mkdir()
    (tmp_path / "latest.png").symlink_to("figures/accuracy.png")
    assert run_cli(capsys, "plot", str(train_run), "--out", str(tmp_path / "latest.png"))[0] == 0
    assert (tmp_path / "latest.png").is_symlink()
    assert (tmp_path / "figures" / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
    assert run_cli(capsys, "plot", str(train_run), "--out", "/dev/null")[0] == 0
    assert Path("/dev/null").is_char_device()


def test_plot_makes_no_folder_for_its_out(train_run, tmp_path, capsys):
    target = tmp_path / "nowhere" / "p.png"
    assert_one_line(
        capsys, "plot", str(train_run), "--out", str(target),
        match=f"cannot write --out {target}: no folder {tmp_path / 'nowhere'}",
    )  # fmt: skip
    assert list(tmp_path.iterdir()) == []
