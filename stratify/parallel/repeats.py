"""Runs that repeat another's: the same configuration in another folder.

A grid can hold one run twice: the seed-paper grid pairs FedBR once with the plain-SGD
FedAvg and once with the momentum-0.9 one, and FedBR's own run is the same in both
columns. Such a run is trained once and its files copied into the other folder, so each
cell's folder still holds its whole run (docs/architecture.md, "Many runs at once").
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from stratify.config import TrainConfig
from stratify.parallel.specs import RunSpec
from stratify.runfiles import RUN_FILES, read_json_object
from stratify.runfolder import json_safe, strict_json, write_output_file


def run_identity(config: TrainConfig) -> str:
    """What makes two configurations one run: every field but the run folder."""
    values = dataclasses.asdict(config)
    values["out"] = None
    return json.dumps(json_safe(values), sort_keys=True, default=str)


def repeated_runs(specs: Sequence[RunSpec]) -> dict[str, RunSpec]:
    """Each spec whose run repeats an earlier spec's, by name, to that earlier spec."""
    first: dict[str, RunSpec] = {}
    repeats: dict[str, RunSpec] = {}
    for spec in specs:
        source = first.setdefault(run_identity(spec.config), spec)
        if source is not spec:
            repeats[spec.name] = source
    return repeats


def copy_run(source: str | Path, destination: str | Path) -> None:
    """Replace the run files in ``destination`` with those of ``source``; the copied
    ``config.json`` names ``destination`` as its folder."""
    source, destination = Path(source), Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        (destination / name).unlink(missing_ok=True)
    for name in RUN_FILES:
        if name != "config.json" and (source / name).is_file():
            shutil.copyfile(source / name, destination / name)
    config = read_json_object(source / "config.json")
    config["out"] = str(destination)
    write_output_file(destination / "config.json", (strict_json(config, indent=2) + "\n").encode())
