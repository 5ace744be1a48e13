"""No output of `stratify stream` under its --files-root (issue 57): the folder its events'
"path" entries are read from is an input, so a --predictions or an --out below it is
refused in one line, exit 2, with or without --overwrite, and no refusal suggests
--overwrite where the output is an input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from streams import FLAGS, event_line

from stratify.cli.main import main


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture
def stream_with_files(tmp_path: Path) -> tuple[Path, Path]:
    """A source whose events read ``root/rows.npy`` (a "path" entry), and that root."""
    root = tmp_path / "root"
    root.mkdir()
    rng = np.random.default_rng(0)
    lines = [event_line(number, rng) for number in range(1, 6)]
    features = np.asarray(json.loads(lines[0])["x"], dtype=np.float32)
    np.save(root / "rows.npy", np.stack([features, features]))
    lines += [json.dumps({"client": "c0", "label": 1, "path": "rows.npy", "row": 1})] * 3
    lines.append(json.dumps({"client": "c1", "path": "rows.npy", "row": 0}))  # a prediction
    source = tmp_path / "p.jsonl"
    source.write_text("\n".join(lines) + "\n")
    return source, root


#: case -> the output options, with ROOT for the --files-root folder
OUTPUTS = {
    "predictions onto the file the events read": ["--predictions", "ROOT/rows.npy"],
    "predictions into a new file under the root": ["--predictions", "ROOT/p.jsonl"],
    "predictions deeper under the root": ["--predictions", "ROOT/sub/../p.jsonl"],
    "out under the root": ["--out", "ROOT/run"],
    "out at the root": ["--out", "ROOT"],
}


@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
@pytest.mark.parametrize("case", OUTPUTS)
def test_an_output_under_files_root_is_refused(
    stream_with_files, tmp_path, capsys, case, overwrite
):
    source, root = stream_with_files
    (root / "sub").mkdir()
    before = snapshot(root)
    outputs = [word.replace("ROOT", str(root)) for word in OUTPUTS[case]]
    if "--out" not in outputs:
        outputs += ["--out", str(tmp_path / "run")]
    command = ["stream", "--source", str(source), "--files-root", str(root), *outputs, *FLAGS]
    with pytest.raises(SystemExit) as done:
        main(command + (["--overwrite"] if overwrite else []))
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert f"under --files-root {root}, the folder this stream's events read" in err[0]
    # the only mention of --overwrite says it changes nothing
    assert err[0].replace("(whatever --overwrite says)", "").count("--overwrite") == 0, err
    assert snapshot(root) == before
    assert sorted(path.name for path in root.iterdir()) == ["rows.npy", "sub"]
    assert not (tmp_path / "run").exists()


def test_a_run_folder_holding_an_input_is_not_offered_overwrite(
    stream_with_files, tmp_path, capsys
):
    # --out names a run folder that holds the --source: --overwrite would be refused (it
    # would delete the source), so the refusal of a new run there does not suggest it
    source, root = stream_with_files
    run = tmp_path / "run"
    main(["stream", "--source", str(source), "--files-root", str(root), "--out", str(run), *FLAGS])
    inside = run / ".events.jsonl"  # hidden: a new run refuses visible files first
    inside.write_bytes(source.read_bytes())
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(
            [
                "stream",
                "--source",
                str(inside),
                "--files-root",
                str(root),
                "--out",
                str(run),
                *FLAGS,
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1, err
    assert "already holds a run" in err[0] and "--overwrite" not in err[0], err
    with pytest.raises(SystemExit) as done:
        main(
            ["stream", "--source", str(inside), "--files-root", str(root), "--out", str(run)]
            + [*FLAGS, "--overwrite"]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1 and "would delete" in err[0], err


def test_a_bad_checkpoint_in_a_folder_holding_an_input_does_not_suggest_overwrite(
    stream_with_files, tmp_path, capsys
):
    # --resume of a damaged checkpoint suggests a fresh run with --overwrite, unless the
    # folder holds an input of the command (here the --source), which it would delete
    source, root = stream_with_files
    run = tmp_path / "run"
    main(["stream", "--source", str(source), "--files-root", str(root), "--out", str(run), *FLAGS])
    inside = run / ".events.jsonl"
    inside.write_bytes(source.read_bytes())
    (run / "checkpoint.pt").write_bytes(b"not a checkpoint")
    capsys.readouterr()
    for given, advice in (
        (source, "start a new run with --overwrite"),
        (inside, "choose another --out (this one holds an input of the command)"),
    ):
        with pytest.raises(SystemExit) as done:
            main(
                ["stream", "--source", str(given), "--files-root", str(root), "--out", str(run)]
                + [*FLAGS, "--resume"]
            )
        err = capsys.readouterr().err.strip().splitlines()
        assert done.value.code == 2 and len(err) == 1 and err[0].endswith(advice), err
