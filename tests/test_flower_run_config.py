"""The deployed server app's run configuration (one key per setting, ``timeout``,
``retries``, ``result-dir``, ``on-lost``) is checked before any message is sent: a bad
value is one ``ConfigError`` line, in the log and in ``failure.json``, never a raw Python
exception or a run that waits for ever (docs/flower.md, "Run configuration" and "A client
that does not answer")."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import tomllib

pytest.importorskip("flwr", reason="the Flower apps need the flower extra")

from flwr.app import Context, RecordDict  # noqa: E402

from stratify.config import TrainConfig  # noqa: E402
from stratify.errors import ConfigError  # noqa: E402
from stratify.flower import apps  # noqa: E402
from stratify.flower.run_config import (  # noqa: E402
    DEFAULT,
    run_config_of,
    train_config_of,
    train_keys,
)

APP = Path(__file__).resolve().parents[1] / "examples" / "flower"
JOB = TrainConfig(
    dataset="digits",
    clients=3,
    partition="iid",
    mode="batch",
    algorithm="stratify",
    options={"batch_labels": 128},
    epochs=1,
    secure=False,
    device="cpu",
)
CONFIG = run_config_of(JOB)

#: run configurations refused (without result-dir: the test adds it), and what the line says
REFUSED = {
    "timeout text": ({"timeout": "soon"}, "timeout must be a number"),
    "timeout bool": ({"timeout": True}, "timeout must be a number"),
    "timeout zero": ({"timeout": 0.0}, "timeout must be seconds"),
    "timeout negative": ({"timeout": -5}, "timeout must be seconds"),
    "timeout nan": ({"timeout": float("nan")}, "timeout must be seconds"),
    "timeout inf": ({"timeout": float("inf")}, "timeout must be seconds"),
    "timeout huge": ({"timeout": 1e9}, "timeout must be seconds"),
    "retries text": ({"retries": "twice"}, "retries must be a number"),
    "retries fraction": ({"retries": 1.5}, "retries must be a whole number"),
    "retries negative": ({"retries": -1}, "retries must be 0 to 10"),
    "retries huge": ({"retries": 10**9}, "retries must be 0 to 10"),
    "on-lost bogus": ({"on-lost": "bogus"}, "on-lost must be one of stop, drop"),
    "on-lost drop for fedavg": (
        {"on-lost": "drop", "algorithm": "fedavg"},
        "Stratify's batch mode only",
    ),
    "epochs zero": ({"epochs": 0}, "--epochs must be a positive integer"),
    "epochs fraction": ({"epochs": 1.5}, "--epochs must be a positive integer"),
    "epochs bool": ({"epochs": True}, "--epochs must be a positive integer"),
    "lr negative": ({"lr": -0.1}, "--lr"),
    "secure text": ({"secure": "maybe"}, "--secure must be True or False"),
    "algorithm unknown": ({"algorithm": "nosuch"}, "nosuch"),
    "algorithm not over flower": ({"algorithm": "fedtan"}, "does not run over Flower"),
    "option of the method refused": ({"stratify.batch-labels": 0}, "--batch-labels"),
    "mlp-hidden not widths": ({"mlp-hidden": "wide"}, "mlp-hidden must be widths"),
    "dataset-options not pairs": ({"dataset-options": "noequals"}, "KEY=VALUE pairs"),
    "dataset-options unknown": ({"dataset-options": "a=b"}, "digits has no option 'a'"),
    "partition unknown": ({"partition": "stripes:2"}, "stripes"),
    "key unknown": ({"timout": 5.0}, "has no key 'timout' \\(did you mean 'timeout'\\?\\)"),
    "key of the one-JSON form": ({"config": "{}"}, "has no key 'config'"),
    "option of no method": ({"stratify.nosuch": 1}, "has no key 'stratify.nosuch'"),
}


def settings(changes: dict, result_dir: str | None) -> dict:
    """A valid run configuration with ``changes`` (a ``None`` value removes the key)."""
    values = {**CONFIG, "result-dir": result_dir, **changes}
    return {key: value for key, value in values.items() if value is not None}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_check_run_config_refuses_in_one_line(case: str, tmp_path: Path) -> None:
    changes, message = REFUSED[case]
    with pytest.raises(ConfigError, match=message) as refused:
        apps.check_run_config(settings(changes, str(tmp_path / "out")))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "result_dir, message",
    [(None, "has no result-dir"), ("", "result-dir must name a folder"), (7, "must name")],
)
def test_check_run_config_refuses_a_missing_or_unusable_result_dir(
    result_dir: object, message: str
) -> None:
    values = {**CONFIG, "result-dir": result_dir}
    with pytest.raises(ConfigError, match=message):
        apps.check_run_config({key: v for key, v in values.items() if v is not None})


def test_check_run_config_refuses_a_result_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is not a folder"):
        apps.check_run_config(settings({}, str(tmp_path / "file")))


def test_check_run_config_returns_the_checked_values_and_defaults(tmp_path: Path) -> None:
    checked = apps.check_run_config(settings({}, str(tmp_path)))
    assert (checked.timeout, checked.retries, checked.on_lost) == (120.0, 1, "stop")
    assert checked.result_dir == tmp_path and checked.config.algorithm == "stratify"
    edges = {"timeout": apps.MAX_TIMEOUT, "retries": 0, "on-lost": "drop"}
    checked = apps.check_run_config(settings(edges, str(tmp_path)))
    assert (checked.timeout, checked.retries, checked.on_lost) == (86_400.0, 0, "drop")
    checked = apps.check_run_config(settings({"timeout": "2.5", "retries": 10}, str(tmp_path)))
    assert (checked.timeout, checked.retries) == (2.5, 10)


class SilentGrid:
    """A grid the server app must not touch: any use of it fails the test (``pytest.fail``
    raises past every ``except Exception``)."""

    def __getattr__(self, name: str) -> object:
        pytest.fail(f"the server app used the grid ({name}) before checking its run config")


def context(values: dict) -> Context:
    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=values)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_server_app_checks_its_run_config_before_any_message(
    case: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    changes, message = REFUSED[case]
    folder = tmp_path / "out"
    with pytest.raises(ConfigError, match=message):
        apps.server_main(SilentGrid(), context(settings(changes, str(folder))))  # type: ignore[arg-type]
    failure = json.loads((folder / "failure.json").read_text())
    assert re.search(message, failure["error"]) and "\n" not in failure["error"]
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and "\n" not in refusals[0]


def test_the_server_app_refuses_without_result_dir_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="has no result-dir"):
        apps.server_main(SilentGrid(), context(CONFIG))  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


JOBS = [
    JOB,
    dataclasses.replace(JOB, algorithm="fedavg", options={"local_epochs": 2}, lr=0.1, seed=4),
    dataclasses.replace(
        JOB, model="mlp", mlp_hidden=(64, 32), dp_epsilon=3.0, lr_schedule="constant"
    ),
    dataclasses.replace(JOB, algorithm="scaffold", options={"server_lr": 0.5}, clients=10),
]


@pytest.mark.parametrize("job", JOBS, ids=lambda job: job.algorithm)
def test_a_run_goes_through_its_keys_and_back(job: TrainConfig) -> None:
    keys = run_config_of(job)
    assert set(keys) == set(train_keys())
    assert train_config_of(keys) == job


def test_each_setting_is_its_own_key(tmp_path: Path) -> None:
    checked = apps.check_run_config(
        {**CONFIG, "epochs": 3, "lr": 0.05, "stratify.batch-labels": 64, "result-dir": "r"}
    )
    assert (checked.config.epochs, checked.config.lr) == (3, 0.05)
    assert checked.config.options == {"batch_labels": 64}
    # another method: its own options apply, the others' stay unused
    checked = apps.check_run_config(
        {**CONFIG, "algorithm": "fedavg", "fedavg.local-epochs": 2, "result-dir": "r"}
    )
    assert checked.config.algorithm == "fedavg" and checked.config.options == {"local_epochs": 2}
    # "default" is the setting's default (TOML has no null)
    assert apps.check_run_config({**CONFIG, "lr": DEFAULT, "result-dir": "r"}).config.lr is None


def flat(table: dict, prefix: str = "") -> dict:
    """A TOML table's keys as Flower flattens them (``stratify.batch-labels``)."""
    keys: dict = {}
    for key, value in table.items():
        if isinstance(value, dict):
            keys.update(flat(value, f"{prefix}{key}."))
        else:
            keys[f"{prefix}{key}"] = value
    return keys


def test_the_app_declares_every_key_and_its_job_is_the_documented_one() -> None:
    # Flower overrides only the keys an app declares: each one must be there
    project = tomllib.loads((APP / "pyproject.toml").read_text())
    declared = flat(project["tool"]["flwr"]["app"]["config"])
    assert set(declared) == set(apps.RUN_KEYS)
    checked = apps.check_run_config(declared)
    assert checked.config == dataclasses.replace(JOB, partition="dirichlet:0.5", epochs=2, seed=3)
    assert (checked.timeout, checked.retries, checked.on_lost) == (
        apps.RUN_DEFAULTS["timeout"],
        apps.RUN_DEFAULTS["retries"],
        apps.RUN_DEFAULTS["on-lost"],
    )


def test_a_refusal_only_the_grid_shows_is_written_and_fails_the_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def two_nodes_one_client(*args: object, **kwargs: object) -> None:
        raise ConfigError("two nodes are client 1: give each its partition-id")

    monkeypatch.setattr(apps, "run_on_grid", two_nodes_one_client)
    with pytest.raises(ConfigError, match="two nodes are client 1"):
        apps.server_main(SilentGrid(), context({**CONFIG, "result-dir": str(tmp_path)}))  # type: ignore[arg-type]
    failure = json.loads((tmp_path / "failure.json").read_text())
    assert failure["error"].startswith("two nodes are client 1")
