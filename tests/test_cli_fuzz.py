"""Property-based test of the command line (hypothesis): random combinations of options and
values, valid and not, for ``train``, ``partition-stats``, ``bench-privacy`` and ``bench``.

The property: every command line ends with exit code 0 or 2, never a traceback; exit code
2 comes with exactly one ``error:`` line, the last one on stderr; a ``train`` that exits
with 0 leaves a complete, consistent run folder. Budgets stay tiny (``digits``, one epoch,
a few schedule entries), and the examples are derandomised, so every run of the suite
tries the same command lines in about the same time.
"""

import contextlib
import io
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stratify.algorithms import ALGORITHMS
from stratify.cli.main import main


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
    "--seeds": ["1", "2", "0", "-1"],
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


def run(argv, tmp):
    """``stratify ARGV`` in this process: ``(exit code, stderr lines)``."""
    argv = [argument.replace("{tmp}", tmp) for argument in argv]
    code = 0
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main(argv)
        except SystemExit as exit_:
            code = exit_.code
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
    assert names == ["checkpoint.pt", "config.json", "metrics.jsonl", "summary.json"], argv
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
    argv = ["partition-stats", *chosen]
    with tempfile.TemporaryDirectory() as tmp:
        code, err = run(argv, tmp)
    assert_exits_cleanly(argv, code, err)


@fuzz(20)
@given(chosen=options(BENCH_PRIVACY_OPTIONS, max_size=4))
def test_bench_privacy_exits_with_0_or_2(chosen):
    # tiny cells unless the example chose them
    argv = ["bench-privacy", "--classes", "2", "--clients", "2", *chosen]
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
        argv = ["bench", "transfers", "--dataset", "digits", "--seeds", "1", *chosen_transfers]
    else:
        argv = ["bench", "steps", "--dataset", "digits", "--steps", "20", *chosen_steps]
    with tempfile.TemporaryDirectory() as tmp:
        code, err = run(argv, tmp)
    assert_exits_cleanly(argv, code, err)
