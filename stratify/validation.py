"""Checks of user-given values: each returns the value in its proper type or raises a
:class:`~stratify.errors.ConfigError` whose one line names the option and what is valid.

The same checks serve the library and the CLI, so an out-of-range value reads the same
whichever way it came in (docs/architecture.md, "Options").
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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


#: the most times a benchmark repeats its work (``--repeat``, ``--rounds``, ``--seeds``):
#: a figure is a median of a few repeats, and a typo such as ``--repeat 1000000000``
#: would otherwise run for years instead of being refused
MAX_REPEATS = 10_000


def check_repeats(value: object, flag: str, maximum: int = MAX_REPEATS) -> int:
    """``value`` as a positive int of at most ``maximum``: how many times a loop runs."""
    count = check_positive_int(value, flag)
    if count > maximum:
        raise ConfigError(
            f"{flag} takes at most {maximum:,} (each one repeats the whole measurement), "
            f"got {count:,}"
        )
    return count


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
    sequence of seeds, as a tuple in the given order; at most :data:`MAX_REPEATS` of them
    (a typo such as ``0..1000000000`` is refused before the list is built)."""
    parts: list[object]
    if isinstance(value, str):
        parts = []
        for part in (piece.strip() for piece in value.split(",")):
            first, dots, last = part.partition("..")
            if dots and first.strip().isdigit() and last.strip().isdigit():
                count = len(parts) + max(int(last) - int(first) + 1, 0)
                if count > MAX_REPEATS:
                    raise ConfigError(
                        f"{flag} takes at most {MAX_REPEATS:,} seeds, got {count:,} in {value!r}"
                    )
                parts += list(range(int(first), int(last) + 1)) or [part]
            else:
                parts.append(part)
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        parts = [value]
    if len(parts) > MAX_REPEATS:
        raise ConfigError(f"{flag} takes at most {MAX_REPEATS:,} seeds, got {len(parts):,}")
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


# --------------------------------------------------------------------------------------
# KEY=VALUE options (a dataset loader's, ``-o KEY=VALUE``): typed Python values or text.


def _to_int(value: Any) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError("a truth value is not a count")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    if isinstance(value, str):
        return int(value.strip())
    raise TypeError(f"{type(value).__name__} is not an integer")


def _to_float(value: Any) -> float:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError("a truth value is not a number")
    if isinstance(value, (int, float, np.integer, np.floating)):
        number = float(value)
    elif isinstance(value, str):
        number = float(value.strip())
    else:
        raise TypeError(f"{type(value).__name__} is not a number")
    if not math.isfinite(number):
        raise ValueError("not finite")
    return number


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _to_bool(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError("not a truth value")


def _to_str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{type(value).__name__} is not text")
    return value


def _to_floats(value: Any) -> tuple[float, ...]:
    if isinstance(value, str):
        # the CLI's "-o angles=0,15,30" arrives as one string
        return tuple(_to_float(part) for part in value.split(",") if part.strip())
    if isinstance(value, (list, tuple, np.ndarray)):
        return tuple(_to_float(part) for part in np.ravel(np.asarray(value, dtype=object)))
    return (_to_float(value),)  # one number given as a plain number


#: kind -> (converter, the noun of its values)
_CONVERTERS: dict[type, tuple[Callable[[Any], Any], str]] = {
    int: (_to_int, "a whole number"),
    float: (_to_float, "a number"),
    bool: (_to_bool, "true or false"),
    str: (_to_str, "text"),
    tuple: (_to_floats, "a list of numbers"),
}


@dataclass(frozen=True)
class Typed:
    """The check of a ``KEY=VALUE`` option: ``Typed(kind, ...)(value, key)`` returns
    ``value`` (typed, or text from the command line) converted to ``kind``, in range.

    Parameters
    ----------
    kind : type
        ``int``, ``float``, ``bool``, ``str``, or ``tuple`` for a tuple of floats
        (comma-separated on the command line).
    minimum, maximum : float, optional
        Inclusive bounds of a number, or of every number of a tuple.
    choices : tuple of str
        The allowed values of a ``str`` option, named when a value of another type is
        refused (the field's ``choices`` refuse other text).
    example : tuple of float
        For a tuple: the value suggested when an empty one is refused.

    Raises
    ------
    ConfigError
        One line naming the key, the value and what is valid, e.g. ``option n_train=2.5 is
        not a whole number; n_train must be a whole number >= 1``.
    """

    kind: type
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    example: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in _CONVERTERS:
            raise TypeError(f"unsupported option kind {self.kind!r}")

    def bounds(self) -> str:
        """The allowed range as text, e.g. ``"in [0, 1]"`` or ``">= 1"`` (empty: unbounded)."""
        low, high = self.minimum, self.maximum
        if low is not None and high is not None:
            return f"in [{low:g}, {high:g}]"
        if low is not None:
            return f">= {low:g}"
        if high is not None:
            return f"<= {high:g}"
        return ""

    def describe(self) -> str:
        """What values are valid, e.g. ``"a whole number >= 1"``."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        noun = "comma-separated numbers" if self.kind is tuple else _CONVERTERS[self.kind][1]
        return f"{noun} {self.bounds()}".strip()

    def __call__(self, value: object, key: str) -> Any:
        convert, noun = _CONVERTERS[self.kind]
        try:
            converted = convert(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"option {key}={value!r} is not {noun}; {key} must be {self.describe()}"
            ) from None
        numbers = converted if self.kind is tuple else (converted,)
        if self.kind is tuple and not numbers:
            example = ",".join(f"{number:g}" for number in self.example) or "0"
            raise ConfigError(
                f"option {key} is empty; give at least one number, e.g. {key}={example}"
            )
        if self.kind in (int, float, tuple):
            for number in numbers:
                if (self.minimum is not None and number < self.minimum) or (
                    self.maximum is not None and number > self.maximum
                ):
                    raise ConfigError(
                        f"option {key}={number!r} is out of range; {key} must be {self.bounds()}"
                    )
        return converted


def check_text(value: object, flag: str) -> str:
    """``value`` as non-empty text (a name: a dataset, a partition spec)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{flag} must be non-empty text, got {value!r:.60}")
    return value


def check_path(value: object, flag: str) -> str:
    """``value`` (text or a path object) as non-empty path text."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{flag} must be a path, got {value!r:.60}")
    return value


def check_bool(value: object, flag: str) -> bool:
    """``value`` as True or False (``1``, ``"yes"`` and the like are refused: a setting
    read from a file should say what it means)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ConfigError(f"{flag} must be True or False, got {value!r:.60}")


def check_widths(value: object, flag: str) -> tuple[int, ...]:
    """Layer widths: ``"32,16,8"`` or a sequence of positive ints, as a tuple."""
    try:
        if not isinstance(value, (str, list, tuple)):
            raise TypeError  # bytes, a mapping or a set would iterate as something else
        parts = value.split(",") if isinstance(value, str) else list(value)
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
