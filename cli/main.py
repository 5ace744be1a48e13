"""The `stratify` click group and its error boundary; each command lives in its own module
and is loaded lazily.

Every command runs inside :func:`main`, the one place where errors become what the user
sees (docs/architecture.md, "Errors"): a user error is one line on stderr and exit code 2;
an unexpected exception is one line saying it is a bug, naming the file its traceback was
written to, and exit code 1. ``stratify --debug`` prints the traceback as well.
"""

from __future__ import annotations

import copy
import importlib
import platform
import sys
import tempfile
import traceback
from datetime import datetime
from typing import Any

import click

from stratify import __version__
from stratify.errors import StratifyError

# command name -> (module, attribute); imported only when the command runs, so `--help` is fast.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("stratify.cli.train", "train"),
    "bench": ("stratify.cli.bench", "bench"),
    "methods": ("stratify.cli.methods", "methods"),
    "stream": ("stratify.cli.stream", "stream"),
    "reproduce": ("stratify.cli.reproduce", "reproduce_command"),
    "plot": ("stratify.cli.plot", "plot"),
    "tables": ("stratify.cli.tables", "tables"),
    "data": ("stratify.cli.data", "data"),
}

#: earlier names of commands that moved into a group -> their name now; they still run,
#: hidden from the help, after one line on stderr saying the new name
DEPRECATED: dict[str, tuple[str, ...]] = {
    "algorithms": ("methods",),
    "bench-privacy": ("bench", "privacy"),
    "partition-stats": ("data", "stats"),
}

#: exit codes: a user error (bad input, unusable path) and a bug in stratify
USER_ERROR = 2
BUG = 1
INTERRUPTED = 130
#: a bug in a command whose exit code 1 says something else (`stratify tables --check`:
#: a table is stale), so a script cannot take a crash for that answer; such a command
#: sets it as ``settings["bug_exit_code"]`` (:func:`set_bug_exit_code`)
DISTINCT_BUG = 3

#: click >= 8.2 raises this for a bare `stratify`; its message is the whole help text
NO_ARGS_IS_HELP: tuple[type, ...] = tuple(
    filter(None, [getattr(click.exceptions, "NoArgsIsHelpError", None)])
)


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in DEPRECATED:
            return deprecated_alias(ctx, name, DEPRECATED[name])
        if name not in COMMANDS:
            return None
        module_name, attribute = COMMANDS[name]
        return getattr(importlib.import_module(module_name), attribute)


def deprecated_alias(ctx: click.Context, old: str, new: tuple[str, ...]) -> click.Command:
    """The command at path ``new`` under the old name ``old``, saying the new name on
    stderr before it runs (its output and exit code unchanged); :meth:`LazyGroup.
    list_commands` leaves the old names out of ``--help``."""
    group = ctx.command
    assert isinstance(group, click.Group)
    command = group.get_command(ctx, new[0])
    for name in new[1:]:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    assert command is not None and command.callback is not None
    alias = copy.copy(command)
    alias.name = old
    run = command.callback

    def callback(*args: Any, **kwargs: Any) -> Any:
        click.echo(f"note: `stratify {old}` is now `stratify {' '.join(new)}`", err=True)
        return run(*args, **kwargs)

    alias.callback = callback
    return alias


@click.group(cls=LazyGroup)
@click.version_option(
    package_name="stratify-fl", message="%(prog)s %(version)s (distribution %(package)s)"
)
@click.option(
    "--debug",
    is_flag=True,
    envvar="STRATIFY_DEBUG",
    help="On an error, also print its traceback (env STRATIFY_DEBUG=1).",
)
@click.pass_obj
def cli(settings: dict[str, Any], debug: bool) -> None:
    """Stratify: federated learning on non-IID data, and the methods it is compared with."""
    settings["debug"] = debug


def one_line(text: str) -> str:
    """``text`` with its line breaks and runs of spaces folded into single spaces."""
    return " ".join(text.split())


def user_error_message(error: BaseException) -> str | None:
    """The line shown for a user error, or ``None`` when ``error`` is not one.

    User errors: :class:`~stratify.errors.StratifyError`, click's usage errors, an
    ``OSError`` (a path that cannot be read or written: read-only, missing, a name too
    long, a full disk) and ``MemoryError`` (sizes beyond the machine's memory).
    """
    if isinstance(error, StratifyError):
        return str(error)
    if isinstance(error, click.UsageError):
        # one line, like the library's errors: the usage text would bury the message
        return error.format_message()
    if isinstance(error, click.ClickException):
        return error.format_message()
    if isinstance(error, OSError):
        where = f": {error.filename}" if error.filename else ""
        return f"{error.strerror or error}{where}"
    if isinstance(error, MemoryError):
        return (
            f"out of memory ({str(error) or 'an allocation failed'}); use smaller sizes "
            "(clients, samples, repeats, steps, model widths)"
        )
    return None


def write_traceback(error: BaseException, argv: list[str] | None) -> str:
    """Write ``error``'s traceback to a new temporary file; returns a phrase naming it."""
    command = " ".join(["stratify", *(sys.argv[1:] if argv is None else argv)])
    header = (
        f"stratify {__version__}, Python {platform.python_version()}, "
        f"{datetime.now().isoformat(timespec='seconds')}\ncommand: {command}\n\n"
    )
    text = header + "".join(traceback.format_exception(error))
    try:
        with tempfile.NamedTemporaryFile(
            "w", prefix="stratify-bug-", suffix=".txt", delete=False
        ) as handle:
            handle.write(text)
    except OSError as problem:
        return f"its traceback could not be written ({problem.strerror})"
    return f"the traceback is in {handle.name}"


def set_bug_exit_code(code: int) -> None:
    """Make a bug in the running command exit with ``code`` instead of :data:`BUG`.

    Parameters
    ----------
    code : int
        The exit code.
    """
    settings = click.get_current_context().find_root().obj
    if isinstance(settings, dict):  # run through main(); a test may call the command alone
        settings["bug_exit_code"] = code


def report(error: BaseException, debug: bool, argv: list[str] | None, bug: int = BUG) -> int:
    """Print ``error`` as one line on stderr; returns the exit code (``bug`` for a bug)."""
    if isinstance(error, click.exceptions.Exit):
        return error.exit_code
    if isinstance(error, (click.exceptions.Abort, KeyboardInterrupt)):
        click.echo("interrupted", err=True)
        return INTERRUPTED
    if isinstance(error, NO_ARGS_IS_HELP):
        click.echo(error.format_message(), err=True)  # type: ignore[attr-defined]
        return USER_ERROR
    if debug:
        traceback.print_exception(error)
    message = user_error_message(error)
    if message is not None:
        click.echo(f"error: {one_line(message)}", err=True)
        return USER_ERROR
    where = "" if debug else f"; {write_traceback(error, argv)} (stratify --debug prints it)"
    click.echo(
        f"error: unexpected {type(error).__name__}: {one_line(str(error))} — this is a bug "
        f"in stratify{where}",
        err=True,
    )
    return bug


def main(argv: list[str] | None = None) -> None:
    """Entry point of every command: the error boundary (see the module docstring)."""
    settings: dict[str, Any] = {"debug": False}
    try:
        cli.main(args=argv, standalone_mode=False, obj=settings)
    except SystemExit:
        raise
    except BaseException as error:  # the boundary: nothing escapes as a traceback
        sys.exit(report(error, settings["debug"], argv, settings.get("bug_exit_code", BUG)))


if __name__ == "__main__":
    main()
