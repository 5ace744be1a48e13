"""Property-based test of the command line (hypothesis): random combinations of options and
values, valid and not, for ``train``, ``data stats``, ``bench privacy``, ``bench``,
``stream`` (outputs naming its inputs, FIFOs, unbounded work), ``reproduce`` (damaged
grid folders and calibration files included) and ``plot`` (damaged records, stream run
folders, unsupported formats).

The property: every command line ends with exit code 0 or 2, never a traceback; exit code
2 comes with exactly one ``error:`` line, the last one on stderr; a ``train`` that exits
with 0 leaves a complete, consistent run folder. Budgets stay tiny (``digits``, one epoch,
a few schedule entries), and the examples are derandomised, so every run of the suite
tries the same command lines in about the same time.

Every command of the tree has hostile-input cases here: those above, or fixed command
lines in :data:`HOSTILE` keyed by the command's path; a command added without any fails
``test_every_command_has_hostile_input_cases``.
"""

import contextlib
import csv
import io
import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stratify.algorithms import ALGORITHMS
from stratify.cli.main import main
from stratify.reproduce.grids import GRIDS, Grid, method_column, partition_row


def fuzz(examples):
    """Settings of these tests: ``examples`` derandomised examples, no time limit each."""
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


#: values for each option: typical small ones first (what shrinking goes to), then wrong
#: types, out-of-range, non-finite and huge values
TRAIN_OPTIONS = {
    "--algorithm": [*ALGORITHMS, "x"],
    "--mode": ["single-sample", "batch", "online"],
    "--partition": ["classes:2", "iid", "dirichlet:0.5", "shards:2", "classes:0", "dirichlet:nan"],
    "--clients": ["3", "10", "1", "0", "-1", "5000", "abc"],
    "--epochs": ["1", "0", "-2", "1.5"],
    "--lr": ["0.05", "0.5", "0", "-1", "nan", "inf", "1e30", "abc"],
    "--lr-schedule": ["constant", "inverse-epoch", "cosine"],
    "--model": ["cnn", "mlp", "resnet20", "vgg"],
    "--norm": ["gn", "bn", "sumbn", "none", "layer"],
    "--mlp-hidden": ["16", "8,4", "0", "abc", "100000000", ""],
    "--seed": ["0", "7", "-1", str(2**63), str(2**64), "1e3"],
    "--device": ["cpu", "auto", "cuda", "tpu"],
    "--protocol": ["packed", "naive", "both"],
    "--chunk": ["1", "5", "0", "-3"],
    "--batch-labels": ["8", "2", "1", "0"],
    "--selection": ["uniform", "weighted", "best"],
    "--repeats": ["uniform", "proportional", "many"],
    "--repeat-count": ["3", "0", "1000000000", "x"],
    "--cap": ["3", "0", "-1"],
    "--batch-path": ["fused", "explicit", "slow"],
    "--momentum": ["0", "0.5", "1", "-1", "nan"],
    "--exhausted": ["refill", "skip", "wait"],
    "--local-epochs": ["1", "0", "x"],
    "--local-batch-size": ["16", "1", "0"],
    "--local-momentum": ["0", "0.9", "1", "nan"],
    "--local-weight-decay": ["0", "0.0001", "-1", "inf"],
    "--client-fraction": ["0.5", "1", "0", "1.5", "nan"],
    "--weighting": ["samples", "equal", "median"],
    "--bn-buffers": ["average", "local", "none"],
    "--mu": ["0.01", "0", "-1", "nan"],
    "--server-lr": ["1", "0.5", "0", "inf"],
    "--server-momentum": ["0.9", "0", "1", "-0.1"],
    "-o": ["n_train=abc", "seed=1", "nokey", "correlation=0.5"],
}
FLAGS = ["--no-secure", "--secure", "--resume", "--overwrite"]

PARTITION_STATS_OPTIONS = {
    "--dataset": ["digits", "synthetic", "nope", "mnist-10k"],
    "--partition": ["iid", "classes:2", "dirichlet:0.5", "shards:3", "domains:1", "classes:x"],
    "--clients": ["3", "10", "1", "0", "-4", "5000", "abc"],
    "--seed": ["0", "9", "-1", str(2**63), str(2**64)],
    "--min-size": ["0", "5", "-3", "100000"],
    "-o": ["n_train=200", "n_train=0", "num_classes=0", "n_test=x", "x"],
}

BENCH_PRIVACY_OPTIONS = {
    "--classes": ["2", "3,4", "0", "-1", "x", "100000000", ""],
    "--clients": ["2", "3", "0", "abc", ""],
    "--protocol": ["packed", "naive", "both", "fast"],
    "--repeat": ["1", "2", "0", "-1"],
    "--seed": ["0", "3", "-1", str(2**64)],
    "--json": ["{tmp}/out.json", "/nonexistent/x.json", "{tmp}"],
}

BENCH_TRANSFERS_OPTIONS = {
    "--partition": ["dirichlet:0.5", "iid", "classes:2", "classes:99", "dirichlet:-1"],
    "--clients": ["3", "10", "0", "5000"],
    "--chunks": ["1,5", "5", "0", "x", ""],
    "--seeds": ["1", "0,1", "0..2", "-1", "x"],
    "--json": ["{tmp}/out.json", "/nonexistent/x.json"],
}

BENCH_STEPS_OPTIONS = {
    "--partition": ["dirichlet:0.5", "iid", "stripes"],
    "--clients": ["3", "10", "0"],
    "--model": ["cnn", "mlp", "vgg"],
    "--steps": ["20", "50", "0", "-5", "100000000000"],
    "--device": ["cpu", "cuda"],
    "--json": ["{tmp}/out.json", "/nonexistent/x.json"],
}


def options(table, max_size):
    """Some of ``table``'s options, each with one of its values: a list of arguments."""
    names = st.lists(st.sampled_from(sorted(table)), unique=True, max_size=max_size)
    return names.flatmap(
        lambda chosen: st.tuples(*(st.sampled_from(table[name]) for name in chosen)).map(
            lambda values: [item for pair in zip(chosen, values) for item in pair]
        )
    )


#: calibration.json of the dry runs of ``reproduce``, by their command line less ``--out``
#: and the flags: a later dry run of the same grid and options into a folder without one
#: finds it there, as after a first dry run, instead of training every kind of a paper grid
#: again (three epochs each, most of this module's time). The first of each calibrates; a
#: kind the file lacks is calibrated (tests/test_calibration_file.py checks the reuse).
#: Kept out of the test's body: hypothesis derives its derandomised examples from it
CALIBRATED: dict[tuple[str, ...], bytes] = {}


def dry_run_calibration(argv: list[str]) -> tuple[tuple[str, ...], Path] | None:
    """A ``reproduce --dry-run`` command line's key in :data:`CALIBRATED` and the path of
    its calibration, or ``None`` for other command lines and an empty ``--out``."""
    if argv[:1] != ["reproduce"] or "--dry-run" not in argv or "--out" not in argv:
        return None
    at = argv.index("--out")
    if not argv[at + 1]:
        return None
    key = tuple(arg for arg in argv[:at] + argv[at + 2 :] if arg not in REPRODUCE_FLAGS)
    return key, Path(argv[at + 1]) / "calibration.json"


def run(argv, tmp):
    """``stratify ARGV`` in this process, in folder ``tmp`` (what a relative or empty path
    would write lands there): ``(exit code, stderr lines)``. A ``reproduce`` dry run into a
    folder without a calibration starts from the last one a dry run of its command line
    left (:data:`CALIBRATED`)."""
    argv = [argument.replace("{tmp}", tmp) for argument in argv]
    calibration = dry_run_calibration(argv)
    fresh = calibration is not None and not os.path.lexists(calibration[1])
    fresh = fresh and not calibration[1].parent.is_file()
    if fresh and calibration[0] in CALIBRATED:
        calibration[1].parent.mkdir(exist_ok=True)
        calibration[1].write_bytes(CALIBRATED[calibration[0]])
    code = 0
    stdout, stderr = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(tmp)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                main(argv)
            except SystemExit as exit_:
                code = exit_.code
    finally:
        os.chdir(here)
    if calibration is not None and code == 0 and calibration[1].is_file():
        CALIBRATED[calibration[0]] = calibration[1].read_bytes()
    return code, stderr.getvalue().splitlines()


def assert_exits_cleanly(argv, code, err):
    text = "\n".join(err)
    assert "Traceback" not in text, (argv, text)
    assert code in (0, 2), (argv, code, text)
    errors = [line for line in err if line.startswith("error:")]
    if code == 2:
        assert len(errors) == 1 and err[-1] == errors[0], (argv, err)
    else:
        assert not errors, (argv, err)


def assert_complete_run(out, argv):
    names = sorted(path.name for path in out.iterdir())
    expected = ["checkpoint.pt", "config.json", "metrics.jsonl", "summary.json"]
    if "--secure" in argv:  # the clients' registry secrets, for --resume
        expected = sorted([*expected, "client_secrets.json"])
    assert names == expected, argv
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert [row["epoch"] for row in rows] == list(range(1, config["epochs"] + 1)), argv
    assert summary["epochs_completed"] == config["epochs"], argv


@fuzz(60)
@given(
    chosen=options(TRAIN_OPTIONS, max_size=4),
    flags=st.lists(st.sampled_from(FLAGS), max_size=2, unique=True),
    out=st.sampled_from(["fresh", "fresh", "fresh", "existing", "empty"]),
)
def test_train_exits_with_0_or_2(chosen, flags, out):
    argv = ["train", *chosen, *flags]
    # tiny budgets unless the example chose the option: one epoch, a few schedule entries
    # for stratify, one local epoch for the baselines
    if "--epochs" not in chosen:
        argv += ["--epochs", "1"]
    algorithm = chosen[chosen.index("--algorithm") + 1] if "--algorithm" in chosen else "stratify"
    if algorithm == "stratify" and "--repeat-count" not in chosen:
        argv += ["--repeat-count", "3"]
    if algorithm not in ("stratify", "x") and "--local-epochs" not in chosen:
        argv += ["--local-epochs", "1"]
    if "--secure" not in flags:
        argv.append("--no-secure")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "run"
        if out == "existing":
            assert run(["train", "--no-secure", "--repeat-count", "2", "--epochs", "1",
                        "--out", str(folder)], tmp)[0] == 0  # fmt: skip
        argv += ["--out", "" if out == "empty" else str(folder)]
        code, err = run(argv, tmp)
        assert_exits_cleanly(argv, code, err)
        if code == 0:
            assert_complete_run(folder, argv)


@fuzz(30)
@given(chosen=options(PARTITION_STATS_OPTIONS, max_size=4))
def test_partition_stats_exits_with_0_or_2(chosen):
    argv = ["data", "stats", *chosen]
    with tempfile.TemporaryDirectory() as tmp:
        code, err = run(argv, tmp)
    assert_exits_cleanly(argv, code, err)


@fuzz(20)
@given(chosen=options(BENCH_PRIVACY_OPTIONS, max_size=4))
def test_bench_privacy_exits_with_0_or_2(chosen):
    # tiny cells unless the example chose them
    argv = ["bench", "privacy", "--classes", "2", "--clients", "2", *chosen]
    with tempfile.TemporaryDirectory() as tmp:
        code, err = run(argv, tmp)
        if code == 0 and "--json" in chosen:
            json.loads(Path(argv[argv.index("--json") + 1].replace("{tmp}", tmp)).read_text())
    assert_exits_cleanly(argv, code, err)


@fuzz(20)
@given(
    command=st.sampled_from(["transfers", "steps"]),
    chosen_transfers=options(BENCH_TRANSFERS_OPTIONS, max_size=3),
    chosen_steps=options(BENCH_STEPS_OPTIONS, max_size=3),
)
def test_bench_exits_with_0_or_2(command, chosen_transfers, chosen_steps):
    if command == "transfers":
        argv = ["bench", "transfers", "--dataset", "digits", "--seeds", "0", *chosen_transfers]
    else:
        argv = ["bench", "steps", "--dataset", "digits", "--steps", "20", *chosen_steps]
    with tempfile.TemporaryDirectory() as tmp:
        code, err = run(argv, tmp)
    assert_exits_cleanly(argv, code, err)


STREAM_OPTIONS = {
    "--algorithm": ["stratify", "fedavg-periodic", "fedprox"],
    "--model": ["mlp", "cnn", "resnet20", "vgg"],
    "--norm": ["bn", "gn", "none", "sumbn"],
    "--mlp-hidden": ["4", "8,4", "0", "abc", "100000000,1000", ""],
    "--input-shape": ["3", "1,1,3", "1,3,1", "0", "4", "x"],
    "--num-classes": ["2", "5", "0", "1000000000", "-1"],
    "--scale": ["running", "none", "minmax"],
    "--missing": ["error", "zero", "mean"],
    "--capacity": ["4", "1", "0", "1000000000", "x"],
    "--max-uses": ["1", "2", "0"],
    "--max-clients": ["1", "3", "0", "1000000000"],
    "--max-pending": ["1", "0", "1000000000"],
    "--steps-per-event": ["1", "3", "0", "-1", "1000000000"],
    "--chunk": ["1", "5", "0"],
    "--selection": ["uniform", "weighted", "best"],
    "--lr": ["0.05", "5", "0", "nan", "inf", "-1"],
    "--momentum": ["0", "0.9", "1", "nan"],
    "--retrain-every": ["3", "0", "1000000000"],
    "--local-epochs": ["1", "0", "x", "1000000000"],
    "--local-batch-size": ["2", "0"],
    "--local-momentum": ["0.5", "1", "-1"],
    "--on-diverge": ["stop", "skip", "retry"],
    "--window": ["5", "0", "1000000000"],
    "--eval-every": ["1", "4", "0", "1000000000"],
    "--checkpoint-every": ["3", "0", "1000000000"],
    "--checkpoint-seconds": ["0.001", "60", "0", "nan", "-5", "inf"],
    "--max-line-bytes": ["64", "1", "0", "1000000000000"],
    "--seed": ["0", "-1", str(2**64)],
    "--device": ["cpu", "tpu"],
    "--protocol": ["packed", "naive", "fast"],
    # outputs: new, a folder, nowhere, stdout, and every way of naming an input or a file
    # of the run (the source, the held-out set, a link to the source, the run's metrics),
    # a FIFO nobody reads and a file holding something else
    "--predictions": [
        "{tmp}/p.jsonl",
        "{tmp}",
        "/nonexistent/p.jsonl",
        "-",
        "{tmp}/events.jsonl",
        "{tmp}/test.jsonl",
        "{tmp}/link.jsonl",
        "{tmp}/run/metrics.jsonl",
        "{tmp}/fifo",
        "{tmp}/notes.txt",
    ],
    "--files-root": ["{tmp}", "{tmp}/missing", "{tmp}/events.jsonl"],
    "--test": ["{tmp}/test.jsonl", "{tmp}/missing.jsonl", "{tmp}", "{tmp}/events.jsonl"],
    "--source-position": ["replay", "continue", "detect", "sideways"],
    "--drift": ["off", "adwin", "page-hinkley", ""],
}
STREAM_FLAGS = ["--secure", "--resume", "--overwrite"]


@fuzz(60)
@given(
    chosen=options(STREAM_OPTIONS, max_size=4),
    flags=st.lists(st.sampled_from(STREAM_FLAGS), max_size=2, unique=True),
    existing=st.booleans(),
)
def test_stream_exits_with_0_or_2(chosen, flags, existing):
    with tempfile.TemporaryDirectory() as tmp:
        lines = [
            json.dumps({"client": k % 3, "label": k % 2, "x": [k % 2, 1.0 - k % 2, 0.5]})
            for k in range(12)
        ]
        lines.insert(5, json.dumps({"client": 1, "x": [0.0, 1.0, 0.0]}))  # unlabeled
        (Path(tmp) / "events.jsonl").write_text("\n".join(lines) + "\n")
        (Path(tmp) / "test.jsonl").write_text(lines[0] + "\n")
        (Path(tmp) / "link.jsonl").symlink_to(Path(tmp) / "events.jsonl")
        (Path(tmp) / "notes.txt").write_text("notes\n")
        os.mkfifo(Path(tmp) / "fifo")
        folder = Path(tmp) / "run"
        base = ["stream", "--source", f"{tmp}/events.jsonl", "--out", str(folder)]
        if existing:
            assert run([*base, "--no-secure", "--mlp-hidden", "4"], tmp)[0] == 0
        inputs = {name: (Path(tmp) / name).read_bytes() for name in ("events.jsonl", "test.jsonl")}
        argv = [*base, *chosen, *flags]
        if "--secure" not in flags:
            argv.append("--no-secure")
        if "--mlp-hidden" not in chosen and "--model" not in chosen:
            argv += ["--mlp-hidden", "4"]
        code, err = run(argv, tmp)
        if code == 1 and err and "training diverged" in err[-1]:
            return  # a diverging stream: exit code 1 by design, with its one line
        assert_exits_cleanly(argv, code, err)
        # no output ever replaced an input
        assert {name: (Path(tmp) / name).read_bytes() for name in inputs} == inputs, argv
        if code == 0:
            summary = json.loads((folder / "summary.json").read_text())
            assert summary["lines"] == 13, argv


# ------------------------------------------------------------------------------ reproduce

#: a grid of two cells on digits (one epoch each): what a real run of an example costs
TINY = Grid(
    "fuzz-tiny",
    "FedAvg and Stratify on digits",
    {"dataset": "digits", "mode": "batch", "epochs": 1},
    (partition_row("classes:2", "#C=2"),),
    (method_column("fedavg", local_epochs=1), method_column("stratify", repeat_count=10)),
)

REPRODUCE_OPTIONS = {
    "--dataset": ["digits", "digits", "synthetic", "nope", "mnist-10k"],
    "--epochs": ["1", "1", "0", "-1", "x", "1000000000000"],
    "--seeds": ["0", "0,1", "0,0", "-1", "", "x"],
    "--clients": ["10", "4", "3", "0", "5000", "abc"],
    "--methods": ["fedavg", "stratify,fedavg", "nosuch", ""],
    "--model": ["cnn", "mlp", "mlp", "vgg", "resnet9"],
    "--device": ["cpu", "cpu", "cuda", "tpu"],
    "--tune-factors": ["0.5,2", "1", "0", "x", "nan"],
    "--tune-epochs": ["1", "0"],
    "--validation": ["0.2", "0.1", "0", "1", "nan"],
    "--backend": ["local", "local", "ray", "spark"],
    "--workers": ["1", "1", "0", "x"],
    "--address": ["auto", "127.0.0.1:1", "nohost"],
    "-o": ["n_train=200", "nope=1", "x"],
    "--data-dir": ["{tmp}/nowhere"],
}
REPRODUCE_FLAGS = ["--tune", "--dry-run", "--keep-corrupt"]


#: what the dry run may find where it keeps its calibration: damaged, or no file at all
CALIBRATIONS = {
    "calibration-not-utf8": lambda path: path.write_bytes(b"\xff\xfe"),
    "calibration-kinds-list": lambda path: path.write_text('{"kinds": []}'),
    "calibration-nan": lambda path: path.write_text(
        '{"kinds": {"fedavg": {"group": 1, "epochs": [NaN, -1, 1e308]}}}'
    ),
    "calibration-folder": lambda path: path.mkdir(),
    "calibration-fifo": os.mkfifo,
}


def damaged_grid(out):
    """A finished tiny grid folder with one cell's metrics cut short."""
    cells = out / "cells" / "classes-2"
    for column in ("fedavg", "stratify"):
        folder = cells / column / "seed-0"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        (folder / "metrics.jsonl").write_text('{"epoch": 1, "test_acc')


@fuzz(30)
@given(
    grid=st.sampled_from(["fuzz-tiny", "fuzz-tiny", "fuzz-tiny", "table1", "ablation-chunk"]),
    chosen=options(REPRODUCE_OPTIONS, max_size=3),
    flags=st.lists(st.sampled_from(REPRODUCE_FLAGS), max_size=2, unique=True),
    out=st.sampled_from(["fresh", "fresh", "damaged", "empty", "file", *CALIBRATIONS]),
)
def test_reproduce_exits_with_0_or_2(grid, chosen, flags, out):
    argv = ["reproduce", grid, *chosen, *flags]
    if "--epochs" not in chosen:
        argv += ["--epochs", "1"]
    if "--seeds" not in chosen:
        argv += ["--seeds", "0"]
    if "--dataset" not in chosen:
        argv += ["--dataset", "digits"]  # the papers' grids read MNIST files otherwise
    if "--workers" not in chosen and "--backend" not in chosen:
        argv += ["--workers", "1"]
    # only the tiny grid runs for real; Ray would start a local cluster
    real = grid == "fuzz-tiny" and "--dry-run" not in flags and "--backend" not in chosen
    if not real and "--dry-run" not in flags:
        argv.append("--dry-run")
    GRIDS[TINY.name] = TINY
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "grid"
            if out == "damaged":
                damaged_grid(folder)
            elif out == "file":
                folder.write_text("a file")
            elif out in CALIBRATIONS:
                folder.mkdir()
                CALIBRATIONS[out](folder / "calibration.json")
            argv += ["--out", "" if out == "empty" else str(folder)]
            code, err = run(argv, tmp)
            assert_exits_cleanly(argv, code, err)
            if code == 0 and real:
                rows = list(csv.DictReader(open(folder / "results.csv")))
                assert rows and all(row["status"] == "finished" for row in rows), argv
    finally:
        del GRIDS[TINY.name]


# ----------------------------------------------------------------------------------- plot


@pytest.fixture(scope="module")
def plot_folders(tmp_path_factory):
    """Run folders of every kind ``plot`` may be given: a training run, a stream run, and
    ones whose records are damaged, empty, or missing."""
    root = tmp_path_factory.mktemp("plot-fuzz")
    assert run(["train", "--no-secure", "--repeat-count", "3", "--epochs", "2", "--out",
                str(root / "train")], str(root))[0] == 0  # fmt: skip
    events = root / "events.jsonl"
    events.write_text(
        "".join(
            json.dumps({"client": i % 3, "label": i % 2, "x": [i % 2, 0.5]}) + "\n"
            for i in range(120)
        )
    )
    assert run(["stream", "--source", str(events), "--eval-every", "40", "--no-secure",
                "--device", "cpu", "--out", str(root / "stream")], str(root))[0] == 0  # fmt: skip
    records = (root / "train" / "metrics.jsonl").read_bytes()
    for name, content in {
        "not-utf8": records[:20] + b"\xff\xfe" + records[20:],
        "arrays": b"[1, 2]\n[3, 4]\n",
        "huge": b'{"epoch": 1, "test_accuracy": 1e400}\n',
        "digits": b'{"epoch": 1, "test_accuracy": ' + b"7" * 5000 + b"}\n",
        "cut": records[:-10],
        "empty": b"",
    }.items():
        (root / name).mkdir()
        (root / name / "metrics.jsonl").write_bytes(content)
    (root / "nothing").mkdir()
    return root


PLOT_RUNS = ["train", "train", "train", "stream", "stream", "stream", "not-utf8", "arrays",
             "huge", "digits", "cut", "empty", "nothing", "missing"]  # fmt: skip
PLOT_OUTS = ["p.png", "p.png", "p.pdf", "p.svg", "p", "p.txt", "p.pt", "", "nowhere/p.png"]
PLOT_METRICS = [None] * 5 + ["test_accuracy", "train_loss", "transfers", "f1", "events", ""]


@fuzz(40)
@given(
    runs=st.lists(st.sampled_from(PLOT_RUNS), min_size=1, max_size=2),
    out=st.sampled_from(PLOT_OUTS),
    metric=st.sampled_from(PLOT_METRICS),
)
def test_plot_exits_with_0_or_2(plot_folders, runs, out, metric):
    with tempfile.TemporaryDirectory() as tmp:
        target = out if out.startswith("/") else str(Path(tmp) / out)
        argv = ["plot", *(str(plot_folders / run) for run in runs), "--out", target]
        if metric is not None:
            argv += ["--metric", metric]
        code, err = run(argv, tmp)
        assert_exits_cleanly(argv, code, err)
        if code == 0:
            assert Path(target).stat().st_size > 0, argv
        assert not (Path(tmp) / "nowhere").exists(), argv  # no folder made for --out


# ------------------------------------------------------------------ every command covered

#: commands whose hostile inputs the property-based tests above draw (their option tables)
PROPERTY_FUZZED = {
    "train",
    "data stats",
    "bench privacy",
    "bench transfers",
    "bench steps",
    "stream",
    "reproduce",
    "plot",
}

#: the other commands' hostile command lines, keyed by the command's path ("" the root
#: group): per option a non-number, a negative, zero, a huge value and NaN where it takes
#: a number, a FIFO, a folder, a file or a missing path where it takes a path; each is
#: refused before any work (``{tmp}`` holds ``fifo``, a FIFO, and ``file``, a file)
HOSTILE = {
    "": [["nosuch"], ["--nosuch"]],
    "bench": [["bench", "nosuch"]],
    "data": [["data", "nosuch"]],
    "bench batch": [
        *(["bench", "batch", "--clients", v] for v in ("abc", "-1", "0", "nan")),
        ["bench", "batch", "--dataset", "digits", "--clients", "1000000000"],
        *(["bench", "batch", "--lr", v] for v in ("abc", "-1", "0", "nan", "inf", "1e400")),
        *(["bench", "batch", "--repeat", v] for v in ("x", "-1", "0", "1000000000")),
        *(["bench", "batch", "--batch-labels", v] for v in ("x", "-3", "0")),
        *(["bench", "batch", "--threads", v] for v in ("x", "-1", "0", "100000")),
        ["bench", "batch", "--model", "vgg"],
        ["bench", "batch", "--json", "{tmp}"],
        ["bench", "batch", "--dataset", "mnist-10k", "--data-dir", "{tmp}/fifo"],
        ["bench", "batch", "--dataset", "nope"],
    ],
    "bench privacy-utility": [
        *(
            ["bench", "privacy-utility", "--out", "{tmp}/o", "--epsilons", v]
            for v in ("x", "-1", "0", "nan", "inf", ",")
        ),
        *(
            ["bench", "privacy-utility", "--out", "{tmp}/o", "--seeds", v]
            for v in ("x", "-1", "0,0", "0..1000000000")
        ),
        *(
            ["bench", "privacy-utility", "--out", "{tmp}/o", "--secagg-repeat", v]
            for v in ("x", "-1", "11")
        ),
        ["bench", "privacy-utility", "--out", "{tmp}/file"],
        ["bench", "privacy-utility", "--out", "{tmp}/fifo"],
        ["bench", "privacy-utility", "--out", "{tmp}/o", "--data-dir", "{tmp}/fifo"],
        ["bench", "privacy-utility", "--out", "{tmp}/o", "--data-dir", "{tmp}/file"],
        ["bench", "privacy-utility", "--out", "{tmp}/o", "--data-dir", "{tmp}"],
        ["bench", "privacy-utility"],
    ],
    "bench local": [
        *(["bench", "local", "--rounds", v] for v in ("x", "-1", "0", "nan")),
        ["bench", "local", "--dataset", "digits", "--rounds", "1000000000"],
        *(["bench", "local", "--clients", v] for v in ("x", "-2", "0")),
        ["bench", "local", "--dataset", "digits", "--clients", "1000000000"],
        ["bench", "local", "--method", "nosuch"],
        ["bench", "local", "--json", "{tmp}"],
        ["bench", "local", "--dataset", "mnist-10k", "--data-dir", "{tmp}/fifo"],
        ["bench", "local", "--dataset", "mnist-10k", "--data-dir", "{tmp}/file"],
    ],
    "bench plan": [
        *(["bench", "plan", "--chunk", v] for v in ("x", "-1", "0", "nan")),
        *(["bench", "plan", "--min-size", v] for v in ("x", "-1", "0")),
        *(["bench", "plan", "--clients", v] for v in ("x", "-1", "0", "nan")),
        # a chunk or a smallest client beyond the data's 1,437 training samples, and more
        # than a million clients, refused before any cell runs
        *(
            ["bench", "plan", "--dataset", "digits", flag, "1000000000"]
            for flag in ("--chunk", "--min-size", "--clients")
        ),
        ["bench", "plan", "--partitions", "nope"],
        ["bench", "plan", "--selection", "best"],
        ["bench", "plan", "--json", "{tmp}"],
        ["bench", "plan", "--dataset", "mnist-10k", "--data-dir", "{tmp}/fifo"],
    ],
    "bench rounds": [
        *(["bench", "rounds", "--rounds", v] for v in ("x", "-1", "0", "nan", "1000000000")),
        *(["bench", "rounds", "--local-epochs", v] for v in ("x", "-1", "0")),
        ["bench", "rounds", "--dataset", "digits", "--local-epochs", "1000000000"],
        *(["bench", "rounds", "--threads", v] for v in ("-1", "0", "100000")),
        ["bench", "rounds", "--dataset", "digits", "--clients", "1000000000"],
        ["bench", "rounds", "--methods", "nosuch"],
        ["bench", "rounds", "--json", "{tmp}"],
        ["bench", "rounds", "--dataset", "mnist-10k", "--data-dir", "{tmp}/fifo"],
    ],
    "bench stream": [
        *(
            ["bench", "stream", option, value]
            for option in ("--events", "--features", "--classes", "--clients", "--repeat")
            for value in ("x", "-1", "0", "nan", "1000000000000")
        ),
        *(["bench", "stream", "--seed", v] for v in ("x", "-1", "nan", str(2**64))),
        ["bench", "stream", "--json", "{tmp}"],
        *(["bench", "stream", "--river-events", v] for v in ("x", "-1", "0", "nan", "10**12")),
        ["bench", "stream", "--river-suite", "--river-events", "1000000000000"],
        ["bench", "stream", "--river-suite", "--river-csv", "{tmp}"],
        ["bench", "stream", "--river-csv", "{tmp}/results.csv"],
    ],
    "data download": [
        ["data", "download"],
        ["data", "download", "nosuch"],
        ["data", "download", "digits", "--dir", "{tmp}/fifo"],
        ["data", "download", "mnist", "--dir", "{tmp}/file"],
    ],
    "data list": [["data", "list", "--data-dir", v] for v in ("{tmp}/fifo", "{tmp}/file")],
    "methods": [["methods", "nosuch"], ["methods", "--markdown", "x"], ["methods", "-1"]],
    "tables": [
        ["tables", "nosuch"],
        *(["tables", "--root", v] for v in ("{tmp}/missing", "{tmp}/fifo", "{tmp}")),
    ],
}


def command_paths():
    """The path of every command of ``stratify``'s tree, groups included (the root: "")."""
    import click

    from stratify.cli.main import cli

    def walk(command, path):
        yield " ".join(path)
        if isinstance(command, click.Group):
            context = click.Context(command)
            for name in command.list_commands(context):
                yield from walk(command.get_command(context, name), (*path, name))

    return list(walk(cli, ()))


def test_every_command_has_hostile_input_cases():
    paths = command_paths()
    assert {"bench stream", "bench privacy", "bench steps", "data download"} <= set(paths)
    uncovered = [path for path in paths if path not in PROPERTY_FUZZED and not HOSTILE.get(path)]
    assert not uncovered, f"commands without hostile-input cases in this file: {uncovered}"
    assert not (set(HOSTILE) | PROPERTY_FUZZED) - set(paths), "cases of no command"


@pytest.mark.parametrize(
    "argv", [argv for path in sorted(HOSTILE) for argv in HOSTILE[path]], ids=" ".join
)
def test_hostile_input_is_one_line_and_exit_2(argv):
    with tempfile.TemporaryDirectory() as tmp:
        os.mkfifo(Path(tmp) / "fifo")
        (Path(tmp) / "file").write_text("not a folder\n")
        code, err = run(argv, tmp)
    text = "\n".join(err)
    assert "Traceback" not in text, (argv, text)
    assert code == 2, (argv, code, text)
    assert len(err) == 1 and err[0].startswith("error:"), (argv, err)
