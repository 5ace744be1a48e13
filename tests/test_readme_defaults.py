"""The manual's table of every method's defaults (docs/methods.md) is
`stratify methods --markdown`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import stratify.cli.methods as methods_cli
from stratify.algorithms import strategy_class
from stratify.baselines.fedprox import FedProx, FedProxOptions
from stratify.cli.main import main
from stratify.options import inherit

METHODS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "methods.md"
BEGIN = "<!-- begin: stratify methods --markdown -->\n"
END = "<!-- end: stratify methods --markdown -->"


def readme_block() -> str:
    text = METHODS_PAGE.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)]


def markdown(capsys) -> str:
    main(["methods", "--markdown"])
    return capsys.readouterr().out


def test_the_readme_defaults_table_is_the_command_s_output(capsys):
    assert readme_block() == markdown(capsys), (
        "docs/methods.md's defaults table is out of date: replace the block between its "
        "'stratify methods --markdown' markers with that command's output"
    )


def test_the_table_reads_the_defaults_from_the_options_classes(capsys, monkeypatch):
    # a changed default changes the command's output, so the docs test above fails
    @dataclass
    class LargerMu(FedProxOptions):
        mu: float = inherit(0.25)

    class FedProxLargerMu(FedProx):
        options_class = LargerMu

    def patched(name):
        return FedProxLargerMu if name == "fedprox" else strategy_class(name)

    monkeypatch.setattr(methods_cli, "strategy_class", patched)
    output = markdown(capsys)
    (row,) = [line for line in output.splitlines() if line.startswith("| `fedprox` |")]
    assert "`--mu` 0.25" in row
    assert output != readme_block()


def test_the_table_shows_each_mode_s_default_and_the_methods_rates(capsys):
    rows = {line.split(" | ")[0][2:]: line for line in markdown(capsys).splitlines()[2:]}
    # FedAvg: NIID-Bench's E = 10 in batch mode, one pass per sample in single-sample mode
    assert "`--local-epochs` 1 (single-sample), 10 (batch)" in rows["`fedavg`"]
    # each method's own rates per dataset family and mode, then its paper's (FedBSS's
    # 1e-3, FedBR's by image size), else the dataset's
    for name, row in rows.items():
        cls = strategy_class(name.strip("`"))
        rate = row.split("`--lr` ")[1].split("<br>")[0]
        rates = cls.card.rates
        own = [f"{lr} on {family} ({mode})" for (family, mode), lr in (rates.tuned or {}).items()]
        paper = rates.note or ("the dataset's" if rates.paper_lr is None else f"{rates.paper_lr:g}")
        assert rate == (f"{', '.join(own)}; else {paper}" if own else f"untuned: {paper}"), name
    assert "else 0.001" in rows["`fedbss`"] or "`--lr` 0.001<br>" in rows["`fedbss`"]
    # an option of one mode says so; a default resolved at run time quotes its help
    assert "`--chunk` 5 (single-sample)" in rows["`stratify`"]
    assert "`--repeat-count` round(N/\\|L\\|)" in rows["`stratify`"]
