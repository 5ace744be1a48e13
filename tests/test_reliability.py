"""The reliability promise, defect by defect (issue 11): one line and exit code 2 for every
bad input, a bug reported as a bug, and run folders that concurrent, killed, failing or
replacing runs cannot corrupt. Several tests start real processes."""

import json
import math
import os
import resource
import signal
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


def wait_for(path, process, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
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
        (["partition-stats", "--clients", "x"], "'x' is not a valid integer"),
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
        (["partition-stats", "--seed", "-1"], "--seed must be an integer >= 0, got -1"),
        (["partition-stats", "--seed", str(2**64)], "--seed must be in [0, 2**63)"),
        (["partition-stats", "--min-size", "-3"], "--min-size must be an integer >= 0"),
        (["partition-stats", "--clients", "0"], "--clients must be a positive integer"),
        (["bench-privacy", "--seed", "-1"], "--seed must be an integer >= 0, got -1"),
        (["bench-privacy", "--seed", str(2**64)], "--seed must be in [0, 2**63)"),
        (["bench-privacy", "--classes", "100000000"], "--classes takes at most 4096"),
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
        (["bench", "transfers", "--seeds", "0"], "--seeds must be a positive integer, got 0"),
    ],
)
def test_bad_values_are_refused_where_they_enter(capsys, tmp_path, args, message):
    extra = ["--out", str(tmp_path / "run"), "--no-secure"] if args[0] == "train" else []
    if args[:2] == ["bench", "transfers"]:
        extra = ["--dataset", "digits"]
    if args[0] == "bench-privacy" and "--classes" not in args:
        extra = ["--classes", "2", "--clients", "2"]
    assert_one_line_error(capsys, *args, *extra, match=message)
    assert not (tmp_path / "run").exists()  # refused before the run folder was made


def float_options():
    """``(algorithm, mode, option)`` for every float option of every method."""
    for algorithm in ALGORITHMS:
        cls = strategy_class(algorithm)
        for entry in cls.options_class.option_fields():
            if entry.metadata["type"] is float:
                modes = [mode for mode in cls.modes if mode in entry.metadata["modes"]]
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
        wait_for(first / "config.json", processes[0])
        processes[0].send_signal(signal.SIGKILL)
        wait_for(second / "checkpoint.pt", processes[1])
        processes[1].send_signal(signal.SIGKILL)
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
        capsys, "train", *QUICK, "--out", str(out), "--resume", match="unreadable"
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

    def full_at_epoch_two(path, data):
        if path.name == "checkpoint.pt" and (path.parent / "checkpoint.pt").exists():
            raise OSError(28, "No space left on device")
        real_write(path, data)

    monkeypatch.setattr(runfolder, "write_atomically", full_at_epoch_two)
    line = assert_one_line_error(capsys, "train", *BASE, "--epochs", "3", "--out", out)
    assert line.endswith("checkpoint.pt: No space left on device (its previous version is kept)")
    assert len(read_run(tmp_path / "run")[0]) == 1
    monkeypatch.setattr(runfolder, "write_atomically", real_write)
    assert run_cli(capsys, "train", *BASE, "--epochs", "3", "--out", out, "--resume")[0] == 0
    assert len(read_run(tmp_path / "run")[0]) == 3


@pytest.mark.parametrize(
    "command", [["bench", "transfers", "--dataset", "digits"], ["bench-privacy"]]
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


def corrupt_records(checkpoint):
    checkpoint["records"] = []


def corrupt_strategy(checkpoint):
    checkpoint["strategy"] = {"optimizer": {"state": 5}}


@pytest.mark.parametrize(
    "corrupt, problem",
    [
        (corrupt_missing_key, "missing torch_rng"),
        (corrupt_shape, "is (3, 3), the model needs"),
        (corrupt_dtype, "is torch.float64, the model needs torch.float32"),
        (corrupt_rng, "random-generator state is malformed"),
        (corrupt_records, "epoch records do not match its epoch"),
        (corrupt_strategy, "in its records or method state"),
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
    line = assert_one_line_error(
        capsys, "train", *BASE, "--epochs", "2", "--out", str(out), "--resume"
    )
    assert "does not fit this run" in line and problem in line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
