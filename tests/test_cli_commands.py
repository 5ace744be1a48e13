"""The command tree: one name per command (the old names hidden aliases that say the new
one), one meaning per flag, per-method help, and the manual's generated tables equal to
what the commands define (docs/architecture.md, "Command line")."""

from __future__ import annotations

import shutil

import click
import pytest
from click.testing import CliRunner

import stratify.cli.docs_tables as docs_tables
from stratify.algorithms import ALGORITHMS
from stratify.cli.main import COMMANDS, DEPRECATED, cli, main
from stratify.cli.train import method_options, train


def run(capsys, *argv: str) -> tuple[str, str]:
    main(list(argv))
    captured = capsys.readouterr()
    return captured.out, captured.err


def walk(command: click.Command, path: tuple[str, ...] = ()):
    """Every command of the tree with its path, groups included."""
    yield path, command
    if isinstance(command, click.Group):
        context = click.Context(command)
        for name in command.list_commands(context):
            child = command.get_command(context, name)
            assert child is not None
            yield from walk(child, (*path, name))


def test_the_generated_tables_of_the_manual_equal_what_the_commands_define():
    for name, (page, make) in docs_tables.TABLES.items():
        assert docs_tables.committed(name) == make(), (
            f"docs/{page}'s table {name!r} is out of date: run python -m stratify.cli.docs_tables"
        )


def test_the_options_table_follows_a_changed_help_text(monkeypatch, tmp_path):
    shutil.copytree(docs_tables.DOCS, tmp_path / "docs")
    epochs = next(parameter for parameter in train.params if parameter.name == "epochs")
    monkeypatch.setattr(epochs, "help", "Rounds, told differently.")
    table = docs_tables.train_options_table()
    assert "| `--epochs` | `5` | Rounds, told differently. |" in table
    assert docs_tables.write_tables(tmp_path / "docs", check=True) == ["stratify train options"]
    assert docs_tables.write_tables(tmp_path / "docs") == ["stratify train options"]
    assert docs_tables.committed("stratify train options", tmp_path / "docs") == table
    assert docs_tables.write_tables(tmp_path / "docs", check=True) == []


def test_the_options_table_lists_every_common_option_and_no_method_s_own():
    table = docs_tables.train_options_table()
    own = method_options()
    for parameter in train.params:
        if isinstance(parameter, click.Option):
            assert (f"`{parameter.opts[0]}" in table) == (parameter.name not in own), parameter
    assert "`--method`, `--algorithm`" in table and "`--secure/--no-secure`" in table


@pytest.mark.parametrize("old", sorted(DEPRECATED))
def test_an_old_command_name_runs_the_new_command_after_one_line(capsys, old):
    tails = {
        "algorithms": [],
        "partition-stats": ["--clients", "3"],
        "bench-privacy": ["--classes", "2", "--clients", "2", "--protocol", "naive"],
    }
    new_out, new_err = run(capsys, *DEPRECATED[old], *tails[old])
    old_out, old_err = run(capsys, old, *tails[old])
    new = " ".join(DEPRECATED[old])
    assert old_err.splitlines() == [f"note: `stratify {old}` is now `stratify {new}`"]
    assert new_err == ""
    # the privacy bench prints its timings; everything else is the same output
    if old != "bench-privacy":
        assert old_out == new_out
    else:
        assert "naive (Table IV layout)" in old_out


def test_the_help_lists_the_new_names_and_hides_the_old_ones():
    output = CliRunner().invoke(cli, ["--help"], obj={}).output
    listed = {line.split()[0] for line in output.split("Commands:")[1].splitlines() if line}
    assert listed == set(COMMANDS)
    assert not listed & set(DEPRECATED)
    bench = CliRunner().invoke(cli, ["bench", "--help"], obj={}).output
    assert "privacy" in bench
    assert "stats" in CliRunner().invoke(cli, ["data", "--help"], obj={}).output


def help_options(output: str) -> set[str]:
    """The flags an option list of ``--help`` starts a line with."""
    return {
        line.split()[0].rstrip(",")
        for line in output.splitlines()
        if line.startswith("  -") and line.split()
    }


def test_train_help_lists_the_common_options_and_points_to_each_method_s():
    output = CliRunner().invoke(cli, ["train", "--help"], obj={}).output
    shown = help_options(output)
    assert {"--dataset", "--method", "--epochs", "--seeds"} <= shown
    assert not shown & {"--chunk", "--mu", "--local-epochs", "--margin"}
    assert "stratify train --method NAME --help" in " ".join(output.split())


@pytest.mark.parametrize(
    "argv", [["--method", "fedprox"], ["--algorithm", "fedprox"], ["--method=fedprox"]]
)
def test_train_method_help_shows_that_method_s_options_only(argv):
    output = CliRunner().invoke(cli, ["train", *argv, "--help"], obj={}).output
    own = output.split("Options of --method fedprox:")[1]
    shown = help_options(own)
    assert {"--mu", "--local-epochs", "--lr"} <= shown
    assert not shown & {"--chunk", "--margin", "--server-momentum"}
    assert "(μ/2)‖w − w_global‖². [default: 0.01]" in " ".join(own.split())


def test_methods_name_shows_one_method_s_options_with_their_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out, _ = run(capsys, "methods", "lfd")
    assert "--margin" in out and "Margin m in [0, 1]" in out and "--mu" not in out
    with pytest.raises(SystemExit) as caught:
        main(["methods", "nope"])
    assert caught.value.code == 2
    assert capsys.readouterr().err.startswith("error: unknown method 'nope'")


def test_method_and_algorithm_are_one_option():
    for flag in ("--method", "--algorithm"):
        context = train.make_context("train", [flag, "fedavg"])
        assert context.params["algorithm"] == "fedavg"
    assert set(ALGORITHMS) >= {"fedavg"}


def test_every_seeds_flag_takes_a_list_and_every_repeat_flag_counts_timings():
    seen = set()
    for path, command in walk(cli):
        for parameter in command.params:
            if not isinstance(parameter, click.Option):
                continue
            if "--seeds" in parameter.opts:
                seen.add(" ".join(path))
                assert parameter.metavar == "LIST", path
            if "--repeat" in parameter.opts:
                assert "timing repetitions" in (parameter.help or ""), path
    assert {"train", "bench transfers", "bench steps"} <= seen
    for command in ("transfers", "steps"):
        bench = cli.get_command(click.Context(cli), "bench")
        assert isinstance(bench, click.Group)
        context = bench.commands[command].make_context(command, ["--seeds", "0..2"])
        assert context.params["seeds"] == (0, 1, 2)
