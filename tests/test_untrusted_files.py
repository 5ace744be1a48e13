"""No file the toolkit reads can run code: a pickle payload put in place of every data
file of every dataset folder format (and of a stream's .npy features and a checkpoint)
is refused in one line and creates nothing (docs/architecture.md, "Getting data")."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from streams import FLAGS, event_line

from stratify.cli.main import main
from stratify.data.datasets import load_dataset
from stratify.data.sources import sources
from stratify.errors import StratifyError


class Payload:
    """Unpickling it creates ``marker``: proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def payload(marker: Path) -> bytes:
    return pickle.dumps(Payload(str(marker)))


def plant(root: Path, relative: str, data: bytes) -> None:
    """``data`` at ``relative``; a folder entry (no suffix in its name) gets it in the
    file names its loader looks for below it."""
    path = root / relative
    if (
        "." in path.name
        or path.name.endswith(("_py3", "ubyte"))
        or path.parent.name.endswith(("-py", "-python"))
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return
    for below in ("c/images/p.JPEG", "c/p.jpg", "c/p.png", "train/c/p.png", "val/c/p.png"):
        (path / below).parent.mkdir(parents=True, exist_ok=True)
        (path / below).write_bytes(data)


FILE_DATASETS = [name for name, item in sources().items() if item.kind == "files"]


@pytest.mark.parametrize("name", FILE_DATASETS)
def test_a_pickle_payload_in_a_data_folder_runs_nothing(tmp_path, name):
    marker = tmp_path / "marker"
    data = tmp_path / "data"
    for layout in sources()[name].layouts:
        for entry in layout:
            for relative in entry:
                plant(data, relative, payload(marker))
    # scikit-learn's old covtype cache: a pickle the toolkit used to unpickle
    for relative in ("covertype/samples_py3", "covertype/targets_py3"):
        plant(data, relative, payload(marker))
    with pytest.raises(StratifyError) as caught:
        load_dataset(name, data_dir=str(data))
    assert "\n" not in str(caught.value)
    assert not marker.exists()


def test_a_pickled_npy_feature_file_and_checkpoint_run_nothing(tmp_path, capsys):
    marker = tmp_path / "marker"
    array = np.empty(2, dtype=object)
    array[:] = [Payload(str(marker)), 1]
    root = tmp_path / "files"  # the run folder is not under it: outputs never are
    root.mkdir()
    np.save(root / "rows.npy", array, allow_pickle=True)
    source = tmp_path / "events.jsonl"
    rng = np.random.default_rng(0)
    lines = [event_line(number, rng) for number in range(1, 6)]
    lines.append(json.dumps({"client": "c0", "label": 1, "path": "rows.npy", "row": 0}))
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    main(["stream", "--source", str(source), "--files-root", str(root), "--out", str(out)] + FLAGS)
    assert "warning: line 6: cannot read" in capsys.readouterr().err
    (out / "checkpoint.pt").write_bytes(payload(marker))
    with pytest.raises(SystemExit) as exit_:
        main(["stream", "--source", str(source), "--out", str(out), "--resume", *FLAGS])
    assert exit_.value.code == 2
    assert not marker.exists()


def test_a_stream_reads_path_features_only_under_files_root(tmp_path, capsys):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    features = np.arange(5, dtype=np.float32)
    np.save(root / "inside.npy", features)
    np.save(outside / "secret.npy", features)
    (root / "link.npy").symlink_to(outside / "secret.npy")
    rng = np.random.default_rng(0)
    lines = [event_line(number, rng) for number in range(1, 6)]
    for path in ("inside.npy", "../outside/secret.npy", str(outside / "secret.npy"), "link.npy"):
        lines.append(json.dumps({"client": "c0", "label": 1, "path": path}))
    source = tmp_path / "events.jsonl"
    source.write_text("\n".join(lines) + "\n")
    main(["stream", "--source", str(source), "--files-root", str(root), *FLAGS])
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert [line.split(":")[1].strip() for line in warnings] == ["line 7", "line 8", "line 9"]
    assert all("leads outside --files-root" in line for line in warnings)
    main(["stream", "--source", str(source), *FLAGS])
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 4 and all("--files-root" in line for line in warnings)
