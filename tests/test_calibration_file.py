"""A grid's calibration.json is read back trusting nothing in it: a damaged file is
calibrated again and replaced atomically, something else in its place (a folder, a FIFO)
is refused in one line before any calibration (docs/architecture.md, "Reproducing the
papers")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from test_reproduce import TINY

from stratify.errors import OutputError
from stratify.reproduce.estimate import CALIBRATION_FILE, load_costs, machine

SIZES = {"fedavg": 1, "stratify": 2}
MEASURED = (2.0, 1.5, 1.0)


def stored(kinds: object) -> bytes:
    return json.dumps({"machine": machine(), "kinds": kinds}).encode()


GOOD = {"group": 1, "epochs": [3.0, 2.0, 1.0]}
DAMAGED = [
    ("not UTF-8", b"\xff\xfe{"),
    ("not JSON", b'{"machine": '),
    ("a list", b"[]"),
    ("kinds a list", stored([])),
    ("epochs a string", stored({"fedavg": {"group": 1, "epochs": "abc"}})),
    ("epochs null", stored({"fedavg": {"group": 1, "epochs": None}})),
    ("epochs empty", stored({"fedavg": {"group": 1, "epochs": []}})),
    ("a NaN cost", b'{"kinds": {"fedavg": {"group": 1, "epochs": [NaN]}}}'),
    ("a 1e308 cost", stored({"fedavg": {"group": 1, "epochs": [1e308]}})),
    ("a negative cost", stored({"fedavg": {"group": 1, "epochs": [-5.0]}})),
    ("a boolean group", stored({"fedavg": {"group": True, "epochs": [1.0]}})),
    ("a huge integer", stored({"fedavg": {"group": 1, "epochs": [10**400]}})),
]


@pytest.mark.parametrize(("case", "content"), DAMAGED, ids=[case for case, _ in DAMAGED])
def test_a_damaged_calibration_is_measured_again_and_replaced(tmp_path, case, content):
    path = tmp_path / CALIBRATION_FILE
    path.write_bytes(content)
    asked = []

    def calibrate(kind: str) -> tuple[float, ...]:
        asked.append(kind)
        return MEASURED

    costs, measured, unmeasured = load_costs(tmp_path, SIZES, calibrate)
    assert measured == asked and "fedavg" in measured and not unmeasured
    assert costs["fedavg"].epochs == MEASURED
    saved = json.loads(path.read_text())  # replaced by a valid file
    assert saved["kinds"]["fedavg"] == {"group": 1, "epochs": list(MEASURED)}
    assert not list(tmp_path.glob(".tmp-*"))  # written atomically: no temporary left


def test_a_valid_calibration_is_reused(tmp_path):
    (tmp_path / CALIBRATION_FILE).write_bytes(
        stored({"fedavg": GOOD, "stratify": {**GOOD, "group": 2}})
    )
    costs, measured, _ = load_costs(tmp_path, SIZES, lambda kind: pytest.fail("calibrated"))
    assert measured == [] and costs["stratify"].epochs == (3.0, 2.0, 1.0)


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_something_else_in_its_place_is_refused_before_calibrating(tmp_path, kind):
    path = tmp_path / CALIBRATION_FILE
    path.mkdir() if kind == "folder" else os.mkfifo(path)
    with pytest.raises(OutputError, match="where the grid keeps its calibration"):
        load_costs(tmp_path, SIZES, lambda kind: pytest.fail("calibrated first"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_the_dry_run_with_a_fifo_or_folder_calibration_ends_at_once(tmp_path, kind):
    out = tmp_path / "grid"
    out.mkdir()
    path = out / CALIBRATION_FILE
    path.mkdir() if kind == "folder" else os.mkfifo(path)
    script = (
        "import sys; from stratify.reproduce.grids import GRIDS; "
        "from test_reproduce import TINY; GRIDS['tiny'] = TINY; "
        "from stratify.cli.main import main; main(sys.argv[1:])"
    )
    assert TINY is not None
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", script, "reproduce", "tiny", "--out", str(out), "--dry-run"]
        + ["--seeds", "0", "--epochs", "1"],
        capture_output=True,
        timeout=120,
        cwd=os.path.dirname(__file__),
    )
    err = result.stderr.decode().strip()
    assert result.returncode == 2, err
    last = err.splitlines()[-1]  # after the dry run's count of runs
    assert last.startswith("error: ") and "where the grid keeps its calibration" in last
    assert "calibrating" not in result.stdout.decode()
    assert time.monotonic() - start < 60


def test_a_calibration_from_another_machine_is_measured_again(tmp_path):
    other = {**machine(), "cores": machine()["cores"] + 1}
    content = {"machine": other, "kinds": {"fedavg": GOOD, "stratify": {**GOOD, "group": 2}}}
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps(content))
    costs, measured, _ = load_costs(tmp_path, SIZES, lambda kind: MEASURED)
    assert measured == ["fedavg", "stratify"] and costs["fedavg"].epochs == MEASURED
    saved = json.loads((tmp_path / CALIBRATION_FILE).read_text())
    assert saved["machine"] == machine()


def test_a_kind_calibrated_for_another_group_size_is_measured_again(tmp_path):
    # stratify's runs step in groups of 2 now; its stored cost was for groups of 3
    (tmp_path / CALIBRATION_FILE).write_bytes(
        stored({"fedavg": GOOD, "stratify": {**GOOD, "group": 3}})
    )
    costs, measured, _ = load_costs(tmp_path, SIZES, lambda kind: MEASURED)
    assert measured == ["stratify"] and costs["stratify"].epochs == MEASURED
    assert costs["fedavg"].epochs == tuple(GOOD["epochs"])
    saved = json.loads((tmp_path / CALIBRATION_FILE).read_text())
    assert saved["kinds"]["stratify"] == {"group": 2, "epochs": list(MEASURED)}
