"""A secure run's registry secrets: drawn once, kept in the run folder, used on --resume.

docs/architecture.md, "Privacy": the placeholders of a secure run come from the clients'
secrets, not from ``--seed``; ``--resume`` and a rerun from the saved secrets are exact,
and a missing or damaged secrets file is refused without touching the run.
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from stratify.cli.main import main
from stratify.registry import SECRETS_FILE, RegistrySecrets
from stratify.run import Run, TrainConfig

TRAIN = ["train", "--dataset", "digits", "--partition", "dirichlet:0.5", "--clients", "8"]
TRAIN += ["--repeat-count", "20", "--lr", "0.05", "--secure", "--protocol", "packed-blind"]


def secure_config(tmp_path, name, epochs):
    return TrainConfig(
        dataset="digits",
        partition="dirichlet:0.5",
        clients=8,
        epochs=epochs,
        lr=0.05,
        secure=True,
        options={"repeat_count": 20},
        out=str(tmp_path / name),
    )


def metrics(folder):
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("wall_seconds")
    return rows


def saved_secrets(folder) -> RegistrySecrets:
    return RegistrySecrets.from_bytes((folder / SECRETS_FILE).read_bytes(), SECRETS_FILE)


def test_resume_and_a_rerun_from_the_saved_secrets_are_exact(tmp_path):
    first = Run(secure_config(tmp_path, "first", epochs=1))
    first.train()
    secrets = saved_secrets(tmp_path / "first")
    # the same seed without the secrets gives other placeholders: the seed is public
    other = Run(secure_config(tmp_path, "other", epochs=1))
    assert saved_secrets(tmp_path / "other") != secrets
    assert other.placeholders.client_maps != first.placeholders.client_maps
    other.close()

    resumed = Run(secure_config(tmp_path, "first", epochs=2), resume=True)
    assert resumed.placeholders.client_maps == first.placeholders.client_maps
    resumed.train()
    rerun = Run(secure_config(tmp_path, "rerun", epochs=2), secrets=secrets)
    rerun.train()
    assert metrics(tmp_path / "rerun") == metrics(tmp_path / "first")
    assert saved_secrets(tmp_path / "first") == secrets  # resuming kept the file as it was


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda path: path.unlink(), "client_secrets.json is missing"),
        (lambda path: path.write_text("{not json"), "does not hold the run's registry secrets"),
        (
            lambda path: path.write_text('{"format": 1, "secret": "abcd"}'),
            "does not hold the run's registry secrets",
        ),
        (lambda path: (path.unlink(), path.mkdir()), "is a folder, not a regular file"),
    ],
)
def test_resume_without_intact_secrets_is_one_line_and_changes_nothing(
    tmp_path, capsys, damage, message
):
    out = tmp_path / "run"
    main([*TRAIN, "--epochs", "1", "--out", str(out)])
    damage(out / SECRETS_FILE)
    before = {path.name: path.read_bytes() if path.is_file() else None for path in out.iterdir()}
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([*TRAIN, "--epochs", "2", "--out", str(out), "--resume"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "--resume" in err[0], err
    after = {path.name: path.read_bytes() if path.is_file() else None for path in out.iterdir()}
    assert after == before


def test_a_plain_run_writes_no_secrets_and_resumes_without_them(tmp_path, capsys):
    out = tmp_path / "plain"
    plain = [arg if arg != "--secure" else "--no-secure" for arg in TRAIN]
    main([*plain, "--epochs", "1", "--out", str(out)])
    assert not (out / SECRETS_FILE).exists()
    main([*plain, "--epochs", "2", "--out", str(out), "--resume"])
    assert [row["epoch"] for row in metrics(out)] == [1, 2]


def test_train_with_client_secrets_repeats_a_secure_run_exactly(tmp_path, capsys):
    first, again, other = tmp_path / "first", tmp_path / "again", tmp_path / "other"
    main([*TRAIN, "--epochs", "1", "--out", str(first)])
    main([*TRAIN, "--epochs", "1", "--out", str(other)])
    main(
        [
            *TRAIN,
            "--epochs",
            "1",
            "--out",
            str(again),
            "--client-secrets",
            str(first / SECRETS_FILE),
        ]
    )
    assert metrics(again) == metrics(first)
    assert (again / SECRETS_FILE).read_bytes() == (first / SECRETS_FILE).read_bytes()
    # without them the same command draws other secrets (the seed is public)
    assert (other / SECRETS_FILE).read_bytes() != (first / SECRETS_FILE).read_bytes()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "is missing"),
        ("{not json", "does not hold the run's registry secrets"),
        # nested past the interpreter's stack: a RecursionError, "a bug", before
        ("[" * 4000, "does not hold the run's registry secrets"),
    ],
)
def test_bad_client_secrets_is_one_line_and_writes_nothing(tmp_path, capsys, content, message):
    secrets_file = tmp_path / "secrets.json"
    if content is not None:
        secrets_file.write_text(content)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main([*TRAIN, "--epochs", "1", "--out", str(out), "--client-secrets", str(secrets_file)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "--client-secrets" in err[0], err
    assert not out.exists()


def test_every_secrets_file_a_run_writes_is_its_owner_s_alone(tmp_path, capsys):
    # the default run: digits with the encrypted (CKKS) registry, so a secure run
    first, copy = tmp_path / "first", tmp_path / "copy"
    main(["train", "--dataset", "digits", "--epochs", "1", "--out", str(first)])
    main(["train", "--dataset", "digits", "--epochs", "1", "--out", str(copy),
          "--client-secrets", str(first / SECRETS_FILE)])  # fmt: skip
    for folder in (first, copy):
        assert stat.S_IMODE(os.stat(folder / SECRETS_FILE).st_mode) == 0o600, folder
    # the other run files keep a new file's mode under the umask
    assert stat.S_IMODE(os.stat(first / "config.json").st_mode) & 0o044


def test_client_secrets_inside_the_folder_overwritten_is_refused_before_anything_goes(
    tmp_path, capsys
):
    run = tmp_path / "run"
    main([*TRAIN, "--epochs", "1", "--out", str(run)])
    before = {path.name: path.read_bytes() for path in run.iterdir()}
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([*TRAIN, "--epochs", "1", "--out", str(run), "--overwrite",
              "--client-secrets", str(run / SECRETS_FILE)])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--client-secrets file of this run" in err[0], err
    assert {path.name: path.read_bytes() for path in run.iterdir()} == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run"]  # no staging left
