"""Device-level helpers: where tensors live, backend settings, timing that counts GPU work."""

from __future__ import annotations

import time

import torch

from stratify.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")


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


def configure_cpu_for_single_sample() -> None:
    """Backend settings that make batch-of-one steps fastest on CPU.

    One thread and oneDNN off: a batch of one is too small to split across threads, and
    oneDNN's per-call set-up costs more than the convolution itself (docs/architecture.md,
    "Performance"). These are process-wide settings.
    """
    torch.set_num_threads(1)
    # torch annotates this flag as its ContextProp descriptor, whose __set__ takes a bool
    torch.backends.mkldnn.enabled = False  # type: ignore[assignment]


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
