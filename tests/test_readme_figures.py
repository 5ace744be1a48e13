"""The README's stated outputs of its training commands are what today's code prints
(the streaming example's: tests/test_stream_examples.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_stream_examples import load_example

from stratify.cli.main import main
from stratify.runfiles import read_records

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def stated(pattern: str) -> float:
    found = re.search(pattern, README, re.DOTALL)
    assert found is not None, f"the README no longer states {pattern!r}"
    return float(found.group(1))


def final_accuracy(folder: Path) -> float:
    return float(read_records(folder)[-1]["test_accuracy"])


def test_the_main_job_without_the_ckks_registry_ends_where_the_readme_says(tmp_path, capsys):
    figure = stated(r"`--no-secure` \(the plain registry.*?every\s+time: final ([0-9.]+)")
    # the main job (README, "Quick start") with the plain registry
    job = ["train", "--mode", "single-sample", "--chunk", "5", "--no-secure"]
    main([*job, "--out", str(tmp_path)])
    capsys.readouterr()
    assert final_accuracy(tmp_path) == pytest.approx(figure, abs=0.02)


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
