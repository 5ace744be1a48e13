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
