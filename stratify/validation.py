"""Checks of user-given values: each returns the value in its proper type or raises a
:class:`~stratify.errors.ConfigError` whose one line names the option and what is valid.

The same checks serve the library and the CLI, so an out-of-range value reads the same
whichever way it came in (docs/architecture.md, "Options").
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from stratify.errors import ConfigError

#: Seeds feed ``numpy.random.default_rng`` and ``torch.manual_seed``; torch takes < 2**63.
SEED_LIMIT = 2**63


def _number(value: object, flag: str, expected: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{flag} must be {expected}, got {value!r}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} must be {expected}, got {value!r}") from None


def check_int(value: object, flag: str, minimum: int | None = None) -> int:
    """``value`` as an int ``>= minimum``."""
    expected = "an integer" if minimum is None else f"an integer >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            value = int(value)
        else:
            raise ConfigError(f"{flag} must be {expected}, got {value!r}")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ConfigError(f"{flag} must be {expected}, got {number}")
    return number


def check_positive_int(value: object, flag: str) -> int:
    """``value`` as an int ``> 0``."""
    try:
        return check_int(value, flag, minimum=1)
    except ConfigError:
        raise ConfigError(f"{flag} must be a positive integer, got {value!r}") from None


def check_seed(value: object, flag: str = "--seed") -> int:
    """A seed in ``[0, 2**63)``."""
    seed = check_int(value, flag, minimum=0)
    if seed >= SEED_LIMIT:
        raise ConfigError(f"{flag} must be in [0, 2**63), got {seed}")
    return seed


def check_positive(value: object, flag: str) -> float:
    """``value`` as a finite float ``> 0``."""
    number = _number(value, flag, "a positive number")
    if not (math.isfinite(number) and number > 0):
        raise ConfigError(f"{flag} must be a positive finite number, got {value!r}")
    return number


def check_nonnegative(value: object, flag: str) -> float:
    """``value`` as a finite float ``>= 0``."""
    number = _number(value, flag, "a non-negative number")
    if not (math.isfinite(number) and number >= 0):
        raise ConfigError(f"{flag} must be a non-negative finite number, got {value!r}")
    return number


def check_fraction(value: object, flag: str) -> float:
    """``value`` as a float in ``(0, 1]``."""
    number = _number(value, flag, "a number in (0, 1]")
    if not 0.0 < number <= 1.0:
        raise ConfigError(f"{flag} must be in (0, 1], got {value!r}")
    return number


def check_share(value: object, flag: str) -> float:
    """``value`` as a float in ``[0, 1)``: a share of something that must keep a remainder."""
    number = _number(value, flag, "a number in [0, 1)")
    if not 0.0 <= number < 1.0:
        raise ConfigError(f"{flag} must be in [0, 1), got {value!r}")
    return number


def check_momentum(value: object, flag: str) -> float:
    """A momentum coefficient: ``value`` as a float in ``[0, 1)``."""
    number = _number(value, flag, "a number in [0, 1)")
    if not 0.0 <= number < 1.0:
        raise ConfigError(f"{flag} must be in [0, 1), got {value!r}")
    return number


def check_seeds(value: object, flag: str = "--seeds") -> tuple[int, ...]:
    """Distinct seeds: ``"0,1,2"``, ranges such as ``"0..15"`` (both ends included), or a
    sequence of seeds, as a tuple in the given order."""
    parts: list[object]
    if isinstance(value, str):
        parts = []
        for part in (piece.strip() for piece in value.split(",")):
            first, dots, last = part.partition("..")
            if dots and first.strip().isdigit() and last.strip().isdigit():
                parts += list(range(int(first), int(last) + 1)) or [part]
            else:
                parts.append(part)
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        parts = [value]
    try:
        seeds = tuple(check_seed(part, flag) for part in parts)
    except ConfigError:
        raise ConfigError(
            f"{flag} takes comma-separated seeds (e.g. 0,1,2,3 or 0..15), got {value!r}"
        ) from None
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        raise ConfigError(f"{flag} names seed {repeated[0]} twice")
    return seeds


def check_choice(value: object, flag: str, choices: Sequence[str]) -> str:
    """``value`` as one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"unknown {flag} {value!r}; choose one of {', '.join(choices)}")
    return str(value)


def check_widths(value: object, flag: str) -> tuple[int, ...]:
    """Layer widths: ``"32,16,8"`` or a sequence of positive ints, as a tuple."""
    try:
        parts = value.split(",") if isinstance(value, str) else list(value)  # type: ignore[call-overload]
        widths = tuple(check_positive_int(part, flag) for part in parts)
    except (ConfigError, TypeError):
        raise ConfigError(
            f"{flag} takes comma-separated positive integers (e.g. 32,16,8), got {value!r}"
        ) from None
    if not widths:
        raise ConfigError(f"{flag} takes at least one width, got {value!r}")
    return widths


def physical_memory() -> int:
    """Bytes of physical memory of this machine; 0 where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def format_bytes(count: float) -> str:
    """``count`` bytes in the largest unit that keeps a number >= 1 (``"74.5 GiB"``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def check_fits_in_memory(needed: float, what: str, advice: str) -> None:
    """Refuse, before anything is allocated, sizes that need more than the machine has.

    Parameters
    ----------
    needed : float
        A lower bound of the bytes the work will hold at once, so a refusal is never
        wrong; the checks pass in what the data structures certainly take.
    what : str
        What would be allocated, naming the options that set its size.
    advice : str
        What to change.
    """
    memory = physical_memory()
    if memory and needed > memory:
        raise ConfigError(
            f"{what} would need at least {format_bytes(needed)}, more than this machine's "
            f"{format_bytes(memory)} of memory; {advice}"
        )
