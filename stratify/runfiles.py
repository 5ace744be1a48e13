"""Reading a run folder's files back, trusting nothing in them.

A grid, ``stratify plot`` and ``train --seeds`` read the files runs wrote
(``config.json``, ``metrics.jsonl``, ``summary.json``). A file damaged or replaced by
hand — cut short, not UTF-8, not JSON, JSON of another shape, a FIFO or a folder, absurdly
large — is a :class:`~stratify.errors.CorruptRunError` naming the file, the line and what
is wrong, never an exception from deep inside a reader (docs/architecture.md, "Many runs
at once").
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeGuard

from stratify.errors import CorruptRunError
from stratify.files import file_kind, read_file
from stratify.registry.client_secrets import SECRETS_FILE
from stratify.validation import physical_memory

#: the files a run folder (of ``train`` or ``stream``) may hold
RUN_FILES = ("config.json", "metrics.jsonl", "summary.json", "checkpoint.pt", SECRETS_FILE)

#: parsed JSON takes about this many times its text's bytes in memory
JSON_EXPANSION = 16
#: the largest magnitude a run's metric can have: float32's (runs compute in float32)
LARGEST_METRIC = 3.4028234663852886e38
#: the largest count a record can hold exactly as a JSON number read into a float
LARGEST_COUNT = 2**53


def read_text(path: Path) -> str:
    """The UTF-8 text of the regular file ``path``.

    Raises
    ------
    CorruptRunError
        Not a regular file, too large to read back on this machine, or not UTF-8.
    OSError
        It cannot be opened (missing, permissions).
    """
    memory = physical_memory()
    data = read_file(path, limit=memory // JSON_EXPANSION if memory else None)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CorruptRunError(f"{path} is not UTF-8 text (byte {error.start})") from None


def parse_json(text: str, where: str) -> Any:
    """``text`` as strict JSON; anything Python's parser refuses (a cut line, a 5,000-digit
    integer, nesting deeper than the interpreter's stack) is one
    :class:`CorruptRunError` naming ``where``."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CorruptRunError(f"{where} is not valid JSON ({reason[:120]})") from None


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: runs write null


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` (``config.json``, ``summary.json``)."""
    value = parse_json(read_text(path), str(path))
    if not isinstance(value, dict):
        raise CorruptRunError(f"{path} holds a JSON {json_kind(value)}, not an object")
    return value


def json_kind(value: object) -> str:
    """The JSON name of ``value``'s type (``array``, ``string``, …)."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "null" if value is None else "number"


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of ``path``, one per line (``metrics.jsonl``).

    Every line must be a whole JSON object: runs replace the file whole, so a cut or
    foreign line means the file was damaged.
    """
    lines = read_text(path).split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    records = []
    for number, line in enumerate(lines, start=1):
        value = parse_json(line, f"{path} line {number}")
        if not isinstance(value, dict):
            raise CorruptRunError(
                f"{path} line {number} is a JSON {json_kind(value)}, not a record"
            )
        records.append(value)
    return records


def is_count(value: object, smallest: int = 0) -> bool:
    """An integer (not a bool) in ``[smallest, 2**53]``."""
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and smallest <= value <= LARGEST_COUNT
    )


def is_metric(value: object) -> TypeGuard[int | float]:
    """A number (not a bool) a run could have measured: finite, within float32's range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value)) and abs(float(value)) <= LARGEST_METRIC
    except OverflowError:  # an integer beyond any float
        return False


#: what every ``metrics.jsonl`` record of a training run holds, and how it is checked
EPOCH_FIELDS: Mapping[str, Callable[[object], bool]] = {
    "epoch": lambda value: is_count(value, 1),
    "test_accuracy": lambda value: is_metric(value) and 0 <= float(value) <= 1,  # type: ignore[arg-type]
    "transfers": is_count,
    "steps": is_count,
    "wall_seconds": lambda value: is_metric(value) and float(value) >= 0,  # type: ignore[arg-type]
}


def read_records(folder: str | Path) -> list[dict[str, Any]]:
    """The epoch records of training run ``folder`` (``metrics.jsonl``; none without it).

    Raises
    ------
    CorruptRunError
        The file is not a run's records: a line that is not a JSON object, a record
        without ``epoch``, ``test_accuracy``, ``transfers``, ``steps`` or
        ``wall_seconds`` of the right type, or epochs not numbered 1, 2, 3, ….
    """
    path = Path(folder) / "metrics.jsonl"
    try:
        records = read_lines(path)
    except FileNotFoundError:
        return []
    except OSError as error:
        raise CorruptRunError(f"{path} cannot be read ({error.strerror or error})") from None
    for index, record in enumerate(records):
        for key, valid in EPOCH_FIELDS.items():
            if key not in record:
                raise CorruptRunError(f"{path} line {index + 1} has no {key}")
            if not valid(record[key]):
                raise CorruptRunError(
                    f"{path} line {index + 1}: {key} is {record[key]!r:.40}, which no run writes"
                )
        if record["epoch"] != index + 1:
            raise CorruptRunError(
                f"{path} line {index + 1} is epoch {record['epoch']}, not {index + 1}"
            )
    return records


#: the first bytes of a file ``torch.save`` writes (a zip archive)
ZIP_MAGIC = b"PK\x03\x04"


def check_checkpoint_file(path: Path) -> None:
    """Refuse a ``checkpoint.pt`` that is not even shaped like one: not a regular file,
    or not a zip archive (the format of :func:`~stratify.runfolder.array_checkpoint_bytes`
    and of ``torch.save``). Its content is checked when a run
    resumes from it (:mod:`stratify.checkpoints`)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CorruptRunError(f"{path} is {file_kind(info.st_mode)}, not a regular file")
        if os.read(fd, len(ZIP_MAGIC)) != ZIP_MAGIC:
            raise CorruptRunError(f"{path} is not a checkpoint (not a zip archive)")
    finally:
        os.close(fd)
