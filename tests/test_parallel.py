"""Many runs at once: workers give the numbers of sequential runs; stopped runs resume."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from stratify.backend import single_thread_settings
from stratify.cli.main import main
from stratify.data.datasets import dataset_uses_seed, load_dataset
from stratify.errors import ConfigError
from stratify.parallel import (
    DatasetCache,
    LocalBackend,
    RunEvent,
    RunOutcome,
    RunSpec,
    check_specs,
    execute,
    folder_state,
    make_backend,
    run_specs,
)
from stratify.run import Run, TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def config(folder, seed=0, **changes):
    values = dict(
        dataset="digits",
        partition="classes:2",
        clients=10,
        epochs=2,
        lr=0.05,
        secure=False,
        seed=seed,
        options={"repeat_count": 40},
        out=str(folder),
    )
    values.update(changes)
    return TrainConfig(**values)


def metrics(folder):
    rows = [json.loads(line) for line in (Path(folder) / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("wall_seconds")
    return rows


def sequential(tmp_path, configs):
    """The reference: each configuration run on its own, as in a fresh single-thread
    process (a single-sample run turns oneDNN off for the whole process: put back)."""
    results = []
    for index, original in enumerate(configs):
        reference = dataclasses.replace(original, out=str(tmp_path / f"ref-{index}"))
        single_thread_settings()
        Run(reference).train()
        results.append(metrics(reference.out))
    return results


@pytest.mark.slow
def test_workers_give_the_numbers_of_sequential_runs(tmp_path):
    # three runs on two workers: one worker runs two of them, reusing its loaded dataset
    # and its process (a batch-mode run after a single-sample one must not inherit its
    # backend settings)
    configs = [
        config(tmp_path / "seed-0", seed=0),
        config(tmp_path / "seed-1", seed=1),
        config(tmp_path / "batch", seed=0, mode="batch", options={"repeat_count": 40}),
    ]
    events = []
    outcomes = run_specs(
        [RunSpec(Path(c.out).name, c) for c in configs], LocalBackend(workers=2), events.append
    )
    assert [outcome.status for outcome in outcomes] == ["finished"] * 3
    assert [metrics(c.out) for c in configs] == sequential(tmp_path, configs)
    epochs = [e for e in events if isinstance(e, RunEvent) and e.kind == "epoch"]
    assert sorted((e.name, e.epoch) for e in epochs) == [
        (name, epoch) for name in ("batch", "seed-0", "seed-1") for epoch in (1, 2)
    ]
    assert len({e.pid for e in epochs}) == 2  # two worker processes, not this one
    assert os.getpid() not in {e.pid for e in epochs}


@pytest.mark.slow
def test_a_killed_worker_run_resumes_to_the_same_result(tmp_path):
    # long enough epochs that the kill lands mid-run, after the first checkpoint
    long = {"repeat_count": 200}
    victim = config(tmp_path / "victim", seed=3, epochs=3, options=long)
    other = config(tmp_path / "other", seed=4, epochs=1)
    specs = [RunSpec("victim", victim), RunSpec("other", other)]
    killed = []

    def kill_after_first_epoch(item):
        if isinstance(item, RunEvent) and item.name == "victim" and item.kind == "epoch":
            if not killed:
                os.kill(item.pid, signal.SIGKILL)
                killed.append(item.epoch)

    outcomes = run_specs(specs, LocalBackend(workers=2), kill_after_first_epoch)
    assert killed == [1]
    assert outcomes[0].status == "failed" and "died" in outcomes[0].message
    assert outcomes[1].status == "finished"
    state = folder_state(victim)
    assert state.kind == "resumable" and 1 <= state.epochs_done < 3
    resumed = run_specs(specs, LocalBackend(workers=1))
    assert [outcome.status for outcome in resumed] == ["finished", "skipped"]
    assert metrics(victim.out) == sequential(tmp_path, [victim])[0]


def wait_for(condition, seconds=120):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def group_alive(group):
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def terminal_sigint() -> None:
    """In a child before exec: SIGINT unblocked and at its default action."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_stops_every_worker_and_resume_finishes_the_runs(tmp_path):
    # the signal goes once seed 0's first epoch is saved: the epochs after it must outlast
    # a poll delayed by a loaded machine (with 3 epochs both runs once finished first)
    epochs = 6
    out = tmp_path / "seeds"
    command = [
        sys.executable,
        "-m",
        "stratify.cli.main",
        "train",
        "--dataset",
        "digits",
        "--partition",
        "classes:2",
        "--lr",
        "0.05",
        "--no-secure",
        "--epochs",
        str(epochs),
        "--repeat-count",
        "150",
        "--seeds",
        "0,1",
        "--workers",
        "2",
        "--out",
        str(out),
    ]
    # a session of its own: Ctrl-C in a terminal reaches the whole process group; and
    # SIGINT delivered, with its default action, as a terminal's command has it, whatever
    # this process has: an ignored or blocked SIGINT is inherited through exec (a
    # background job of a script ignores it), and the runs would then finish (exit 0)
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=terminal_sigint,
    )
    started = wait_for(lambda: (out / "seed-0" / "checkpoint.pt").exists())
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert started, stderr
    # what this process had, for a failure's diagnosis (the child was reset either way)
    here = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []))
    assert process.returncode == 130, (here, stderr)
    assert "--resume" in stderr
    assert wait_for(lambda: not group_alive(process.pid), 20), "a worker outlived Ctrl-C"
    assert folder_state(config(out / "seed-0", epochs=epochs)).kind in ("resumable", "finished")
    # resumed in one process (--workers 1): what is checked here is the folders' state
    again = [*command[: command.index("--workers")], "--workers", "1", "--out", str(out)]
    resumed = subprocess.run(again + ["--resume"], cwd=tmp_path, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    for seed in (0, 1):
        reference = config(
            tmp_path / f"alone-{seed}", seed=seed, epochs=epochs, options={"repeat_count": 150}
        )
        Run(reference).train()
        assert metrics(out / f"seed-{seed}") == metrics(reference.out)


def test_one_worker_runs_here_and_finished_runs_are_skipped(tmp_path):
    first = config(tmp_path / "a")
    outcomes = run_specs([RunSpec("a", first)], LocalBackend(workers=1))
    assert outcomes[0].status == "finished" and outcomes[0].epochs_done == 2
    written = (tmp_path / "a" / "metrics.jsonl").stat().st_mtime_ns
    again = run_specs([RunSpec("a", first)], LocalBackend(workers=1))
    assert again[0].status == "skipped"
    assert again[0].best_accuracy == outcomes[0].best_accuracy
    assert (tmp_path / "a" / "metrics.jsonl").stat().st_mtime_ns == written
    # more epochs asked for: the same folder continues from its checkpoint
    longer = config(tmp_path / "a", epochs=3)
    assert run_specs([RunSpec("a", longer)], LocalBackend(workers=1))[0].status == "finished"
    assert metrics(longer.out) == sequential(tmp_path, [longer])[0]


def test_folders_are_checked_before_anything_runs(tmp_path):
    run_specs([RunSpec("a", config(tmp_path / "a"))], LocalBackend(workers=1))
    with pytest.raises(ConfigError, match="already hold"):
        check_specs([RunSpec("a", config(tmp_path / "a"), policy="new")])
    with pytest.raises(ConfigError, match=r"lr \(resolved\): 0.05 vs 0.01.*another configuration"):
        check_specs([RunSpec("a", config(tmp_path / "a", lr=0.01))])
    with pytest.raises(ConfigError, match="share the run folder"):
        check_specs([RunSpec("a", config(tmp_path / "b")), RunSpec("b", config(tmp_path / "b"))])
    with pytest.raises(ConfigError, match="share the name"):
        check_specs([RunSpec("a", config(tmp_path / "b")), RunSpec("a", config(tmp_path / "c"))])
    # overwrite replaces a run whatever its configuration
    replaced = run_specs(
        [RunSpec("a", config(tmp_path / "a", lr=0.01), policy="overwrite")], LocalBackend(1)
    )
    assert replaced[0].status == "finished"
    assert json.loads((tmp_path / "a" / "config.json").read_text())["lr"] == 0.01


def test_a_run_is_compared_by_the_rate_schedule_and_options_it_used(tmp_path, monkeypatch):
    from stratify.stratify import Stratify, StratifyOptions

    # default rate, schedule and options, recorded as the run resolved them
    taken = config(tmp_path / "a", lr=None, options={})
    run_specs([RunSpec("a", taken)], LocalBackend(workers=1))
    used = json.loads((tmp_path / "a" / "config.json").read_text())["resolved"]
    assert folder_state(taken).differences == ()
    # naming the values it got as defaults is the same configuration
    named = config(
        tmp_path / "a",
        lr=used["lr"],
        lr_schedule=used["lr_schedule"],
        options={"chunk": used["options"]["chunk"]},
    )
    assert folder_state(named).differences == ()
    # a default that moved since makes it another configuration, not a finished run
    other = "inverse-epoch" if used["lr_schedule"] == "constant" else "constant"
    rates = dataclasses.replace(Stratify.card.rates, schedule=other, mode_schedules={})
    monkeypatch.setattr(Stratify, "card", dataclasses.replace(Stratify.card, rates=rates))
    assert folder_state(taken).differences == (
        f"lr_schedule (resolved): {used['lr_schedule']!r} vs {other!r}",
    )
    with pytest.raises(ConfigError, match="lr_schedule .resolved.*another configuration"):
        check_specs([RunSpec("a", taken)])
    monkeypatch.undo()

    @dataclasses.dataclass
    class Moved(StratifyOptions):
        chunk: int = used["options"]["chunk"] + 1

    monkeypatch.setattr(Stratify, "options_class", Moved)
    assert [d.split(":")[0] for d in folder_state(taken).differences] == [
        "options.chunk (resolved)"
    ]


def test_a_diverging_run_is_an_outcome_not_a_crash(tmp_path):
    outcome = execute(RunSpec("hot", config(tmp_path / "hot", lr=1e6, epochs=3)))
    assert outcome.status == "diverged"
    assert "non-finite" in outcome.message
    assert outcome.epochs_done < 3


def test_a_bad_run_fails_alone(tmp_path):
    good = config(tmp_path / "good", epochs=1)
    bad = config(tmp_path / "bad", epochs=1, dataset="mnist-10k", data_dir=str(tmp_path))
    outcomes = run_specs([RunSpec("bad", bad), RunSpec("good", good)], LocalBackend(1))
    assert [o.status for o in outcomes] == ["failed", "finished"]
    assert "mnist" in outcomes[0].message


def test_fixed_splits_load_once_for_every_seed():
    assert not dataset_uses_seed("digits") and dataset_uses_seed("synthetic")
    for name in ("digits", "synthetic"):
        a, b = load_dataset(name, seed=0), load_dataset(name, seed=1)
        same = torch.equal(a.x_train, b.x_train) and torch.equal(a.x_test, b.x_test)
        assert same is not dataset_uses_seed(name)
    cache = DatasetCache()
    digits = [cache.load(config("x", seed=seed, device="cpu")) for seed in (0, 1)]
    assert digits[0] is digits[1]
    generated = [
        cache.load(config("x", seed=seed, dataset="synthetic", device="cpu")) for seed in (0, 1)
    ]
    assert generated[0] is not generated[1]
    assert cache.load(config("x", seed=1, dataset="synthetic", device="cpu")) is generated[1]


def test_train_seeds_refusals(capsys):
    cases = [
        (["--seeds", "0,1", "--seed", "3"], "not both"),
        (["--workers", "2"], "--workers applies to --seeds"),
        (["--seeds", "0,0"], "seed 0 twice"),
        (["--seeds", "a,b"], "comma-separated seeds"),
        (["--seeds", "0,1", "--workers", "0"], "--workers must be a positive integer"),
    ]
    for flags, message in cases:
        with pytest.raises(SystemExit) as stop:
            main(["train", "--no-secure", *flags])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1


def test_train_seeds_writes_one_folder_per_seed(tmp_path, capsys):
    out = tmp_path / "many"
    main(
        [
            "train",
            "--partition",
            "classes:2",
            "--lr",
            "0.05",
            "--no-secure",
            "--epochs",
            "1",
            "--repeat-count",
            "40",
            "--seeds",
            "2,5",
            "--workers",
            "1",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["seed-2", "seed-5"]
    assert json.loads((out / "seed-5" / "config.json").read_text())["seed"] == 5
    assert "mean ± std over 2 seeds" in printed
    with pytest.raises(SystemExit) as stop:  # the folders hold runs now
        main(["train", "--no-secure", "--epochs", "1", "--seeds", "2,5", "--out", str(out)])
    assert stop.value.code == 2


def test_outcomes_and_events_cross_process_boundaries():
    import pickle

    spec = RunSpec("x", config("somewhere"))
    for item in (spec, RunEvent("x", "epoch", 1, 2, 0.5), RunOutcome("x", "finished")):
        assert pickle.loads(pickle.dumps(item)) == item


def test_ray_backend_without_ray_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    backend = make_backend("ray")
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[ray\]'"):
        backend.run([RunSpec("a", config(tmp_path / "a"))], lambda item: None)


def test_board_counts_runs_done_running_and_left():
    from rich.console import Console

    from stratify.cli.board import RunBoard

    board = RunBoard(Console(width=120), "grid", [(f"r{i}", 2) for i in range(4)], rows=3)
    board(RunEvent("r0", "start", 0, 2))
    board(RunEvent("r0", "epoch", 1, 2, accuracy=0.5))
    board(RunEvent("r1", "start", 0, 2))
    board(RunOutcome("r1", "diverged", "non-finite", 1, 0.25, 1))
    board(RunOutcome("r2", "skipped", "", 2, 0.75, 2))
    assert board.counts() == {"running": 1, "diverged": 1, "skipped": 1, "waiting": 1}
    header = board.header().plain
    assert "done 1 · running 1 · left 1" in header and "diverged 1" in header
    assert [line.name for line in board.shown()] == ["r0", "r1", "r2"]  # rows=3 of 4
    assert board.lines["r0"].best == 0.5 and board.lines["r1"].best == 0.25
