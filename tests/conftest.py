import os
from pathlib import Path

import pytest
import torch

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


@pytest.fixture
def shared_data_dir() -> str:
    assert (SHARED_DATA / "mnist").is_dir(), f"the shared data folder {SHARED_DATA} is missing"
    return str(SHARED_DATA)
