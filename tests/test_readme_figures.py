"""The README's stated outputs of its training commands are what today's code prints
(the streaming example's: tests/test_stream_examples.py)."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_stream_examples import PINNED_KERNELS, load_example

from stratify.cli.main import main
from stratify.runfiles import read_records

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def stated(pattern: str) -> float:
    found = re.search(pattern, README, re.DOTALL)
    assert found is not None, f"the README no longer states {pattern!r}"
    return float(found.group(1))


def final_accuracy(folder: Path) -> float:
    return float(read_records(folder)[-1]["test_accuracy"])


@pytest.mark.slow
def test_the_main_job_without_the_ckks_registry_ends_where_the_readme_says(tmp_path):
    """The main job (README, "Quick start") with the plain registry, whose placement is
    seeded, in a process whose float kernels are pinned to code paths every x86 CPU runs
    alike (as the stream example's, tests/test_stream_examples.py): the summary's
    accuracies are the README's to the last digit."""
    if platform.machine().lower() not in {"x86_64", "amd64"}:
        pytest.skip("the pinned kernels (MKL, ATen's scalar path, oneDNN's SSE4.1) are x86's")
    found = re.search(
        "`" + re.escape(PINNED_KERNELS) + r" \./bin/stratify train --mode single-sample "
        r"--chunk 5 --no-secure`\s+ends with `(final accuracy [^`]*?)`",
        README,
        re.DOTALL,
    )
    assert found is not None, "the README states the pinned main job's summary"
    environment = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    environment.update(pair.split("=", 1) for pair in PINNED_KERNELS.split())
    job = ["train", "--mode", "single-sample", "--chunk", "5", "--no-secure"]
    command = [sys.executable, "-m", "stratify.cli.main", *job, "--out", str(tmp_path / "run")]
    finished = subprocess.run(command, env=environment, capture_output=True, text=True, check=True)
    summary = finished.stdout.strip().splitlines()[-1]
    assert summary.startswith(" ".join(found.group(1).split())), summary


@pytest.mark.data
def test_the_training_example_ends_where_the_readme_says(tmp_path, shared_data_dir, capsys):
    figure = stated(r"On this machine.*?it ended at test accuracy\s+([0-9.]+)")
    command = re.search(r"stratify train --dataset mnist-10k (.*?)\n```", README, re.DOTALL)
    assert command is not None
    arguments = command.group(1).replace("\\\n", " ").replace("DIR", shared_data_dir).split()
    main(["train", "--dataset", "mnist-10k", *arguments, "--out", str(tmp_path)])
    capsys.readouterr()
    assert final_accuracy(tmp_path) == pytest.approx(figure, abs=0.02)


def test_the_readme_stream_pipeline_ends_where_the_readme_says(tmp_path):
    pytest.importorskip("river")
    figure = stated(r"events/s, prequential accuracy ([0-9.]+)%")
    example = load_example("river_streams")
    source = tmp_path / "events.jsonl"
    lines = (json.dumps(event) + "\n" for event in example.events("ImageSegments"))
    source.write_text("".join(lines))
    summary, _ = example.score_stratify(source, tmp_path / "run", eval_every=500)
    assert 100 * summary["prequential_accuracy"] == pytest.approx(figure, abs=2)
