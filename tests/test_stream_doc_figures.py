"""The stream figures docs/streaming.md and README.md state are what today's code gives.

The plain registry places a fresh stream's labels by a key derived from ``--seed``
(docs/streaming.md, "Placeholders"), so these runs repeat exactly; a figure measured
with an earlier placement (arrival-order rows) no longer matches and fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_stream_resilience import scaled_stream

from stratify.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
STREAMING = (ROOT / "docs" / "streaming.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")


def stated(pattern: str, text: str = STREAMING) -> tuple[str, ...]:
    """The groups of ``pattern``'s one match in ``text``."""
    found = re.search(pattern, text, re.DOTALL)
    assert found is not None, f"the docs no longer state {pattern!r}"
    return found.groups()


def test_the_scaled_stream_figures_are_todays(tmp_path, capsys):
    accuracy, majority, event = stated(
        r"default options \(`--no-secure`\) ([0-9.]+)% prequential accuracy \(majority class"
        r" ([0-9.]+)%\).*?training diverged at event (\d+)"
    )
    source = tmp_path / "events.jsonl"
    source.write_text("\n".join(scaled_stream(3000)) + "\n")
    main(["stream", "--source", str(source), "--out", str(tmp_path / "a"), "--no-secure"])
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    # one decimal as stated: 0.1 point is 3 of the 3,000 events
    assert 100 * summary["prequential_accuracy"] == pytest.approx(float(accuracy), abs=0.1)
    assert 100 * summary["majority_accuracy"] == pytest.approx(float(majority), abs=0.1)
    capsys.readouterr()
    flags = ["--no-secure", "--scale", "none", "--lr", "5", "--momentum", "0.9"]
    with pytest.raises(SystemExit) as stop:
        main(["stream", "--source", str(source), "--out", str(tmp_path / "b"), *flags])
    assert stop.value.code == 1
    assert f"training diverged at event {event} " in capsys.readouterr().err


def test_the_late_class_figures_are_todays():
    from stratify.bench.stream import late_class

    first_5, first_20 = stated(
        r"late --seeds 5`\), ([0-9]+)% of its first 5 examples and ([0-9]+)% of its\s+first 20"
    )
    drawn_5, drawn_20 = stated(r"against ([0-9]+)% and ([0-9]+)%\s+with a random row")
    in_readme = stated(
        r"A class that appears late.*?: ([0-9]+)% of its\s+first\s+5 examples and ([0-9]+)% of",
        README,
    )
    assert in_readme == (first_5, first_20)
    imprinted = late_class(5, river=False)
    drawn = late_class(5, river=False, new_class="random")
    # shares of 25 and 100 examples: stated as whole percents
    assert round(100 * imprinted.first_5) == int(first_5)
    assert round(100 * imprinted.first_20) == int(first_20)
    assert round(100 * drawn.first_5) == int(drawn_5)
    assert round(100 * drawn.first_20) == int(drawn_20)
