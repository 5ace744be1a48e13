"""The deployed server app's run configuration (``timeout``, ``retries``, ``config``,
``result-dir``, ``on-lost``) is checked before any message is sent: a bad value is one
``ConfigError`` line, in the log and in ``failure.json``, never a raw Python exception
or a run that waits for ever (docs/flower.md, "A client that does not answer")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the Flower apps need the flower extra")

from flwr.app import Context, RecordDict  # noqa: E402

from stratify.config import TrainConfig  # noqa: E402
from stratify.errors import ConfigError  # noqa: E402
from stratify.flower import apps  # noqa: E402
from stratify.flower.messages import config_json  # noqa: E402

CONFIG = config_json(
    TrainConfig(
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
)
FEDAVG = config_json(
    TrainConfig(
        dataset="digits",
        clients=3,
        partition="iid",
        mode="batch",
        algorithm="fedavg",
        epochs=1,
        secure=False,
        device="cpu",
    )
)

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
        {"on-lost": "drop", "config": FEDAVG},
        "Stratify's batch mode only",
    ),
    "config garbage": ({"config": "{not json"}, "config is not valid JSON"),
    "config deep": ({"config": "[" * 100_000 + "]" * 100_000}, "config is not valid JSON"),
    "config a list": ({"config": "[1, 2]"}, "config must be a JSON object"),
    "config a number": ({"config": 3}, "config must be JSON text"),
    "config unknown key": (
        {"config": '{"epochs": 1, "nosuch": 2}'},
        "config has no setting 'nosuch'",
    ),
    "config bad value": ({"config": '{"epochs": -1}'}, "--epochs must be a positive integer"),
    "config missing": ({"config": None}, "has no config"),
    "key unknown": ({"timout": 5.0}, "has no key 'timout'"),
}


def settings(changes: dict, result_dir: str | None) -> dict:
    """A valid run configuration with ``changes`` (a ``None`` value removes the key)."""
    values = {"config": CONFIG, "result-dir": result_dir, **changes}
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
    values = {"config": CONFIG, "result-dir": result_dir}
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
        apps.server_main(SilentGrid(), context({"config": CONFIG}))  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
