"""Property-based test of stream lines (hypothesis): arbitrary JSON values, sizes and
nesting in every field of an event, and arbitrary bytes as a line.

The property: ``stratify stream`` exits with 0, prints exactly one warning per bad line,
naming its number, and learns every good line. Whether a line is good is decided here,
from the event format docs/streaming.md documents, not by the parser under test. The examples
are derandomised (300 in the suite; ``STRATIFY_STREAM_EXAMPLES=2000`` for a longer
exploration).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stratify.cli.main import main

EXAMPLES = int(os.environ.get("STRATIFY_STREAM_EXAMPLES", "300"))
FEATURES = 3
#: float32's largest finite value
FLOAT32_MAX = 3.4028234663852886e38

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
good_clients = st.integers(-(2**63), 2**63 - 1) | st.text(max_size=256)
good_labels = good_clients | st.booleans()
good_features = st.lists(
    st.floats(-1e30, 1e30, allow_nan=False) | st.integers(-(2**60), 2**60),
    min_size=FEATURES,
    max_size=FEATURES,
)


def is_identifier(value: object, allow_bool: bool = False) -> bool:
    """The rule of docs/streaming.md for clients and labels."""
    if isinstance(value, bool):
        return allow_bool
    if isinstance(value, int):
        return -(2**63) <= value < 2**63
    return isinstance(value, str) and len(value) <= 256


def is_number(value: object) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return abs(value) <= FLOAT32_MAX
    return isinstance(value, float) and abs(value) <= FLOAT32_MAX  # NaN compares false


def bad_features():
    """Values of "x" that are never this stream's features: wrong kinds, wrong counts,
    non-finite or too large numbers, nesting deeper than any sample."""
    wrong_kind = json_values.filter(lambda v: not isinstance(v, list))
    with_non_number = st.lists(json_values, min_size=1, max_size=6).filter(
        lambda v: not all(is_number(item) for item in v)
    )
    wrong_count = st.lists(st.floats(-1e3, 1e3), max_size=40).filter(lambda v: len(v) != FEATURES)
    too_large = st.tuples(
        st.sampled_from([10**39, 10**400, -(10**4000), 1e39, float("inf"), float("nan")]),
        st.integers(0, FEATURES - 1),
    ).map(lambda pair: [pair[0] if i == pair[1] else 1.0 for i in range(FEATURES)])
    deep = st.integers(70, 30_000).map(lambda depth: ("[" * depth + "]" * depth, depth))
    return wrong_kind | with_non_number | wrong_count | too_large | deep


def encode(event: dict) -> bytes:
    x = event.get("x")
    if isinstance(x, tuple):  # deep nesting, written as text
        event = {**event, "x": "__X__"}
        return json.dumps(event).replace('"__X__"', x[0]).encode()
    return json.dumps(event).encode()


@st.composite
def stream_lines(draw):
    """``(lines, good)``: a stream whose first line is good, and which lines are good."""
    lines, good = [], []
    label_types: dict[object, type] = {}
    count = draw(st.integers(1, 12))
    for number in range(count):
        event = {
            "client": draw(good_clients),
            "label": draw(good_labels),
            "x": draw(good_features),
        }
        kind = (
            "good"
            if number == 0
            else draw(
                st.sampled_from(["good", "client", "label", "x", "missing", "bytes", "value"])
            )
        )
        if kind == "client":
            event["client"] = draw(json_values.filter(lambda v: not is_identifier(v)))
        elif kind == "label":
            event["label"] = draw(
                json_values.filter(lambda v: v is not None and not is_identifier(v, True))
            )
        elif kind == "x":
            event["x"] = draw(bad_features())
        elif kind == "missing":
            del event[draw(st.sampled_from(["client", "label", "x"]))]
        if kind == "bytes":
            data = draw(st.binary(min_size=1, max_size=60).filter(is_not_an_object))
        elif kind == "value":
            data = json.dumps(draw(json_values.filter(lambda v: not isinstance(v, dict)))).encode()
        else:
            data = encode(event)
        if kind == "good":
            # 1 after True (0 after False), equal keys of another type, is refused
            first_type = label_types.setdefault(event["label"], type(event["label"]))
            kind = "good" if first_type is type(event["label"]) else "label type"
        lines.append(data)
        good.append(kind == "good")
    return lines, good


def is_not_an_object(data: bytes) -> bool:
    """Bytes that are a line of their own (no newline), not blank (JSON whitespace only),
    and not a JSON object."""
    if b"\n" in data or b"\r" in data or not data.strip(b" \t"):  # JSON's whitespace
        return False
    try:
        return not isinstance(json.loads(data), dict)
    except (ValueError, RecursionError):
        return True


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(stream=stream_lines())
def test_every_good_line_is_learned_and_every_bad_one_is_one_warning(stream):
    lines, good = stream
    with tempfile.TemporaryDirectory() as tmp:
        source, out = Path(tmp) / "events.jsonl", Path(tmp) / "run"
        source.write_bytes(b"\n".join(lines) + b"\n")
        stderr = io.StringIO()
        code = 0
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
            try:
                main(["stream", "--source", str(source), "--out", str(out), "--no-secure",
                      "--device", "cpu", "--mlp-hidden", "4",
                      "--max-line-bytes", "100000"])  # fmt: skip
            except SystemExit as exit_:
                code = exit_.code
        err = stderr.getvalue().splitlines()
        assert code == 0, err
        warnings = [line for line in err if line.startswith("warning: line ")]
        bad = [number for number, ok in enumerate(good, start=1) if not ok]
        assert [int(w.split()[2].rstrip(":")) for w in warnings] == bad, (lines, err)
        assert all(w.endswith("; event skipped") for w in warnings)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["events"] == sum(good) and summary["rejected"] == len(bad)
