"""Device-level helpers: where tensors live, backend settings, timing that counts GPU work."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from stratify.errors import ConfigError
from stratify.options import DEVICES


def resolve_device(device: str) -> torch.device:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; ``cuda`` without one is refused."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"unknown --device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "--device cuda asked for, but torch sees no CUDA device; use --device cpu"
        )
    return torch.device(device)


def cpu_backend_now() -> tuple[int, bool]:
    """The process's CPU settings: torch's thread count and whether oneDNN is on."""
    return torch.get_num_threads(), bool(torch.backends.mkldnn.enabled)


def set_cpu_backend(threads: int | None = None, one_dnn: bool | None = None) -> None:
    """Set the process-wide CPU settings; ``None`` leaves one as it is.

    Parameters
    ----------
    threads : int, optional
        torch's intra-op thread count.
    one_dnn : bool, optional
        Whether torch uses oneDNN (``torch.backends.mkldnn``) for its CPU kernels. This
        module is the one place that switches it.
    """
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    if one_dnn is not None:
        # torch annotates this flag as its ContextProp descriptor, whose __set__ takes a bool
        torch.backends.mkldnn.enabled = one_dnn  # type: ignore[assignment]


@contextmanager
def cpu_backend(threads: int | None = None, one_dnn: bool | None = None) -> Iterator[None]:
    """The CPU settings of :func:`set_cpu_backend` for a block, put back as they were
    afterwards (with no argument: whatever the block changes is undone).

    Parameters
    ----------
    threads : int, optional
        torch's thread count in the block (default: unchanged).
    one_dnn : bool, optional
        oneDNN on or off in the block (default: unchanged).
    """
    previous = cpu_backend_now()
    set_cpu_backend(threads, one_dnn)
    try:
        yield
    finally:
        set_cpu_backend(*previous)


def configure_cpu_for_single_sample() -> None:
    """Backend settings that make batch-of-one steps fastest on CPU.

    One thread and oneDNN off: a batch of one is too small to split across threads, and
    oneDNN's per-call set-up costs more than the convolution itself (docs/architecture.md,
    "Performance"). These are process-wide settings.
    """
    set_cpu_backend(threads=1, one_dnn=False)


def single_thread_settings() -> None:
    """The settings every run starts from in a worker: one thread, torch's default
    backends (a single-sample run then turns oneDNN off itself), so a run's numbers do
    not depend on the runs the same process made before it."""
    set_cpu_backend(threads=1, one_dnn=True)


class Timer:
    """Wall-clock seconds of a block, synchronising CUDA so GPU work is counted."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds = 0.0

    def __enter__(self) -> Timer:
        self._sync()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sync()
        self.seconds = time.perf_counter() - self._start

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
