"""Runs end to end: output files, determinism, resume, refusals, non-finite loss."""

import dataclasses
import json

import pytest
import torch
from engines import client_data

from stratify.algorithms import ALGORITHMS
from stratify.cli.main import main
from stratify.errors import ConfigError, OutputError, StratifyError, TrainingError
from stratify.registry import SECRETS_FILE, RegistrySecrets
from stratify.run import Run, TrainConfig

FAST = {"repeat_count": 40}  # 400 steps per epoch on digits


def config(tmp_path, name="run", **changes):
    values = dict(
        dataset="digits",
        partition="classes:2",
        clients=10,
        epochs=2,
        lr=0.05,
        secure=False,
        options=dict(FAST),
        out=str(tmp_path / name),
    )
    values.update(changes)
    return TrainConfig(**values)


def read_metrics(path):
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("wall_seconds")
    return rows


def test_run_writes_its_output_files(tmp_path):
    summary = Run(config(tmp_path)).train()
    out = tmp_path / "run"
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint.pt",
        "config.json",
        "metrics.jsonl",
        "summary.json",
    ]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [1, 2]
    assert set(rows[0]) == {
        "epoch",
        "test_accuracy",
        "test_loss",
        "train_loss",
        "steps",
        "transfers",
        "bytes_sent",
        "skipped",
        "wall_seconds",
        "reused",
        "worst_group_accuracy",
        "validation_accuracy",
        "validation_loss",
        "sample_gradients",
        "clients_trained",
        "info",
    }
    labels = json.loads((out / "config.json").read_text())["resolved"]["num_placeholders"]
    assert rows[0]["steps"] + rows[0]["skipped"] == 40 * labels
    saved = json.loads((out / "summary.json").read_text())
    assert saved == summary
    assert saved["best_accuracy"] == max(row["test_accuracy"] for row in rows)
    # two epochs: the last-rounds window is both of them
    accuracies = [row["test_accuracy"] for row in rows]
    assert saved["final_accuracy"] == accuracies[-1] and saved["last_rounds"] == 2
    assert saved["last_mean_accuracy"] == pytest.approx(sum(accuracies) / 2)
    assert saved["last_std_accuracy"] == pytest.approx(abs(accuracies[0] - accuracies[1]) / 2**0.5)
    assert saved["best_val_epoch"] is None and saved["test_accuracy_at_best_val"] is None
    assert json.loads((out / "config.json").read_text())["versions"]["torch"] == torch.__version__


def test_same_seed_gives_identical_metrics(tmp_path):
    Run(config(tmp_path, "a")).train()
    Run(config(tmp_path, "b")).train()
    Run(config(tmp_path, "c", seed=1)).train()
    assert read_metrics(tmp_path / "a") == read_metrics(tmp_path / "b")
    assert read_metrics(tmp_path / "a") != read_metrics(tmp_path / "c")


@pytest.mark.parametrize("mode", ["single-sample", "batch"])
def test_resume_equals_uninterrupted_run(tmp_path, mode):
    # momentum: the global optimizer's state must travel in the checkpoint
    changes = {"mode": mode, "epochs": 4, "options": {**FAST, "momentum": 0.5}}
    if mode == "batch":
        changes["options"]["batch_labels"] = 16
    Run(config(tmp_path, "straight", **changes)).train()
    Run(config(tmp_path, "pieces", **{**changes, "epochs": 2})).train()
    Run(config(tmp_path, "pieces", **changes), resume=True).train()
    assert read_metrics(tmp_path / "pieces") == read_metrics(tmp_path / "straight")
    straight = json.loads((tmp_path / "straight" / "summary.json").read_text())
    pieces = json.loads((tmp_path / "pieces" / "summary.json").read_text())
    straight.pop("total_wall_seconds")
    pieces.pop("total_wall_seconds")
    assert straight == pieces


def final_weights(out):
    return torch.load(out / "checkpoint.pt", weights_only=True)["model"]


def test_resume_restores_the_torch_generator_a_method_draws_from(tmp_path, monkeypatch):
    # the server adds noise drawn from torch's generator every round: without its state,
    # a resumed run would draw round 2's noise again in round 3
    monkeypatch.setitem(ALGORITHMS, "noisy-fedavg", "toy_methods:NoisyFedAvg")
    changes = {"algorithm": "noisy-fedavg", "mode": "batch", "epochs": 3, "partition": "iid"}
    changes.update(clients=4, options={"local_epochs": 1})
    Run(config(tmp_path, "straight", **changes)).train()
    Run(config(tmp_path, "pieces", **{**changes, "epochs": 2})).train()
    Run(config(tmp_path, "pieces", **changes), resume=True).train()
    assert read_metrics(tmp_path / "pieces") == read_metrics(tmp_path / "straight")
    straight, pieces = final_weights(tmp_path / "straight"), final_weights(tmp_path / "pieces")
    assert all(torch.equal(pieces[key], straight[key]) for key in straight)


def test_metrics_count_the_entries_trained_again_after_a_refill(tmp_path):
    # one client holding label 0 twice and label 1 six times; uniform repeats schedule
    # each label round(8 / 2) = 4 times an epoch, so label 0's last two entries of every
    # epoch train its two samples again
    dataset, _ = client_data((8,), [[0, 0, 1, 1, 1, 1, 1, 1]])
    out = tmp_path / "run"
    Run(config(tmp_path, partition="iid", clients=1, options={}), dataset=dataset).train()
    rows = read_metrics(out)
    assert [(row["steps"], row["reused"], row["skipped"]) for row in rows] == [(8, 2, 0)] * 2


def test_existing_run_is_refused_without_overwrite(tmp_path):
    Run(config(tmp_path, epochs=1)).train()
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(OutputError, match="already holds a run"):
        Run(config(tmp_path, epochs=1))
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before
    Run(config(tmp_path, epochs=1, seed=3), overwrite=True).train()
    assert json.loads((tmp_path / "run" / "config.json").read_text())["seed"] == 3


def test_resume_refusals(tmp_path):
    with pytest.raises(OutputError, match="no run in .*empty; start without --resume"):
        Run(config(tmp_path, "empty"), resume=True)
    Run(config(tmp_path, epochs=1)).train()
    with pytest.raises(ConfigError, match="other settings .*lr .resolved.: 0.05 vs 0.1"):
        Run(config(tmp_path, epochs=2, lr=0.1), resume=True)
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="unreadable"):
        Run(config(tmp_path, epochs=2), resume=True)


def test_resume_continues_with_the_settings_the_run_used(tmp_path, monkeypatch):
    from stratify.stratify import Stratify

    Run(config(tmp_path, "moved", epochs=1)).train()
    used = json.loads((tmp_path / "moved" / "config.json").read_text())["resolved"]
    other = "inverse-epoch" if used["lr_schedule"] == "constant" else "constant"
    rates = dataclasses.replace(Stratify.card.rates, schedule=other, mode_schedules={})
    monkeypatch.setattr(Stratify, "card", dataclasses.replace(Stratify.card, rates=rates))
    # the default schedule moved since: resuming would switch schedules mid-run
    with pytest.raises(ConfigError, match=f"lr_schedule .resolved.: '{used['lr_schedule']}'"):
        Run(config(tmp_path, "moved", epochs=2), resume=True)
    # naming the schedule it used continues it, as an uninterrupted run of that schedule
    Run(config(tmp_path, "moved", epochs=2, lr_schedule=used["lr_schedule"]), resume=True).train()
    Run(config(tmp_path, "straight", epochs=2, lr_schedule=used["lr_schedule"])).train()
    assert read_metrics(tmp_path / "moved") == read_metrics(tmp_path / "straight")


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    def poison(record):
        if record.epoch == 1:
            with torch.no_grad():
                for parameter in run.engine.model.parameters():
                    parameter.fill_(float("nan"))

    run = Run(config(tmp_path, epochs=3), on_epoch=poison)
    with pytest.raises(TrainingError, match=r"non-finite.*epoch 1\) is kept") as error:
        run.train()
    # Stratify's step sizes: the learning rate and its global optimizer's momentum
    assert str(error.value).endswith("try lower values of --lr / --momentum")
    checkpoint = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert checkpoint["epoch"] == 1
    assert all(
        torch.isfinite(v).all() for v in checkpoint["model"].values() if v.is_floating_point()
    )
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--chunk", "0"], "--chunk must be a positive integer"),
        (["--mode", "batch", "--batch-labels", "0"], "--batch-labels must be a positive integer"),
        (["--mode", "batch", "--chunk", "5"], "--chunk applies to --mode single-sample"),
        (["--dataset", "nope"], "unknown dataset 'nope'"),
        (["--partition", "classes:x"], "classes:x"),
        (["--epochs", "0"], "--epochs must be a positive integer"),
        (["--partition", "classes:1", "--clients", "5"], "held by no client"),
        (["--clients", "5000"], "5000 clients but only 1437 training samples"),
    ],
)
def test_train_cli_bad_input_is_one_line(tmp_path, capsys, arguments, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--no-secure", "--out", str(tmp_path / "x"), *arguments])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert "Traceback" not in err[0]


def test_train_cli_runs_and_resumes(tmp_path, capsys):
    out = str(tmp_path / "cli")
    common = ["train", "--no-secure", "--repeat-count", "30", "--out", out, "--chunk", "5"]
    main([*common, "--epochs", "1"])
    main([*common, "--epochs", "2", "--resume"])
    assert "best accuracy" in capsys.readouterr().out
    rows = [
        json.loads(line) for line in (tmp_path / "cli" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [row["epoch"] for row in rows] == [1, 2]


@pytest.mark.parametrize("protocol", ["packed", "naive"])
def test_secure_registry_learns_exactly_like_the_plain_one_given_its_secrets(tmp_path, protocol):
    Run(
        config(
            tmp_path, "secure", epochs=1, partition="dirichlet:0.5", secure=True, protocol=protocol
        )
    ).train()
    saved = (tmp_path / "secure" / SECRETS_FILE).read_bytes()
    secrets = RegistrySecrets.from_bytes(saved, SECRETS_FILE)
    Run(config(tmp_path, "plain", epochs=1, partition="dirichlet:0.5"), secrets=secrets).train()
    assert read_metrics(tmp_path / "secure") == read_metrics(tmp_path / "plain")


def test_failed_set_up_leaves_out_untouched(tmp_path):
    Run(config(tmp_path, epochs=1)).train()
    before = sorted((p.name, p.read_bytes()) for p in (tmp_path / "run").iterdir())
    with pytest.raises(StratifyError):
        Run(config(tmp_path, epochs=1, partition="classes:99"), overwrite=True)
    assert sorted((p.name, p.read_bytes()) for p in (tmp_path / "run").iterdir()) == before
    with pytest.raises(StratifyError):
        Run(config(tmp_path, "fresh", dataset="mnist-10k", data_dir=str(tmp_path / "none")))
    assert not (tmp_path / "fresh").exists()


def test_train_takes_dataset_options_and_the_data_dir_variable(tmp_path, capsys, monkeypatch):
    out = tmp_path / "synthetic"
    main(
        ["train", "--dataset", "synthetic", "-o", "n_train=300", "-o", "n_test=50"]
        + ["--partition", "iid", "--epochs", "1", "--no-secure", "--out", str(out)]
    )
    config = json.loads((out / "config.json").read_text())
    assert config["dataset_options"] == {"n_train": "300", "n_test": "50"}
    rows = (out / "metrics.jsonl").read_text().splitlines()
    first = json.loads(rows[0])
    # 300 training samples: 10 labels × round(300 / 10) schedule entries, each trained or
    # skipped (a label whose samples ran out)
    assert first["steps"] + first["skipped"] == 300
    capsys.readouterr()  # the successful run's progress display

    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--dataset", "synthetic", "-o", "n_trian=300", "--out", str(tmp_path / "x")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "n_trian" in err and "n_train" in err, err

    monkeypatch.setenv("STRATIFY_DATA_DIR", str(tmp_path / "no-data-here"))
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--dataset", "mnist-10k", "--out", str(tmp_path / "y")])
    assert exit_info.value.code == 2
    assert str(tmp_path / "no-data-here") in capsys.readouterr().err


class _RunsCode:
    """Unpickling this calls ``marker.touch()``: what a crafted checkpoint would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (self.marker,))


def test_resume_never_runs_code_from_a_crafted_checkpoint(tmp_path):
    Run(config(tmp_path, epochs=1)).train()
    marker = tmp_path / "code-ran"
    torch.save(
        {"config": {}, "epoch": 1, "payload": _RunsCode(marker)}, tmp_path / "run" / "checkpoint.pt"
    )
    with pytest.raises(ConfigError, match="checkpoint.pt is unreadable"):
        Run(config(tmp_path, epochs=2), resume=True)
    assert not marker.exists()


def test_resume_refuses_a_checkpoint_that_does_not_fit_the_model(tmp_path):
    Run(config(tmp_path, epochs=1)).train()
    path = tmp_path / "run" / "checkpoint.pt"
    checkpoint = torch.load(path, weights_only=True)
    key = next(iter(checkpoint["model"]))
    checkpoint["model"][key] = torch.zeros(3, 3)
    torch.save(checkpoint, path)
    with pytest.raises(ConfigError) as error:
        Run(config(tmp_path, epochs=2), resume=True)
    message = str(error.value)
    assert message.startswith(f"checkpoint refused: model.{key} is (3, 3)") and "\n" not in message


def test_default_run_folders_differ_within_one_second_and_empty_out_is_refused(tmp_path):
    from stratify.cli.train import default_out

    config_ = TrainConfig()
    names = {default_out(config_) for _ in range(50)}
    assert len(names) == 50 and all(name.startswith("runs/") for name in names)
    with pytest.raises(OutputError, match="--out needs a folder name"):
        Run(TrainConfig(out=""))


def test_metrics_lines_are_strict_json_even_for_a_non_finite_value():
    from stratify.run import EpochRecord, record_line

    record = EpochRecord(1, 0.5, float("nan"), float("inf"), 10, 2, 100, 0, 0.1)

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    row = json.loads(record_line(record), parse_constant=refuse)
    assert row["test_loss"] is None and row["train_loss"] is None and row["steps"] == 10
