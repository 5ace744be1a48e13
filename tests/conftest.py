import os
from pathlib import Path

import pytest
import torch

from stratify.backend import cpu_backend

# tests run small tensors: one thread is fastest and immune to OpenMP oversubscription when
# the machine is busy (two threads made some tests 10-30x slower under load)
torch.set_num_threads(1)

# parametrisation of device-agnostic tests; the CUDA cases skip where torch sees no GPU
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    ),
]

# ../shared/data beside the project (CI and development); STRATIFY_DATA_DIR overrides it
SHARED_DATA = Path(
    os.environ.get("STRATIFY_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data")
)
MNIST_FILES = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


@pytest.fixture(autouse=True)
def restore_torch_backend_settings():
    """Process-wide torch settings that code under test may change (e.g.
    ``stratify.backend.configure_cpu_for_single_sample`` sets one thread and switches
    oneDNN off) are put back after every test, so no test depends on the order."""
    dtype = torch.get_default_dtype()
    tf32 = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    with cpu_backend():  # threads and oneDNN
        yield
    torch.set_default_dtype(dtype)
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32


@pytest.fixture
def shared_data_dir() -> str:
    """The folder holding ``mnist/``; tests using it are marked ``@pytest.mark.data``.

    Without the MNIST files the test is skipped, or fails where ``STRATIFY_REQUIRE_DATA=1``
    (CI), so that a missing data folder cannot silently turn the real-data tests off there.
    """
    if not all((SHARED_DATA / "mnist" / name).is_file() for name in MNIST_FILES):
        message = (
            f"MNIST files not found in {SHARED_DATA}; set STRATIFY_DATA_DIR to a folder "
            "holding mnist/t10k-*-idx?-ubyte.gz"
        )
        if os.environ.get("STRATIFY_REQUIRE_DATA") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return str(SHARED_DATA)


def assert_refused_in_one_line(capsys, command: list[str], message: str, out: Path) -> None:
    """``stratify COMMAND`` exits with code 2, one line on stderr holding ``message``,
    and creates no run folder ``out``."""
    from stratify.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(command)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


# -- the tiers: `make test` runs everything, `make test-fast` (-m "not slow") a fast slice
# (docs/development.md, "Tests")

#: the tests a full run's record measured slow (tests/tiers.py writes it)
SLOW_LIST = Path(__file__).with_name("slow_tests.txt")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--durations-file",
        metavar="PATH",
        help="write every test's seconds (setup, call and teardown summed) to PATH, "
        "one 'SECONDS NODEID' line each, slowest first (tests/tiers.py reads it)",
    )


def recorded_slow() -> set[str]:
    """The node ids listed in :data:`SLOW_LIST` (comments and blank lines skipped)."""
    if not SLOW_LIST.is_file():
        return set()
    lines = SLOW_LIST.read_text(encoding="utf-8").splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def method_of(item: pytest.Item) -> str | None:
    """The registered method a test is parametrised over (a ``case`` parameter that is a
    :class:`stratify.testing.MethodCase`), or ``None``."""
    callspec = getattr(item, "callspec", None)
    case = callspec.params.get("case") if callspec is not None else None
    return getattr(case, "algorithm", None) if hasattr(case, "mode") else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` the tests :data:`SLOW_LIST` names and, of every test parametrised
    over the registered methods, all cases of a method but its first one not listed
    slow: the fast tier keeps one case per method, and grows by one test, not by every
    mode, option and check, with each new method."""
    slow = recorded_slow()
    kept: set[tuple[str, str]] = set()
    for item in items:
        algorithm = method_of(item)
        key = (item.nodeid.split("[")[0], algorithm or "")
        if item.nodeid in slow or (algorithm is not None and key in kept):
            item.add_marker(pytest.mark.slow)
        elif algorithm is not None:
            kept.add(key)


#: node id -> seconds, filled while the tests run when --durations-file is given; under
#: pytest-xdist the controlling process receives every worker's reports, so its record is
#: the whole run's
_DURATIONS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration


def is_xdist_worker(config: pytest.Config) -> bool:
    """Whether this process is one of pytest-xdist's workers (``-n``), not the process
    that controls them."""
    return hasattr(config, "workerinput")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = session.config.getoption("--durations-file")
    # a worker's record is its share of the run: the controlling process writes the whole
    if path is None or not _DURATIONS or is_xdist_worker(session.config):
        return
    record = Path(path)
    record.parent.mkdir(parents=True, exist_ok=True)
    ranked = sorted(_DURATIONS.items(), key=lambda entry: -entry[1])
    record.write_text("".join(f"{seconds:.3f} {node}\n" for node, seconds in ranked))
