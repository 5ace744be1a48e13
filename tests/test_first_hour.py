"""A newcomer's first hour (issue 58): the distribution's own name in every install line,
README commands that run as written from a fresh clone, a set-up that says what it is
doing, tables that stay whole when piped, no empty benchmark column, and a dropped
client's epoch counting the transfers that were sent."""

from __future__ import annotations

import configparser
import re
import shlex
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
from rich.console import Console

import stratify
from stratify.cli.bench_privacy import results_table
from stratify.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTION = "stratify-fl"

# an install of the package index's `stratify` (SciTools' interpolation library, not this
# project): `pip install stratify`, `pip install 'stratify[flower]'`, or a dependency
# "stratify[flower]"; this project's own lines are `pip install -e '.[flower]'` and
# "stratify-fl[flower]"
INDEX_INSTALL = re.compile(
    r"pip3? install\s+(?:-U\s+|--upgrade\s+)?['\"]?stratify(?![\w-])|(?<![\w./-])stratify\[\w+\]"
)


def text_files() -> list[Path]:
    """Where a user reads an install line: the README, the manual, the examples, and the
    messages of the code (the package, its baselines and its command line)."""
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found += [path for path in sorted((ROOT / "examples").rglob("*")) if path.is_file()]
    for folder in ("stratify", "baselines", "cli"):
        found += sorted((ROOT / folder).rglob("*.py"))
    return found


def test_the_index_install_pattern_finds_the_index_s_stratify_only():
    for line in (
        "pip install 'stratify[flower]'",
        "pip install stratify",
        'dependencies = ["stratify[flower]"]',
        "needs river: pip install 'stratify[river]'",
    ):
        assert INDEX_INSTALL.search(line), line
    for line in (
        "pip install -e '.[flower]'",
        'dependencies = ["stratify-fl[flower]"]',
        "pip install stratify-fl",
        "python -m stratify.cli.docs_tables",
        "import stratify",
    ):
        assert not INDEX_INSTALL.search(line), line


def test_no_install_line_fetches_the_index_s_stratify():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in text_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if INDEX_INSTALL.search(line)
    ]
    assert found == [], "installs of the package index's `stratify`:\n" + "\n".join(found)


def test_the_distribution_has_its_own_name():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    assert config["metadata"]["name"] == DISTRIBUTION
    # the Flower app's dependency is this distribution (a SuperLink installs it)
    app = (ROOT / "examples" / "flower" / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r"^dependencies = \[\"stratify-fl\[flower\]\"\]$", app, re.MULTILINE)
    # the README and the docs' home say why the name is not `stratify`
    for page in ("README.md", "docs/index.md", "docs/quickstart.md"):
        text = (ROOT / page).read_text(encoding="utf-8")
        assert DISTRIBUTION in text and "SciTools" in text, page


def test_version_is_looked_up_under_the_distribution_s_name(capsys):
    assert metadata.version(DISTRIBUTION) == stratify.__version__
    main(["--version"])
    said = capsys.readouterr().out.strip()
    assert said.endswith(f" {stratify.__version__} (distribution {DISTRIBUTION})"), said


# ---- README commands that run as written from a fresh clone ----------------------------

# what a fresh clone can run: make (which creates .venv), the ./bin/stratify wrapper (which
# runs make first), git, the activate step, CI's script, and .venv's programs, which the
# first command of the quick start has created
RUNNABLE = ("make", "./bin/stratify", "git", "source", "bash .ci/run", ".venv/bin/")
SHELL_FENCE = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def shell_commands(markdown: str) -> list[str]:
    """Every command of ``markdown``'s shell blocks: continuation lines joined, comments
    dropped, a pipeline or a ``&&`` list split into its commands."""
    commands = []
    for block in SHELL_FENCE.findall(markdown):
        for line in block.replace("\\\n", " ").splitlines():
            code = line.split(" #", 1)[0].strip()
            if code and not code.startswith("#"):
                commands += [part.strip() for part in re.split(r"\|\||&&|\||;", code)]
    return [command for command in commands if command]


def runnable_from_a_fresh_clone(command: str) -> bool:
    words = shlex.split(command)
    if words[:2] == ["source", ".venv/bin/activate"]:
        return True
    return command.startswith(RUNNABLE) and words[0] != "source"


def test_the_shell_block_reader_sees_every_command():
    text = "```bash\n./bin/stratify train \\\n  --epochs 3   # note\n# a comment\n"
    text += ".venv/bin/python x.py produce \\\n  | stratify stream --source -\n```\n"
    assert shell_commands(text) == [
        "./bin/stratify train    --epochs 3",
        ".venv/bin/python x.py produce",
        "stratify stream --source -",
    ]
    assert not runnable_from_a_fresh_clone("stratify stream --source -")
    assert not runnable_from_a_fresh_clone("python examples/river_streams.py")
    assert not runnable_from_a_fresh_clone("pip install -e '.[flower]'")
    assert not runnable_from_a_fresh_clone("source env.sh")
    assert runnable_from_a_fresh_clone("source .venv/bin/activate")


@pytest.mark.parametrize("page", ["README.md", "docs/quickstart.md"])
def test_every_shell_command_of_the_first_pages_runs_from_a_fresh_clone(page):
    commands = shell_commands((ROOT / page).read_text(encoding="utf-8"))
    assert len(commands) >= 3
    assert [command for command in commands if not runnable_from_a_fresh_clone(command)] == []


def test_the_wrapper_sets_up_the_environment_and_runs_its_stratify():
    wrapper = (ROOT / "bin" / "stratify").read_text(encoding="utf-8")
    assert (ROOT / "bin" / "stratify").stat().st_mode & 0o111
    assert 'make -s -C "$root" venv' in wrapper
    assert 'exec "$root/.venv/bin/stratify" "$@"' in wrapper


def test_the_set_up_says_what_it_installs_and_how_long_it_takes_before_pip_starts(tmp_path):
    # a dry run for an environment that does not exist yet: every line the recipe would run
    planned = subprocess.run(
        ["make", "-n", "-C", str(ROOT), f"VENV={tmp_path / 'venv'}", "venv"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    said = planned[: planned.index("-q -e '.[test]'")]  # what it says before pip starts
    assert "creating the virtual environment" in said
    assert "torch" in said and re.search(r"about \d+(-\d+)? minutes", said), said


def test_make_docs_serve_serves_the_site():
    planned = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "VENV=.venv", "docs-serve"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "mkdocs serve" in planned


def test_the_quick_start_page_comes_first_after_the_home_page():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:\n", 1)[1]
    pages = re.findall(r"^  - [^:]+: (\S+)$", nav, re.MULTILINE)
    assert pages[:2] == ["index.md", "quickstart.md"]


# ---- tables that stay whole when piped -------------------------------------------------


def test_a_piped_training_table_keeps_its_headers_whole(tmp_path, capsys, monkeypatch):
    """The captured standard output is not a terminal, as a pipe or a file is not: rich
    would lay the 10-column table out in 80 columns and cut its headers (``trans…``)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    main(["train", "--mode", "batch", "--epochs", "1", "--no-secure", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    headers = ("epoch", "test acc", "test loss", "train loss", "transfers", "skipped", "seconds")
    header = next(line for line in out.splitlines() if "epoch" in line)
    assert all(word in header for word in headers), header
    assert "…" not in out
    # the summary after the table is one line, not wrapped at 80 columns
    summary = next(line for line in out.splitlines() if "final accuracy" in line)
    assert "run folder" in summary


def test_a_grid_logged_to_a_file_keeps_its_lines_whole(tmp_path, capsys, monkeypatch):
    """A grid's standard error (its board of runs, its notes) caught by a log file is not
    a terminal either: at 80 columns rich cut the board's run names
    ("dirichlet-0-5/fedavg-matched-2047…") and wrapped its notes."""
    monkeypatch.delenv("COLUMNS", raising=False)
    flags = ["--dataset", "digits", "--seeds", "0", "--plateau", "40", "--epochs", "100"]
    main(["reproduce", "paired", "--out", str(tmp_path / "grid"), *flags, "--dry-run"])
    err = capsys.readouterr().err
    note = next(line for line in err.splitlines() if line.startswith("note: FedTAN"))
    assert len(note) > 80 and note.endswith("(give the grid --model resnet20)"), note
    assert "…" not in err


# ---- bench privacy: no empty column ----------------------------------------------------


def row(protocol: str, **ratios: float) -> dict:
    phases = {"unique_s": 0.1, "mapping_s": 0.2, "aggregation_s": 0.3, "total_s": 0.6}
    return {"classes": 2, "clients": 5, "protocol": protocol, "verified": True, **phases, **ratios}


def rendered(rows: list[dict]) -> tuple[list[str], str]:
    console = Console(record=True, width=200)
    table = results_table(rows)
    console.print(table)
    return [str(column.header) for column in table.columns], console.export_text()


def test_the_privacy_table_shows_only_the_ratios_its_protocols_give():
    # the README's command, packed and packed-blind: no naive protocol, so no speed-up
    columns, text = rendered([row("packed"), row("packed-blind", blind_cost=0.89)])
    assert "speed-up" not in columns and columns[-1] == "vs unblinded"
    assert "0.89x" in text
    # naive and packed: the speed-up, and no blinded protocol to compare
    columns, text = rendered([row("naive"), row("packed", speedup=2.5)])
    assert columns[-1] == "speed-up" and "vs unblinded" not in columns
    assert "2.5x" in text
    # all four: both, a dash where a row has no ratio of its own (the naive rows)
    rows = [row("naive"), row("packed", speedup=2.5), row("naive-blind", blind_cost=1.2)]
    columns, text = rendered([*rows, row("packed-blind", speedup=3.0, blind_cost=1.1)])
    assert columns[-2:] == ["speed-up", "vs unblinded"]
    naive_line = next(line for line in text.splitlines() if " naive " in line)
    assert naive_line.split()[-2:] == ["–", "–"]


def test_the_readme_s_privacy_bench_prints_no_empty_column(capsys):
    command = ["bench", "privacy", "--classes", "2", "--clients", "3"]
    main([*command, "--protocol", "packed,packed-blind"])
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "verified" in line)
    assert header.split()[-2:] == ["vs", "unblinded"] and "speed-up" not in header
    # every row fills every column of the header
    rows = [line for line in out.splitlines() if re.match(r"\s+2\s+3\s+packed", line)]
    assert len(rows) == 2
    assert [len(line.split()) for line in rows] == [9, 9]
    assert rows[0].split()[-1] == "–"  # packed: no unblinded protocol to compare it with
    assert rows[1].split()[-1].endswith("x")
