"""The slow tier, derived from a record of test durations (docs/development.md, "Tests").

``make test`` (and so CI) records every test's time to ``build/test-durations.txt``
(``--durations-file``, tests/conftest.py): one line ``SECONDS NODEID`` per test, setup,
call and teardown summed. pytest's own ``--durations=0`` report (``SECONDS PHASE
NODEID`` lines) is read as well. This script lists the tests that took at least
``--threshold`` seconds; their list, committed as ``tests/slow_tests.txt``, marks them
``slow`` (tests/conftest.py), so ``make test-fast`` (``-m "not slow"``) leaves them out::

    .venv/bin/python tests/tiers.py build/test-durations.txt > tests/slow_tests.txt
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable
from pathlib import Path

#: a record line: seconds (pytest writes "1.23s"), an optional phase, the test's node id
LINE = re.compile(r"^(\d+(?:\.\d+)?)s?\s+(?:(?:setup|call|teardown)\s+)?(tests/\S.*?)\s*$")

#: seconds from which a test is slow (in a record of the suite on two busy cores): what
#: is left, about three quarters of the tests, runs in under two minutes there
THRESHOLD = 0.25

HEADER = (
    "# Tests measured slow (at least {threshold:g} s) in a full run's record; `make test-fast`\n"
    '# leaves them out. Regenerate (docs/development.md, "Tests"):\n'
    "#   .venv/bin/python tests/tiers.py build/test-durations.txt > tests/slow_tests.txt\n"
)


def durations(lines: Iterable[str]) -> dict[str, float]:
    """Each test's seconds in a record, its phases summed; other lines are skipped.

    Parameters
    ----------
    lines : iterable of str
        The record's lines, in either format of the module docstring.
    """
    total: dict[str, float] = {}
    for line in lines:
        match = LINE.match(line)
        if match:
            seconds, node = float(match.group(1)), match.group(2)
            total[node] = total.get(node, 0.0) + seconds
    return total


def slow_tests(times: dict[str, float], threshold: float = THRESHOLD) -> list[str]:
    """The node ids that took at least ``threshold`` seconds, in name order.

    Parameters
    ----------
    times : dict
        Node id -> seconds, as :func:`durations` reads them.
    threshold : float, default THRESHOLD
        The seconds from which a test is slow.
    """
    return sorted(node for node, seconds in times.items() if seconds >= threshold)


def main(argv: list[str] | None = None) -> int:
    """Print the slow list of a record (with its header) to stdout."""
    parser = argparse.ArgumentParser(description="List the slow tests of a durations record.")
    parser.add_argument("record", type=Path, help="build/test-durations.txt of a full run")
    parser.add_argument(
        "--threshold", type=float, default=THRESHOLD, help=f"seconds ({THRESHOLD:g})"
    )
    options = parser.parse_args(argv)
    try:
        times = durations(options.record.read_text(encoding="utf-8").splitlines())
    except OSError as error:
        print(f"error: cannot read {options.record}: {error.strerror}", file=sys.stderr)
        return 2
    if not times:
        print(f"error: {options.record} records no test durations", file=sys.stderr)
        return 2
    sys.stdout.write(HEADER.format(threshold=options.threshold))
    for node in slow_tests(times, options.threshold):
        sys.stdout.write(node + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
