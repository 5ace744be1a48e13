"""``stratify train`` refuses every bad option setting of the conformance kit
(:func:`stratify.testing.bad_option_refusals`) with exit code 2, one line on stderr
naming the flag, and no run folder. The kit checks the library's refusal; the command's
is checked here, above the command line (docs/architecture.md, "Package map")."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from stratify.cli.main import main
from stratify.testing import MethodCase, Refusal, bad_option_refusals, method_cases

CASES = method_cases()


def train_arguments(refusal: Refusal, out: Path) -> list[str]:
    """``stratify train`` on the kit's tiny dataset with the refusal's flags."""
    case = refusal.case
    return [
        "train",
        "--dataset",
        "digits",
        "--no-secure",
        "--epochs",
        "1",
        "--algorithm",
        case.algorithm,
        "--mode",
        case.mode,
        *refusal.arguments,
        "--out",
        str(out),
    ]


def command_refusal(arguments: list[str]) -> tuple[int | str | None, list[str]]:
    """``stratify ARGUMENTS``'s exit code and stderr lines."""
    stderr = io.StringIO()
    code: int | str | None = 0
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(arguments)
        except SystemExit as exit_:
            code = exit_.code
    return code, stderr.getvalue().strip().splitlines()


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_the_command_refuses_each_bad_option_in_one_line(case: MethodCase, tmp_path):
    refusals = bad_option_refusals(case)
    assert refusals, f"{case.id}: no setting to refuse (another method's option at least)"
    for number, refusal in enumerate(refusals):
        out = tmp_path / f"run-{number}"
        arguments = train_arguments(refusal, out)
        code, lines = command_refusal(arguments)
        command = "stratify " + " ".join(arguments)
        assert code == 2, f"{command}: exit code {code}, not 2"
        expected = refusal.words if refusal.command_words is None else refusal.command_words
        assert len(lines) == 1 and all(word in lines[0] for word in expected), (
            f"{command}: stderr {lines}"
        )
        assert not out.exists(), f"{command}: wrote {out}"
