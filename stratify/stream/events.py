"""Stream events: one sample arriving at one client, read from JSON Lines.

A line is a JSON object ``{"client": ..., "label": ..., "x": [...]}``, or with
``"path": "file.npy"`` (optionally ``"row": i``) instead of ``"x"``: the sample's
features stored in a ``.npy`` file, so a pipeline can send large samples by reference.
``"x"`` may also be an object of named features (``{"age": 41, "income": 2.5}``), whose
keys the stream's first such event fixes. A line without ``"label"`` asks for a
prediction; ``{"id": ..., "label": ...}`` alone labels an earlier unlabeled event of
that id. Clients are JSON integers or strings; labels are integers, strings or booleans.

Every value reaches the learner through one check (:func:`check_features`,
:func:`check_label`, :func:`check_identifier`), whether it came as JSON, a list, a NumPy
array or a tensor; a value that cannot be an event raises :class:`EventError` with the
reason, and the stream reports it with the line number, skips it and goes on
(docs/architecture.md, "Streaming").
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stratify.errors import ConfigError, StratifyError

#: what a client may be: JSON integers and strings; a label may also be a boolean
Identifier = int | str | bool
#: integer identifiers are kept as int64 in checkpoints and buffers
IDENTIFIER_LIMIT = 2**63
#: longest string identifier (client, label, id or feature name), in characters
MAX_IDENTIFIER_CHARS = 256
#: most array dimensions a sample may have (an image is 3)
MAX_SAMPLE_DIMS = 8
#: the value types of the plain named features :meth:`FeatureSchema.plain_values` takes
#: without a check per feature (any other, a bool included, is checked one by one)
PLAIN_TYPES = frozenset({float, int})
#: bytes read from a source at a time
READ_CHUNK = 1 << 16
#: what JSON counts as whitespace: a line of only these is blank (and skipped silently)
JSON_WHITESPACE = " \t\r\n"
#: what ``--missing`` may be
MISSING = ("error", "zero")


class EventError(StratifyError):
    """An event that cannot be ingested; the message says why. The stream skips it."""


@dataclass(frozen=True)
class Event:
    """One sample arriving at one client.

    Parameters
    ----------
    client : int or str
        The client that received the sample.
    label : int, str, bool or None
        Its label (a real label: only the client sees it); ``None`` for an event that
        asks for a prediction.
    x : numpy.ndarray, torch.Tensor, list or dict
        Its features, any shape with the stream's number of features, or named features.
    line : int
        The source line it came from (1-based), which identifies the sample; 0 when it
        did not come from a source file.
    id : int or str, optional
        The event's identifier, which a later ``{"id": ..., "label": ...}`` refers to.
    checked : bool
        Whether ``x`` is what :func:`check_features` returned (:func:`parse_line` checks
        the features it reads), so the learner does not check them again.
    """

    client: Identifier
    label: Identifier | None
    x: Any
    line: int = 0
    id: Identifier | None = None
    checked: bool = False


@dataclass(frozen=True)
class LateLabel:
    """``{"id": ..., "label": ...}``: the label of an earlier unlabeled event."""

    id: Identifier
    label: Identifier
    line: int = 0


# -- the checks every event goes through ----------------------------------------------------


def check_identifier(value: object, what: str, allow_bool: bool = False) -> Identifier:
    """``value`` as a client, label or id: a JSON integer (within int64) or string
    (at most 256 characters); a boolean too with ``allow_bool``. Else :class:`EventError`."""
    if value is None:
        raise EventError(f"missing {what}")
    if isinstance(value, (bool, np.bool_)):
        if allow_bool:
            return bool(value)
        raise EventError(f"{what} must be an integer or a string, got {json.dumps(bool(value))}")
    if isinstance(value, np.integer):
        value = int(value)
    if isinstance(value, int):
        if not -IDENTIFIER_LIMIT <= value < IDENTIFIER_LIMIT:
            raise EventError(f"{what} is an integer outside the 64-bit range")
        return value
    if isinstance(value, str):
        if len(value) > MAX_IDENTIFIER_CHARS:
            raise EventError(f"{what} is a string of {len(value):,} characters (at most 256)")
        return value
    kinds = "an integer, a string or a boolean" if allow_bool else "an integer or a string"
    raise EventError(f"{what} must be {kinds}, got {describe(value)}")


def check_label(value: object) -> Identifier:
    """A label: an integer, a string or a boolean; ``None`` is a missing label."""
    return check_identifier(value, "label", allow_bool=True)


def describe(value: object) -> str:
    """A short description of a value for a message (never the whole of a huge one)."""
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} items" if value else "an empty list"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    return type(value).__name__


def check_features(x: object) -> np.ndarray:
    """Features as a float32 NumPy array, whatever they came as; :class:`EventError` if
    they are not a non-empty array of finite numbers.

    Parameters
    ----------
    x : list, tuple, numpy.ndarray or torch.Tensor
        Numbers, possibly nested in lists of equal length (booleans count as 0 and 1); a
        tensor is copied off its device. Named features (a dict) go through
        :class:`FeatureSchema` instead.
    """
    torch = sys.modules.get("torch")  # a tensor can only come from a loaded torch
    if torch is not None and isinstance(x, torch.Tensor):
        from stratify.checkpoints import NUMERIC_DTYPES

        # a sparse, nested or meta tensor has no plain values to check (torch's own errors
        # on them are no EventError)
        if x.is_nested or x.layout != torch.strided or x.is_meta:
            kind = "nested" if x.is_nested else "meta" if x.is_meta else str(x.layout)
            raise EventError(f"the features must be a dense tensor of values, got a {kind} one")
        if x.is_complex() or x.dtype not in NUMERIC_DTYPES:
            raise EventError(f"the features must be real numbers, got a tensor of {x.dtype}")
        features = x.detach().to(torch.float32)
        check_values(features.numel(), features.dim(), lambda: bool(features.isfinite().all()))
        return features.cpu().numpy()
    # lists and arrays are checked in NumPy: on a sample of a few dozen numbers each torch
    # call costs more than the check itself
    array = numeric_array(x)
    check_values(array.size, array.ndim, lambda: bool(np.isfinite(array).all()))
    return array


def as_numpy(values: Any) -> np.ndarray:
    """``values`` (an array, or a tensor on any device) as a NumPy array (no copy where
    it already is one)."""
    if isinstance(values, np.ndarray):
        return values
    return values.detach().cpu().numpy()


def check_values(size: int, dims: int, finite: Callable[[], bool]) -> None:
    """Refuse features with no values, more than :data:`MAX_SAMPLE_DIMS` dimensions, or
    (``finite()`` false) a non-finite value.

    Parameters
    ----------
    size, dims : int
        How many values the features hold, and their number of dimensions.
    finite : callable
        Whether every value is finite (called only when the rest passed).
    """
    if size == 0:
        raise EventError("the features are empty")
    if dims > MAX_SAMPLE_DIMS:
        raise EventError(f"the features have {dims} dimensions (at most 8)")
    if not finite():
        raise EventError("the features hold NaN or infinity (or a number beyond float32)")


def numeric_array(x: object) -> np.ndarray:
    """``x`` (a NumPy array or nested lists of numbers) as float32, or :class:`EventError`.

    Strings, ``null``, objects, integers beyond float range and ragged or too deeply
    nested lists are refused; numbers beyond float32 become infinity (refused by the
    caller's finiteness check).
    """
    if isinstance(x, np.ndarray):
        array = x
    elif isinstance(x, (list, tuple)):
        try:
            array = np.asarray(x)
        except (ValueError, TypeError, OverflowError, RecursionError):
            raise EventError(
                "the features must be numbers, in nested lists of equal length"
            ) from None
    else:
        raise EventError(f"the features must be a list of numbers, got {describe(x)}")
    if array.dtype.kind not in "biuf":
        raise EventError(
            "the features must be numbers"
            + (" (an integer too large for a float?)" if array.dtype.kind == "O" else "")
        )
    with np.errstate(over="ignore", invalid="ignore"):
        return np.ascontiguousarray(array, dtype=np.float32)


#: a named feature's name: river's dictionaries use strings, and integers (``synth.SEA``)
FeatureName = str | int


class FeatureSchema:
    """Named features in a fixed order: the keys of the first event with named features.

    Parameters
    ----------
    names : sequence of str or int
        The features, in the order they take in the model's input.
    missing : {"error", "zero"}
        What a missing (or ``null``) feature is: a refused event, or 0.
    """

    def __init__(self, names: list[FeatureName], missing: str = "error") -> None:
        if missing not in MISSING:
            raise ConfigError(f"unknown --missing {missing!r}; choose one of error, zero")
        self.names = list(names)
        self.index = {name: position for position, name in enumerate(self.names)}
        self.missing = missing
        #: whether every name is a str: only then can a dictionary's keys be matched to
        #: the names by lookup alone (``True`` would find the int name ``1``)
        self.string_names = all(type(name) is str for name in self.names)

    @classmethod
    def first(cls, x: Mapping[Any, Any], missing: str) -> FeatureSchema:
        """The schema an event's named features fix."""
        if not x:
            raise EventError("the features are an empty object")
        for name in x:
            check_feature_name(name)
        return cls(list(x), missing)

    def vector(self, x: Mapping[Any, Any]) -> np.ndarray:
        """``x``'s values in schema order, as a float32 array (:class:`EventError` for an
        unknown, missing, non-numeric or non-finite feature)."""
        values = self.plain_values(x)
        if values is None:
            values = self.checked_values(x)
        with np.errstate(over="ignore"):
            vector = values.astype(np.float32)
        if not np.isfinite(vector).all():
            name = self.names[int(np.argmin(np.isfinite(vector)))]
            raise EventError(f"feature {name!r} is NaN, infinite or beyond float32")
        return vector

    def plain_values(self, x: Mapping[Any, Any]) -> np.ndarray | None:
        """``x``'s values in schema order when ``x`` has exactly the schema's string names
        and every value is a Python float or int, as most events have (one lookup per
        name, no call per feature: docs/streaming.md, "river"); ``None`` otherwise, for
        :meth:`checked_values`."""
        if not self.string_names or len(x) != len(self.names):
            return None
        try:
            values = [x[name] for name in self.names]
        except KeyError:
            return None
        if not PLAIN_TYPES.issuperset(map(type, values)):
            return None
        try:
            return np.array(values, dtype=np.float64)
        except OverflowError:  # an int beyond a float: checked_values names it
            return None

    def checked_values(self, x: Mapping[Any, Any]) -> np.ndarray:
        """``x``'s values in schema order, every name and value checked one by one."""
        values = np.zeros(len(self.names), dtype=np.float64)
        present = np.zeros(len(self.names), dtype=bool)
        for name, value in x.items():
            # a str first: the check of other names costs a call per feature per event
            position = self.index.get(name) if type(name) is str or is_feature_name(name) else None
            if position is None:
                shown = check_feature_name(name)
                known = ", ".join(map(str, self.names[:5])) + (", …" if len(self.names) > 5 else "")
                raise EventError(
                    f"feature {shown!r} is not among the stream's features (fixed by its "
                    f"first event: {known})"
                )
            if value is None:
                continue
            values[position] = feature_number(name, value)
            present[position] = True
        if not present.all():
            if self.missing == "error":
                absent = self.names[int(np.argmin(present))]
                raise EventError(
                    f"feature {absent!r} is missing (give --missing zero to read it as 0)"
                )
        return values


def is_feature_name(name: object) -> bool:
    """Whether ``name`` may name a feature: a string or an int, as river's dictionaries
    of features have them (``synth.SEA`` numbers its features); a bool would be read as
    the int it equals, so it is not one."""
    return isinstance(name, (str, int)) and not isinstance(name, bool)


def check_feature_name(name: object) -> FeatureName:
    if not is_feature_name(name):
        raise EventError(f"feature names must be strings or integers, got {describe(name)}")
    if isinstance(name, str) and len(name) > MAX_IDENTIFIER_CHARS:
        raise EventError(f"a feature name of {len(name):,} characters (at most 256)")
    return name  # type: ignore[return-value]  # a str or an int (is_feature_name)


def feature_number(name: str, value: object) -> float:
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    if isinstance(value, (int, float, np.integer, np.floating)):
        try:
            return float(value)
        except OverflowError:
            raise EventError(f"feature {name!r} is an integer too large for a float") from None
    raise EventError(f"feature {name!r} must be a number, got {describe(value)}")


# -- one line of JSON -----------------------------------------------------------------------


def parse_line(
    data: bytes | str, line: int, base_dir: Path | None = None, require_client: bool = True
) -> Event | LateLabel | None:
    """The event on one JSON Lines line; ``None`` for a blank line.

    Every failure, whatever its cause (invalid UTF-8, malformed JSON, integers of more
    than 4,300 digits, nesting deeper than the JSON reader takes, values of the wrong
    kind), is an :class:`EventError` naming it: a line can never stop the stream.

    Parameters
    ----------
    data : bytes or str
        The line, without its newline.
    line : int
        Its number (1-based), kept as the sample's identity.
    base_dir : pathlib.Path, optional
        The only folder ``"path"`` entries are read from (``--files-root``): a relative
        path is taken from it, and a path that leads outside it (``..``, an absolute
        path, a symlink) is refused; ``None``: ``"path"`` is refused.
    require_client : bool
        Whether ``"client"`` must be given (a held-out test set needs none).

    Returns
    -------
    Event, LateLabel or None
        An event (``label`` ``None`` when it asks for a prediction), the late label of an
        earlier event, or ``None`` for a blank line.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as error:
        raise EventError(f"not UTF-8 text (byte {error.start + 1})") from None
    if not text.strip(JSON_WHITESPACE):
        return None
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as error:
        raise EventError(f"malformed JSON ({error.msg} at column {error.colno})") from None
    except RecursionError:
        raise EventError("JSON nested too deeply") from None
    except ValueError as error:  # e.g. Python's limit of 4,300 digits for an integer
        raise EventError(f"unreadable JSON ({str(error).split(';')[0]})") from None
    try:
        return event_from(payload, line, base_dir, require_client)
    except RecursionError:
        raise EventError("features nested too deeply") from None


def event_from(
    payload: object, line: int, base_dir: Path | None, require_client: bool
) -> Event | LateLabel:
    """The event a parsed JSON line describes (see :func:`parse_line`)."""
    if not isinstance(payload, dict):
        raise EventError('an event is a JSON object {"client": …, "label": …, "x": […]}')
    has_features = "x" in payload or "path" in payload
    event_id = payload.get("id")
    if event_id is not None:
        event_id = check_identifier(event_id, "id")
    if not has_features and "id" in payload:
        if event_id is None:
            raise EventError("missing id")
        return LateLabel(id=event_id, label=check_label(payload.get("label")), line=line)
    client = check_identifier(payload.get("client"), "client") if require_client else 0
    label = payload.get("label")
    if label is not None or not require_client:
        label = check_label(label)
    if "x" in payload and "path" in payload:
        raise EventError('give the features as "x" or as "path" (a .npy file), not both')
    if not has_features:
        raise EventError('no features: give "x" (a list or an object) or "path" (a .npy file)')
    x = (
        payload["x"]
        if "x" in payload
        else read_npy_row(payload["path"], payload.get("row"), base_dir)
    )
    checked = not isinstance(x, dict)
    if checked:
        x = check_features(x)
    return Event(client=client, label=label, x=x, line=line, id=event_id, checked=checked)


def read_npy_row(path: object, row: object, base_dir: Path | None) -> np.ndarray:
    """The features stored at ``path`` (a ``.npy`` file), or its row ``row``."""
    if not isinstance(path, str) or not path:
        raise EventError('"path" must name a .npy file')
    if base_dir is None:
        raise EventError(
            '"path" is read only under the folder given as --files-root; give --files-root '
            "DIR to read features from .npy files"
        )
    file = base_dir / path
    try:
        # the file as the OS would open it, links followed: an event names no file outside
        # the root the user gave (docs/architecture.md, "Streaming")
        inside = Path(os.path.realpath(file)).is_relative_to(os.path.realpath(base_dir))
    except ValueError as error:  # a NUL byte
        raise EventError(f"cannot read {path!r}: {error}") from None
    if not inside:
        raise EventError(f'"path" {path!r} leads outside --files-root {base_dir}')
    try:
        mode = os.stat(file).st_mode
    except (OSError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) else str(error)
        raise EventError(f"cannot read {file}: {reason}") from None
    if not stat.S_ISREG(mode):  # a FIFO or a device would block the stream, or never end
        raise EventError(f"cannot read {file}: not a regular file")
    try:
        array = np.load(file, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise EventError(f"cannot read {file}: {error}") from None
    if not isinstance(array, np.ndarray):
        raise EventError(f"{file} holds several arrays; give a .npy file")
    if row is not None:
        if array.ndim == 0:
            raise EventError(f'{file} holds one value, so "row" does not apply')
        if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < len(array):
            raise EventError(f'"row" must be an integer in [0, {len(array)}) for {file}')
        array = array[row]
    if array.dtype.kind not in "biuf":
        raise EventError(f"{file} does not hold numbers")
    try:
        return check_features(np.array(array))
    except EventError as error:
        raise EventError(f"{file}: {error}") from None


# -- reading a source -----------------------------------------------------------------------


@dataclass(frozen=True)
class RawLine:
    """One line of a source, as bytes.

    Attributes
    ----------
    number : int
        Its number in the source (1-based).
    data : bytes or None
        Its bytes without the newline; ``None`` for a line longer than the limit, which
        was read past without being kept.
    length : int
        Its length in bytes.
    complete : bool
        Whether it ended with a newline (only the last line of a source may not).
    """

    number: int
    data: bytes | None
    length: int
    complete: bool = True


def read_lines(read: Callable[[int], bytes], max_bytes: int) -> Iterator[RawLine]:
    """The lines of a byte source, in memory bounded by ``max_bytes``.

    Parameters
    ----------
    read : callable
        ``read(n)`` returns up to ``n`` bytes as soon as some are available, and ``b""``
        at the end of the source (``os.read``, ``BufferedReader.read1``).
    max_bytes : int
        A longer line is read past in chunks without being kept and comes as
        ``data=None``.
    """
    number = 0
    pending = bytearray()
    skipped = -1  # bytes of an over-long line read past so far; -1: not in one
    while True:
        chunk = read(READ_CHUNK)
        if not chunk:
            break
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                if skipped >= 0:
                    skipped += len(chunk) - start
                else:
                    pending += chunk[start:]
                    if len(pending) > max_bytes:
                        skipped = len(pending)
                        pending = bytearray()
                break
            piece = chunk[start:end]
            number += 1
            if skipped >= 0:
                yield RawLine(number, None, skipped + len(piece))
                skipped = -1
            elif len(pending) + len(piece) > max_bytes:
                yield RawLine(number, None, len(pending) + len(piece))
                pending = bytearray()
            elif pending:
                pending += piece
                yield RawLine(number, bytes(pending), len(pending))
                pending = bytearray()
            else:
                yield RawLine(number, piece, len(piece))
            start = end + 1
    if skipped >= 0:
        yield RawLine(number + 1, None, skipped, complete=False)
    elif pending:
        yield RawLine(number + 1, bytes(pending), len(pending), complete=False)


def check_source(source: str, flag: str = "--source") -> None:
    """Refuse, without opening it, a source that is not a readable regular file or FIFO."""
    try:
        mode = os.stat(source).st_mode
    except (OSError, ValueError) as error:
        missing = isinstance(error, FileNotFoundError)
        reason = "no such file" if missing else getattr(error, "strerror", None) or str(error)
        raise ConfigError(f"{flag} {source}: {reason}; give a JSON Lines file or -") from None
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        raise ConfigError(f"{flag} {source}: not a file; give a JSON Lines file or -")
    if not os.access(source, os.R_OK):
        raise ConfigError(f"{flag} {source}: cannot open it (Permission denied)")


def open_source(source: str, flag: str = "--source") -> Any:
    """A file opened for :func:`read_lines`: a regular file, or a FIFO (read as a stream,
    like standard input). Anything else is refused in one line.

    Raises
    ------
    ConfigError
        No such file, not readable, or not a file (a folder, a device, a socket).
    """
    check_source(source, flag)
    try:
        return open(source, "rb", buffering=0)
    except OSError as error:
        raise ConfigError(f"{flag} {source}: cannot open it ({error.strerror})") from None


def is_regular_file(source: str) -> bool:
    """Whether ``source`` is a regular file (whose end may still grow), not a pipe."""
    try:
        return source != "-" and stat.S_ISREG(os.stat(source).st_mode)
    except OSError:
        return False


def stdin_reader(stdin: Any) -> Callable[[int], bytes]:
    """``read(n)`` over standard input (or a stand-in), reading bytes so that every line
    is decoded on its own: invalid UTF-8 is one bad line, whatever ``PYTHONIOENCODING``."""
    binary = getattr(stdin, "buffer", stdin)
    if hasattr(binary, "read1"):
        return binary.read1
    if isinstance(binary.read(0), bytes):
        return binary.read
    # a text stream without bytes underneath (a test's io.StringIO): its lines, re-encoded
    return lambda size: stdin.readline().encode("utf-8", "surrogateescape")


# -- a held-out test set ------------------------------------------------------------------


def load_test_set(
    path: str, max_line_bytes: int = 1 << 24, files_root: Path | None = None
) -> tuple[list[Any], list[Identifier]]:
    """A held-out test set in the events' format (``"client"`` not needed); ``"path"``
    entries are read under ``files_root`` only (:func:`parse_line`).

    Returns
    -------
    list, list
        Every sample's features (a tensor, or a dict of named features) and the labels.

    Raises
    ------
    ConfigError
        One line: the file cannot be read or is not a regular file, a line is not a
        labeled sample, or it holds no sample.
    """
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError as error:
        raise ConfigError(f"--test {path}: cannot open it ({error.strerror})") from None
    if not regular:
        raise ConfigError(f"--test {path}: not a regular file")
    features: list[Any] = []
    labels: list[Identifier] = []
    handle = open_source(path, "--test")
    with handle:
        for raw in read_lines(handle.read, max_line_bytes):
            if raw.data is None:
                raise ConfigError(
                    f"--test {path} line {raw.number}: longer than --max-line-bytes "
                    f"({max_line_bytes:,} bytes)"
                )
            try:
                event = parse_line(raw.data, raw.number, files_root, require_client=False)
            except EventError as error:
                raise ConfigError(f"--test {path} line {raw.number}: {error}") from None
            if event is None:
                continue
            if not isinstance(event, Event) or event.label is None:
                raise ConfigError(f"--test {path} line {raw.number}: a test sample needs a label")
            features.append(event.x)
            labels.append(event.label)
    if not features:
        raise ConfigError(f"--test {path} holds no sample")
    return features, labels
