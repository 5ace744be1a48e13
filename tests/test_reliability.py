"""The reliability promise, defect by defect (issue 11): one line and exit code 2 for every
bad input, a bug reported as a bug, and run folders that concurrent, killed, failing or
replacing runs cannot corrupt. Several tests start real processes."""

import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
import torch

from stratify.algorithms import ALGORITHMS, strategy_class
from stratify.cli.main import COMMANDS, main
from stratify.config import TrainConfig
from stratify.errors import ConfigError, OutputError, TrainingError
from stratify.run import Run
from stratify.runfiles import read_records

BASE = ["--no-secure", "--repeat-count", "5"]  # 50 steps per epoch on digits
QUICK = [*BASE, "--epochs", "1"]


def run_cli(capsys, *args):
    """``stratify ARGS`` in this process: ``(exit code, stdout, stderr lines)``."""
    code = 0
    try:
        main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def assert_one_line_error(capsys, *args, match=""):
    code, _, err = run_cli(capsys, *args)
    assert code == 2, err
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and err[-1] == errors[0], err
    assert not any("Traceback" in line for line in err), err
    assert match in errors[0], errors[0]
    return errors[0]


def config(tmp_path, name="run", **changes):
    values = dict(
        dataset="digits",
        partition="classes:2",
        epochs=2,
        secure=False,
        options={"repeat_count": 10},
        out=str(tmp_path / name),
    )
    values.update(changes)
    return TrainConfig(**values)


def stratify_process(*args, **popen):
    """A real ``stratify`` process."""
    return subprocess.Popen(
        [sys.executable, "-m", "stratify.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def measured_startup() -> float:
    """Seconds this machine takes now to start a ``stratify`` process (Python, torch and
    the command line imported): the waits below are multiples of it, since under load
    (two test suites and a grid on two cores) a fixed figure ran out."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch, stratify.cli.main"], check=True)
    return time.monotonic() - started


def startup_bound(floor: float, startups: float = 10.0) -> float:
    """``startups`` measured start-ups, and at least ``floor`` seconds."""
    return max(floor, startups * measured_startup())


def kill_when_written(*watched):
    """SIGKILL each ``(path, process)`` pair's process once its path exists, all polled in
    one loop: waiting for one after the other let the second finish its whole run while
    the first was still starting (beside a grid, on two cores)."""
    deadline = time.monotonic() + startup_bound(120.0)
    pending = list(watched)
    while pending:
        for path, process in list(pending):
            if path.exists():
                process.send_signal(signal.SIGKILL)
                pending.remove((path, process))
            else:
                assert process.poll() is None, process.communicate()
        assert not pending or time.monotonic() < deadline, f"{pending[0][0]} never appeared"
        time.sleep(0.02)


def read_run(out):
    """A run folder's files, checked against each other."""
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    configuration = json.loads((out / "config.json").read_text())
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    epochs = [row["epoch"] for row in metrics]
    assert epochs == list(range(1, len(metrics) + 1))
    assert checkpoint["epoch"] == len(metrics) == summary["epochs_completed"]
    assert checkpoint["records"] == metrics
    best = max(metrics, key=lambda row: row["test_accuracy"])
    assert (summary["best_epoch"], summary["best_accuracy"]) == (
        best["epoch"],
        best["test_accuracy"],
    )
    assert summary["final_accuracy"] == metrics[-1]["test_accuracy"]
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint.pt",
        "config.json",
        "metrics.jsonl",
        "summary.json",
    ]
    return metrics, summary, configuration


# ------------------------------------------------------------------------ the error boundary


@click.command("boom")
@click.option("--kind", default="bug")
def boom(kind):
    """A command that fails as asked: stands for any command, also ones added later."""
    if kind == "bug":
        raise RuntimeError("something\nwent wrong")
    if kind == "oserror":
        raise PermissionError(13, "Permission denied", "/some/file")
    if kind == "memory":
        raise MemoryError()
    if kind == "interrupt":
        raise KeyboardInterrupt
    raise ConfigError("a user error")


@pytest.fixture
def boom_command(monkeypatch):
    monkeypatch.setitem(COMMANDS, "boom", (__name__, "boom"))


def test_a_bug_is_one_line_naming_the_file_that_holds_its_traceback(capsys, boom_command):
    code, _, err = run_cli(capsys, "boom")
    assert code == 1 and len(err) == 1, err
    line = err[0]
    assert line.startswith("error: unexpected RuntimeError: something went wrong — this is a bug")
    assert line.endswith("(stratify --debug prints it)")
    path = Path(line.split("the traceback is in ")[1].split(" (stratify")[0])
    try:
        text = path.read_text()
        assert "command: stratify boom" in text
        assert (
            "Traceback (most recent call last)" in text and 'raise RuntimeError("something' in text
        )
    finally:
        path.unlink()


@pytest.mark.parametrize("spelling", [["--debug"], ["env"]])
def test_debug_prints_the_traceback(capsys, boom_command, monkeypatch, spelling):
    if spelling == ["env"]:
        monkeypatch.setenv("STRATIFY_DEBUG", "1")
        spelling = []
    code, _, err = run_cli(capsys, *spelling, "boom")
    assert code == 1
    assert err[0] == "Traceback (most recent call last):"
    assert (
        err[-1]
        == "error: unexpected RuntimeError: something went wrong — this is a bug in stratify"
    )


@pytest.mark.parametrize(
    "kind, code, line",
    [
        ("user", 2, "error: a user error"),
        ("oserror", 2, "error: Permission denied: /some/file"),
        ("memory", 2, "error: out of memory (an allocation failed); use smaller sizes"),
        ("interrupt", 130, "interrupted"),
    ],
)
def test_user_errors_are_one_line_in_any_command(capsys, boom_command, kind, code, line):
    status, _, err = run_cli(capsys, "boom", "--kind", kind)
    assert status == code and len(err) == 1 and err[0].startswith(line), err


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--no-such-flag"], "No such option '--no-such-flag'"),
        (["bench", "steps", "--nope"], "No such option '--nope'"),
        (["bench", "nothing"], "No such command 'nothing'"),
        (["data", "stats", "--clients", "x"], "'x' is not a valid integer"),
        (["nothing"], "No such command 'nothing'"),
    ],
)
def test_click_usage_errors_are_one_line(capsys, args, message):
    assert_one_line_error(capsys, *args, match=message)


# -------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--seed", "-1"], "--seed must be an integer >= 0, got -1"),
        (["train", "--seed", str(2**64)], "--seed must be in [0, 2**63)"),
        (["data", "stats", "--seed", "-1"], "--seed must be an integer >= 0, got -1"),
        (["data", "stats", "--seed", str(2**64)], "--seed must be in [0, 2**63)"),
        (["data", "stats", "--min-size", "-3"], "--min-size must be an integer >= 0"),
        (["data", "stats", "--clients", "0"], "--clients must be a positive integer"),
        (["bench", "privacy", "--seed", "-1"], "--seed must be an integer >= 0, got -1"),
        (["bench", "privacy", "--seed", str(2**64)], "--seed must be in [0, 2**63)"),
        (["bench", "privacy", "--classes", "100000000"], "--classes takes at most 4096"),
        (["train", "--momentum", "-1"], "--momentum must be in [0, 1), got '-1'"),
        (["train", "--momentum", "nan"], "--momentum must be in [0, 1), got 'nan'"),
        (["train", "--lr", "inf"], "--lr must be a positive finite number, got 'inf'"),
        (["train", "--lr", "nan"], "--lr must be a positive finite number, got 'nan'"),
        (
            ["train", "--repeat-count", "1000000000"],
            "an epoch of 10,000,000,000 schedule entries (--repeat-count 1000000000 for each "
            "of 10 labels) would need at least",
        ),
        (["train", "--model", "mlp", "--mlp-hidden", "100000000"], "--mlp-hidden 100000000"),
        (
            [
                "train",
                "--dataset",
                "synthetic",
                "-o",
                "n_train=1000000000",
                "-o",
                "num_features=1000",
            ],
            "synthetic: 1,000,000,000 + 500 samples of 1,000 features would need at least",
        ),
        (["train", "--dataset", "colored-mnist", "-o", "correlation=abc"], "correlation='abc'"),
        (["train", "--dataset", "rotated-mnist", "-o", "angles=abc"], "angles='abc' is not"),
        (["train", "--dataset", "synthetic", "-o", "num_classes=0"], "num_classes=0 is out"),
        (["bench", "steps", "--steps", "100000000000"], "--steps 100,000,000,000 would need"),
        (["bench", "transfers", "--seeds", "-1"], "--seeds takes comma-separated seeds"),
        # loop counts: refused up front instead of running for years
        (["bench", "transfers", "--seeds", "0..1000000000"], "--seeds takes at most 10,000"),
        (["bench", "steps", "--seeds", "0..1000000000"], "--seeds takes at most 10,000"),
        (["train", "--seeds", "0..1000000000"], "--seeds takes at most 10,000 seeds"),
        (["bench", "batch", "--repeat", "1000000000"], "--repeat takes at most 10,000"),
        (["bench", "rounds", "--rounds", "1000000000"], "--rounds takes at most 10,000"),
        (["bench", "privacy", "--repeat", "1000000000"], "--repeat takes at most 10,000"),
        # sizes beyond the machine's memory, before anything is allocated
        (
            ["bench", "steps", "--seeds", "0..9999", "--workers", "1000000000"],
            "--workers 1,000,000,000 with 10,000 seeds (10,000 worker processes",
        ),
        (
            ["bench", "privacy", "--classes", "2", "--clients", "1000000000"],
            "--clients 1,000,000,000 (a label set per client) would need at least",
        ),
        (
            ["train", "--algorithm", "fedbr", "--mode", "batch", "--rsm-size", "1000000000"],
            "--rsm-size 1,000,000,000 (64 pseudo-samples of that many samples) would need",
        ),
        (
            [
                "train",
                "--algorithm",
                "fedbr",
                "--mode",
                "batch",
                "--pseudo-data",
                "mixture",
                "--mixture-size",
                "1000000000",
            ],
            "--mixture-size 1,000,000,000 (64 pseudo-samples of that many samples) would need",
        ),
    ],
)
def test_bad_values_are_refused_where_they_enter(capsys, tmp_path, args, message):
    extra = ["--out", str(tmp_path / "run"), "--no-secure"] if args[0] == "train" else []
    if args[:2] == ["bench", "transfers"]:
        extra = ["--dataset", "digits"]
    if args[:2] == ["bench", "privacy"] and "--classes" not in args:
        extra = ["--classes", "2", "--clients", "2"]
    if args[:2] == ["bench", "batch"] or args[:2] == ["bench", "rounds"]:
        extra = ["--dataset", "digits"]
    assert_one_line_error(capsys, *args, *extra, match=message)
    assert not (tmp_path / "run").exists()  # refused before the run folder was made


def float_options():
    """``(algorithm, mode, option)`` for every float option of every method."""
    for algorithm in ALGORITHMS:
        cls = strategy_class(algorithm)
        for entry in cls.options_class.option_fields():
            if entry.metadata["type"] is float:
                modes = [m for m in cls.card.identity.modes if m in entry.metadata["modes"]]
                yield algorithm, modes[0], entry.name


@pytest.mark.parametrize("algorithm, mode, name", list(float_options()))
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "nan", "inf"])
def test_every_float_option_of_every_method_must_be_finite(algorithm, mode, name, value):
    with pytest.raises(ConfigError, match=f"--{name.replace('_', '-')}"):
        TrainConfig(algorithm=algorithm, mode=mode, options={name: value})


@pytest.mark.parametrize("value", [math.nan, math.inf, "-inf", 0, -1e-3])
def test_the_learning_rate_must_be_finite_and_positive(value):
    with pytest.raises(ConfigError, match="--lr must be a positive finite number"):
        TrainConfig(lr=value)


# ---------------------------------------------------------------------- run folders


@pytest.mark.slow
def test_two_processes_started_together_on_one_out(tmp_path):
    out = tmp_path / "shared"
    args = ["train", "--no-secure", "--repeat-count", "100", "--epochs", "3", "--out", str(out)]
    first, second = stratify_process(*args), stratify_process(*args, "--seed", "1")
    results = []
    for process in (first, second):
        out_text, err_text = process.communicate(timeout=600)
        results.append((process.returncode, out_text, err_text))
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, _, err in results if code == 2).strip().splitlines()
    assert len(refused) == 1 and "Traceback" not in refused[0], refused
    # it met the lock ("in use") or, had the winner already finished, its finished run
    assert "is in use by another run" in refused[0] or "already holds a run" in refused[0]
    metrics, _, configuration = read_run(out)
    assert len(metrics) == configuration["epochs"] == 3
    winner_seed = 0 if results[0][0] == 0 else 1
    assert configuration["seed"] == winner_seed
    assert [entry.name for entry in tmp_path.iterdir()] == ["shared"]  # no lock, no staging


def race_two_runs(first_out, second_out, **popen):
    """Two real runs started at once, seed 0 on ``first_out`` and fedavg with seed 1 on
    ``second_out``, two paths to one folder: one must be refused in one line."""
    first = stratify_process(
        "train", "--no-secure", "--repeat-count", "100", "--epochs", "3", "--seed", "0",
        "--out", first_out, **popen,
    )  # fmt: skip
    second = stratify_process(
        "train", "--no-secure", "--algorithm", "fedavg", "--local-epochs", "1", "--epochs",
        "3", "--seed", "1", "--out", second_out, **popen,
    )  # fmt: skip
    results = []
    for process in (first, second):
        out_text, err_text = process.communicate(timeout=600)
        results.append((process.returncode, err_text))
    assert sorted(code for code, _ in results) == [0, 2], results
    refused = next(err for code, err in results if code == 2).strip().splitlines()
    assert len(refused) == 1, refused
    assert "is in use by another run" in refused[0] or "already holds a run" in refused[0]
    return 0 if results[0][0] == 0 else 1


def assert_one_consistent_run(out, winner):
    """Every file of the run in ``out`` is the winner's: config, metrics, summary and
    checkpoint agree on the method and the seed."""
    metrics, summary, configuration = read_run(out)
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    algorithm, seed = (("stratify", 0), ("fedavg", 1))[winner]
    assert (configuration["algorithm"], configuration["seed"]) == (algorithm, seed)
    assert summary["algorithm"] == algorithm and len(metrics) == 3
    assert (checkpoint["config"]["algorithm"], checkpoint["config"]["seed"]) == (algorithm, seed)


@pytest.mark.slow
def test_two_runs_through_a_symlink_to_one_folder(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    winner = race_two_runs(str(tmp_path / "real"), str(tmp_path / "link"))
    assert_one_consistent_run(tmp_path / "real", winner)
    assert (tmp_path / "link").is_symlink()
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["link", "real"]


@pytest.mark.slow
def test_two_runs_through_dot_dot_to_one_folder(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    winner = race_two_runs(str(tmp_path / "a" / "run"), str(tmp_path / "a" / "b" / ".." / "run"))
    assert_one_consistent_run(tmp_path / "a" / "run", winner)


def bind_mounts_work():
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True
    )
    return probe.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("unshare") is None or not bind_mounts_work(),
    reason="needs unshare with user and mount namespaces to make a bind mount",
)
def test_two_runs_through_a_bind_mount_of_the_folder(tmp_path):
    real, mounted = tmp_path / "real", tmp_path / "mounted"
    real.mkdir()
    mounted.mkdir()
    stratify = f"{sys.executable} -m stratify.cli.main train --no-secure --epochs 3"
    # both runs in one mount namespace, in which `mounted` shows the folder `real`
    script = (
        f"mount --bind {real} {mounted} || exit 1; "
        f"{stratify} --repeat-count 100 --seed 0 --out {real} 2>{tmp_path}/first.err & "
        f"{stratify} --algorithm fedavg --local-epochs 1 --seed 1 --out {mounted} "
        f"2>{tmp_path}/second.err; echo $? > {tmp_path}/second.code; "
        f"wait $!; echo $? > {tmp_path}/first.code"
    )
    subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
        check=True,
        timeout=600,
    )
    codes = [int((tmp_path / f"{name}.code").read_text()) for name in ("first", "second")]
    assert sorted(codes) == [0, 2], codes
    loser = ("first", "second")[codes.index(2)]
    lines = (tmp_path / f"{loser}.err").read_text().strip().splitlines()
    assert len(lines) == 1, lines
    assert "is in use by another run" in lines[0] or "already holds a run" in lines[0]
    assert_one_consistent_run(real, codes.index(0))
    assert list(mounted.iterdir()) == []  # outside the namespace, nothing is mounted there


def test_a_run_is_refused_while_another_holds_its_folder_even_with_overwrite(tmp_path):
    Run(config(tmp_path, epochs=1)).train()
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    holder = Run(config(tmp_path, epochs=2), resume=True)
    for flags in ({}, {"overwrite": True}, {"resume": True}):
        with pytest.raises(OutputError, match="is in use by another run"):
            Run(config(tmp_path, epochs=3), **flags)
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}.keys() == before.keys()
    holder.train()
    metrics, _, _ = read_run(tmp_path / "run")
    assert len(metrics) == 2


def test_overwrite_keeps_the_old_run_when_the_new_one_fails_in_its_first_epoch(capsys, tmp_path):
    out = str(tmp_path / "run")
    assert run_cli(capsys, "train", *QUICK, "--out", out)[0] == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    line = assert_one_line_error(
        capsys, "train", *QUICK, "--lr", "1e30", "--out", out, "--overwrite", match="non-finite"
    )
    assert f"the run already in {out} is left as it was" in line
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before
    assert [entry.name for entry in tmp_path.iterdir()] == ["run"]
    # a set-up that fails leaves it too; one that succeeds replaces it
    assert_one_line_error(capsys, "train", *QUICK, "--partition", "classes:99", "--out", out)
    assert run_cli(capsys, "train", *QUICK, "--seed", "5", "--out", out, "--overwrite")[0] == 0
    assert read_run(tmp_path / "run")[2]["seed"] == 5


def test_a_new_run_that_fails_in_its_first_epoch_leaves_nothing_to_trip_over(capsys, tmp_path):
    out = str(tmp_path / "run")
    line = assert_one_line_error(capsys, "train", *QUICK, "--lr", "1e30", "--out", out)
    assert "no checkpoint was written" in line
    assert not (tmp_path / "run").exists()
    assert run_cli(capsys, "train", *QUICK, "--out", out)[0] == 0  # the retry needs no flag


def test_config_and_summary_are_rewritten_on_resume_and_after_every_epoch(tmp_path):
    Run(config(tmp_path, epochs=1)).train()
    (tmp_path / "run" / "config.json").write_text("{damaged")
    seen = []

    def stop_after_two(record):
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        seen.append((record.epoch, summary["epochs_completed"]))
        if record.epoch == 2:
            raise KeyboardInterrupt  # the user stops the resumed run

    resumed = Run(config(tmp_path, epochs=4), resume=True, on_epoch=stop_after_two)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["epochs"] == 4
    with pytest.raises(KeyboardInterrupt):
        resumed.train()
    assert seen == [(2, 2)]
    metrics, summary, configuration = read_run(tmp_path / "run")
    assert len(metrics) == 2 and configuration["epochs"] == 4
    Run(config(tmp_path, epochs=3), resume=True).train()
    assert len(read_run(tmp_path / "run")[0]) == 3


def test_a_resumed_run_that_fails_in_its_first_epoch_keeps_the_run(tmp_path, monkeypatch):
    Run(config(tmp_path, epochs=1)).train()
    resumed = Run(config(tmp_path, epochs=3), resume=True)

    def diverge(epoch):
        raise TrainingError("the training loss became non-finite in epoch 2")

    monkeypatch.setattr(resumed.engine, "run_epoch", diverge)
    with pytest.raises(TrainingError, match=r"the last good checkpoint \(epoch 1\) is kept"):
        resumed.train()
    metrics, _, configuration = read_run(tmp_path / "run")
    assert len(metrics) == 1 and configuration["epochs"] == 3


@pytest.mark.slow
def test_runs_killed_in_epoch_one_and_in_epoch_two(capsys, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    long_first_epoch = ["train", "--no-secure", "--repeat-count", "5000", "--out", str(first)]
    three_epochs = ["train", "--no-secure", "--repeat-count", "100", "--epochs", "3"]
    three_epochs += ["--out", str(second)]
    # both started at once, so their start-ups overlap
    processes = stratify_process(*long_first_epoch), stratify_process(*three_epochs)
    try:
        # config.json is written at the start, the checkpoint at the end of epoch 1
        kill_when_written(
            (first / "config.json", processes[0]), (second / "checkpoint.pt", processes[1])
        )
    finally:
        for process in processes:
            process.kill()
            process.communicate()

    # killed in epoch 1: one message, whichever the user tries, and it names the way out
    stopped = "holds a run stopped before its first checkpoint.pt was written"
    for flags in ([], ["--resume"]):
        line = assert_one_line_error(capsys, "train", *QUICK, "--out", str(first), *flags)
        assert stopped in line and "start it again with --overwrite" in line
    assert run_cli(capsys, "train", *QUICK, "--out", str(first), "--overwrite")[0] == 0
    assert len(read_run(first)[0]) == 1

    # killed after epoch 1: every file whole (metrics may lag the checkpoint by the epoch
    # being written), the lock gone with the process, and the run resumes to the end
    epoch = torch.load(second / "checkpoint.pt", weights_only=True)["epoch"]
    lines = (second / "metrics.jsonl").read_text().splitlines()
    assert epoch in (1, 2) and [json.loads(line)["epoch"] for line in lines] in (
        list(range(1, epoch + 1)),
        list(range(1, epoch)),
    )
    json.loads((second / "summary.json").read_text())
    assert run_cli(capsys, *three_epochs, "--resume")[0] == 0
    assert len(read_run(second)[0]) == 3


# ------------------------------------------------------------------ paths and the disk


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder in which this process cannot create files (root ignores permission bits,
    so root gets /sys, which refuses new files to everyone)."""
    if os.geteuid() == 0:
        folder = Path("/sys")
    else:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
    with pytest.raises(OSError):
        (folder / "probe").write_text("x")
    yield folder
    if folder != Path("/sys"):
        folder.chmod(0o755)


def test_unusable_out_paths_are_one_line(capsys, tmp_path, read_only_folder, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("README.md").write_text("a file")
    cases = [
        (str(read_only_folder / "run"), f"cannot use --out {read_only_folder / 'run'}"),
        ("README.md/run", "cannot use --out README.md/run: Not a directory"),
        ("README.md", "Directory 'README.md' is a file"),
        ("x" * 300, "File name too long"),
        ("", "--out needs a folder name, got an empty one"),
    ]
    for out, message in cases:
        assert_one_line_error(capsys, "train", *QUICK, "--out", out, match=message)
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["README.md"]


def test_a_checkpoint_that_is_a_folder(capsys, tmp_path):
    out = tmp_path / "run"
    (out / "checkpoint.pt").mkdir(parents=True)
    assert_one_line_error(capsys, "train", *QUICK, "--out", str(out), match="already holds a run")
    assert_one_line_error(
        capsys, "train", *QUICK, "--out", str(out), "--resume", match="is a folder, not a regular"
    )
    assert run_cli(capsys, "train", *QUICK, "--out", str(out), "--overwrite")[0] == 0
    assert (out / "checkpoint.pt").is_file()


def limit_file_size():
    # Python ignores SIGXFSZ, so a write past the limit fails with EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))


@pytest.mark.slow
def test_a_disk_that_cannot_take_the_checkpoint(tmp_path):
    out = tmp_path / "run"
    process = stratify_process("train", *QUICK, "--out", str(out), preexec_fn=limit_file_size)
    _, err = process.communicate(timeout=600)
    lines = err.strip().splitlines()
    assert process.returncode == 2 and "Traceback" not in err, err
    assert lines[-1] == f"error: cannot write {out / 'checkpoint.pt'}: File too large"
    assert list(tmp_path.iterdir()) == []  # no half-written run, no temporary file


def test_a_full_disk_after_epoch_one_keeps_a_resumable_run(capsys, tmp_path, monkeypatch):
    from stratify import runfolder

    out = str(tmp_path / "run")
    real_write = runfolder.write_atomically

    def full_at_epoch_two(path, data, *args):
        if path.name == "checkpoint.pt" and (path.parent / "checkpoint.pt").exists():
            raise OSError(28, "No space left on device")
        real_write(path, data, *args)

    monkeypatch.setattr(runfolder, "write_atomically", full_at_epoch_two)
    line = assert_one_line_error(capsys, "train", *BASE, "--epochs", "3", "--out", out)
    assert line.endswith("checkpoint.pt: No space left on device (its previous version is kept)")
    assert len(read_run(tmp_path / "run")[0]) == 1
    monkeypatch.setattr(runfolder, "write_atomically", real_write)
    assert run_cli(capsys, "train", *BASE, "--epochs", "3", "--out", out, "--resume")[0] == 0
    assert len(read_run(tmp_path / "run")[0]) == 3


@pytest.mark.parametrize(
    "command", [["bench", "transfers", "--dataset", "digits"], ["bench", "privacy"]]
)
def test_an_unwritable_json_file_is_refused_before_the_benchmark_runs(capsys, command):
    line = assert_one_line_error(capsys, *command, "--json", "/nonexistent/x.json")
    assert line == "error: cannot write --json /nonexistent/x.json: no folder /nonexistent"


# ----------------------------------------------------------------------- checkpoints


class _RunsCode:
    """Unpickling this calls ``marker.touch()``: what a crafted checkpoint would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_crafted_checkpoint_does_not_run_code_on_resume(capsys, tmp_path):
    out = tmp_path / "run"
    assert run_cli(capsys, "train", *QUICK, "--out", str(out))[0] == 0
    marker = tmp_path / "code-ran"
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    torch.save({**checkpoint, "payload": _RunsCode(marker)}, out / "checkpoint.pt")
    # the payload is live: a plain unpickling does run it
    torch.load(out / "checkpoint.pt", weights_only=False)
    assert marker.exists()
    marker.unlink()
    line = assert_one_line_error(
        capsys, "train", *BASE, "--epochs", "2", "--out", str(out), "--resume"
    )
    assert "checkpoint.pt is unreadable (UnpicklingError)" in line
    assert not marker.exists()


def corrupt_missing_key(checkpoint):
    del checkpoint["torch_rng"]


def corrupt_shape(checkpoint):
    key = next(iter(checkpoint["model"]))
    checkpoint["model"][key] = torch.zeros(3, 3)


def corrupt_dtype(checkpoint):
    key = next(iter(checkpoint["model"]))
    checkpoint["model"][key] = checkpoint["model"][key].double()


def corrupt_rng(checkpoint):
    checkpoint["torch_rng"] = torch.zeros(7, dtype=torch.uint8)


def zero_rng(checkpoint):
    checkpoint["torch_rng"] = torch.zeros_like(checkpoint["torch_rng"])


def corrupt_records(checkpoint):
    checkpoint["records"] = []


def records_as_strings(checkpoint):
    checkpoint["records"] = [json.dumps(record) for record in checkpoint["records"]]


def a_record_value_as_a_string(checkpoint):
    checkpoint["records"][0]["test_accuracy"] = "0.9"


def sparse_weights(checkpoint):
    key = next(iter(checkpoint["model"]))
    checkpoint["model"][key] = checkpoint["model"][key].to_sparse()


def sparse_momentum(checkpoint):
    weight = next(iter(checkpoint["model"].values()))
    checkpoint["strategy"]["optimizer"]["state"] = {0: {"momentum_buffer": weight.to_sparse()}}


def momentum_of_another_shape(checkpoint):
    checkpoint["strategy"]["optimizer"]["state"] = {0: {"momentum_buffer": torch.zeros(3)}}


def epoch_as_a_bool(checkpoint):
    checkpoint["epoch"] = True


def steps_as_a_string(checkpoint):
    checkpoint["strategy"]["steps_made"] = "50"


def an_extra_field(checkpoint):
    checkpoint["payload"] = torch.zeros(1)


def corrupt_strategy(checkpoint):
    checkpoint["strategy"] = {"optimizer": {"state": 5}}


@pytest.mark.parametrize(
    "corrupt, problem",
    [
        (corrupt_missing_key, "torch_rng missing"),
        (corrupt_shape, "is (3, 3), the model needs (6, 1, 5, 5)"),
        (corrupt_dtype, "is torch.float64, the model needs torch.float32"),
        (corrupt_rng, "torch_rng is a torch.strided tensor (7,) of torch.uint8, not the 5056"),
        (zero_rng, "torch_rng is not a state of torch's generator"),
        (corrupt_records, "records holds 0 epochs, the checkpoint's epoch is 1"),
        (records_as_strings, "records[0] is a str, not an epoch record"),
        (a_record_value_as_a_string, "records[0].test_accuracy is '0.9', not a number"),
        (sparse_weights, "features.0.weight is a torch.sparse_coo tensor; only dense"),
        (sparse_momentum, "momentum_buffer is a torch.sparse_coo tensor; only dense"),
        (momentum_of_another_shape, "state.0.momentum_buffer is (3,), the model needs (6, 1"),
        (epoch_as_a_bool, "epoch is True, not a positive integer"),
        (steps_as_a_string, "strategy.steps_made is '50', not an int"),
        (an_extra_field, "payload is not a field of a training checkpoint"),
        (corrupt_strategy, "strategy.optimizer.state is 5, not a dict"),
    ],
)
def test_a_checkpoint_that_does_not_fit_is_one_line_and_changes_nothing(
    capsys, tmp_path, corrupt, problem
):
    out = tmp_path / "run"
    assert run_cli(capsys, "train", *QUICK, "--out", str(out))[0] == 0
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    corrupt(checkpoint)
    torch.save(checkpoint, out / "checkpoint.pt")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, _, err = run_cli(capsys, "train", *BASE, "--epochs", "2", "--out", str(out), "--resume")
    assert code == 2 and len(err) == 1, err  # no warning beside the line
    line = err[0]
    assert line.startswith("error: checkpoint refused: ") and problem in line, line
    assert line.endswith("is left as it is; start a new run with --overwrite)")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# ------------------------------------------------- what used to hang or take the bug path


def timed_stratify(*args, timeout=60, **popen):
    """A real ``stratify`` process that must end within ``timeout`` seconds, or ten
    measured start-ups if more: ``(exit code, stderr lines, seconds)``.

    A read of a FIFO that nobody writes never ends, so any bound catches it; 60 s leaves
    the start-up (torch's import) room on two loaded cores beside a second test worker,
    where 10 s ran out (docs/development.md, "Tests"), but not beside a second suite.
    """
    timeout = startup_bound(timeout)
    started = time.monotonic()
    process = subprocess.run(
        [sys.executable, "-m", "stratify.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **popen,
    )
    return process.returncode, process.stderr.strip().splitlines(), time.monotonic() - started


@pytest.mark.slow
def test_a_fifo_given_as_the_checkpoint_is_refused_without_waiting(capsys, tmp_path):
    out = tmp_path / "run"
    assert run_cli(capsys, "train", *QUICK, "--out", str(out))[0] == 0
    (out / "checkpoint.pt").unlink()
    os.mkfifo(out / "checkpoint.pt")
    code, err, _ = timed_stratify("train", *BASE, "--epochs", "2", "--out", str(out), "--resume")
    assert code == 2 and len(err) == 1, err
    assert err[0] == (
        f"error: --resume: {out / 'checkpoint.pt'} is a FIFO, not a regular file; start a new "
        "run with --overwrite"
    )


@pytest.mark.slow
def test_a_fifo_given_as_an_mnist_file_is_refused_without_waiting(tmp_path, shared_data_dir):
    (tmp_path / "mnist").mkdir()
    labels = Path(shared_data_dir) / "mnist" / "t10k-labels-idx1-ubyte.gz"
    (tmp_path / "mnist" / labels.name).write_bytes(labels.read_bytes())
    os.mkfifo(tmp_path / "mnist" / "t10k-images-idx3-ubyte.gz")
    out = tmp_path / "run"
    code, err, _ = timed_stratify(
        "train", "--dataset", "mnist-10k", "--data-dir", str(tmp_path), *QUICK, "--out", str(out)
    )
    assert code == 2 and len(err) == 1, err
    assert "t10k-images-idx3-ubyte.gz is a FIFO, not a regular file" in err[0]
    assert not out.exists()


def test_a_libsvm_file_too_small_for_a_test_split_is_refused_up_front(capsys, tmp_path):
    (tmp_path / "covtype").mkdir()
    rows = "1 1:0.5 2:0.3\n2 1:0.1 3:0.9\n1 2:0.2 4:0.1\n"
    (tmp_path / "covtype" / "covtype.libsvm.binary").write_text(rows)
    args = ["train", "--dataset", "covtype-binary", "--data-dir", str(tmp_path), *QUICK]
    code, _, err = run_cli(capsys, *args, "--partition", "iid", "--clients", "2")
    assert code == 2 and err == [  # no numpy warning before it
        "error: covtype-binary: its test split is empty (3 training and 0 test samples); the "
        "files hold too few samples"
    ]


@pytest.mark.slow
def test_a_dead_ray_address_is_one_line_in_bounded_time(tmp_path):
    out = tmp_path / "grid"
    args = ["reproduce", "table2", "--dataset", "digits", "--backend", "ray", "--out", str(out)]
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    code, err, seconds = timed_stratify(*args, "--address", f"127.0.0.1:{port}", timeout=30)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: --backend ray: nothing answers at 127.0.0.1:{port} (")
    assert not out.exists()


@pytest.mark.slow
def test_an_address_that_answers_but_is_no_ray_cluster_is_one_line_in_bounded_time(tmp_path):
    out = tmp_path / "grid"
    args = ["reproduce", "table2", "--dataset", "digits", "--backend", "ray", "--out", str(out)]
    with socket.socket() as server:  # accepts connections and closes them: not Ray
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        port = server.getsockname()[1]
        process = subprocess.Popen(
            [sys.executable, "-m", "stratify.cli.main", *args, "--address", f"127.0.0.1:{port}"],
            stderr=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 90  # the trial driver's bound (30 s) and start-ups
        while process.poll() is None:
            assert time.monotonic() < deadline, "reproduce still waits on the address"
            try:
                server.accept()[0].close()
            except TimeoutError:
                pass
        err = process.communicate()[1].strip().splitlines()
    assert process.returncode == 2 and len(err) == 1, err
    # Ray gives up by itself, or the trial driver's time runs out
    joined = rf"error: --backend ray: (cannot|could not) join the Ray cluster at 127.0.0.1:{port}"
    assert re.match(joined, err[0]), err
    assert not out.exists()


# ------------------------------------------------------- files the user names as outputs

TRANSFERS = ["bench", "transfers", "--dataset", "digits", "--seeds", "0", "--chunks", "1,5"]


def test_json_writes_through_a_device_node_and_a_symlink(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        os.mknod("null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        os.symlink("/dev/null", "null")  # without CAP_MKNOD: a link to the same device
    assert run_cli(capsys, *TRANSFERS, "--json", "null")[0] == 0
    assert stat.S_ISCHR(os.stat("null").st_mode)  # still the device, not a plain file
    Path("results").mkdir()
    Path("results/figures.json").write_text("old")
    os.symlink("results/figures.json", "latest.json")
    assert run_cli(capsys, *TRANSFERS, "--json", "latest.json")[0] == 0
    assert os.readlink("latest.json") == "results/figures.json"
    assert [row["chunk"] for row in json.loads(Path("results/figures.json").read_text())] == [1, 5]
    assert sorted(os.listdir()) == ["latest.json", "null", "results"]


@pytest.mark.slow
def test_json_writes_into_stdout_and_a_fifo_and_refuses_a_fifo_nobody_reads(tmp_path):
    process = subprocess.run(
        [sys.executable, "-m", "stratify.cli.main", *TRANSFERS, "--json", "/dev/stdout"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr
    start = process.stdout.index("[\n")  # the JSON follows the table on stdout
    assert [row["chunk"] for row in json.loads(process.stdout[start:])] == [1, 5]
    fifo = tmp_path / "figures"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    try:
        code, err, _ = timed_stratify(*TRANSFERS, "--json", str(fifo), timeout=300)
        assert code == 0, err
        assert [row["chunk"] for row in json.loads(reader.communicate(timeout=30)[0])] == [1, 5]
    finally:
        reader.kill()
    code, err, _ = timed_stratify(*TRANSFERS, "--json", str(fifo), timeout=300)
    assert code == 2 and err[-1] == f"error: cannot write --json {fifo}: no process reads this FIFO"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_resume_continues_a_run_beside_its_plot_and_a_hidden_file(capsys, tmp_path):
    out = tmp_path / "run"
    assert run_cli(capsys, "train", *QUICK, "--out", str(out))[0] == 0
    assert run_cli(capsys, "plot", str(out), "--out", str(out / "accuracy.png"))[0] == 0
    (out / ".DS_Store").write_bytes(b"finder")
    kept = {name: (out / name).read_bytes() for name in ("accuracy.png", ".DS_Store")}
    code, _, err = run_cli(capsys, "train", *BASE, "--epochs", "2", "--out", str(out), "--resume")
    assert code == 0, err
    assert [record["epoch"] for record in read_records(out)] == [1, 2]
    assert json.loads((out / "summary.json").read_text())["epochs_completed"] == 2
    assert {name: (out / name).read_bytes() for name in kept} == kept
    # replacing the folder would delete them: --overwrite keeps the strict rule
    line = assert_one_line_error(capsys, "train", *QUICK, "--out", str(out), "--overwrite")
    assert "holds files that are not a run's (.DS_Store, accuracy.png)" in line
