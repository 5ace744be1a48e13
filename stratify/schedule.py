"""The Stratified Label Schedule (SLS): which placeholder the global model learns next."""

from __future__ import annotations

import numpy as np

from stratify.errors import ConfigError

REPEAT_MODES = ("uniform", "proportional")


def label_repeats(
    global_counts: np.ndarray,
    num_train: int,
    mode: str = "uniform",
    cap: int | None = None,
    repeats: int | None = None,
) -> np.ndarray:
    """Number of times ``r_l`` each placeholder appears in one epoch's schedule.

    Parameters
    ----------
    global_counts : numpy.ndarray
        ``n_l``: samples per placeholder over all clients (from the registry).
    num_train : int
        ``N``: training samples held by the clients.
    mode : {"uniform", "proportional"}
        ``uniform``: ``r_l = round(N / |L|)`` (or ``repeats``); ``proportional``:
        ``r_l = min(n_l, cap)`` with ``cap`` defaulting to ``N / |L|``.
    cap : int, optional
        Cap of the proportional mode.
    repeats : int, optional
        Overrides ``r_l`` of the uniform mode.
    """
    num_labels = len(global_counts)
    if num_labels == 0:
        raise ConfigError("the schedule needs at least one label; no client holds any sample")
    if mode == "uniform":
        if cap is not None:
            raise ConfigError("--cap applies to --repeats proportional; use --repeat-count instead")
        per_label = round(num_train / num_labels) if repeats is None else repeats
        if per_label <= 0:
            raise ConfigError(f"label repeats must be positive, got {per_label}")
        return np.full(num_labels, per_label, dtype=np.int64)
    if mode == "proportional":
        if repeats is not None:
            raise ConfigError("--repeat-count applies to --repeats uniform; use --cap instead")
        limit = num_train / num_labels if cap is None else cap
        if limit <= 0:
            raise ConfigError(f"--cap must be positive, got {limit}")
        return np.minimum(np.asarray(global_counts, dtype=np.int64), int(limit))
    raise ConfigError(f"unknown repeats mode {mode!r}; choose one of {', '.join(REPEAT_MODES)}")


def stratified_label_schedule(repeats: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``S = shuffle(concat_l [l] * r_l)``: one epoch's schedule of placeholders.

    Parameters
    ----------
    repeats : numpy.ndarray
        ``r_l`` per placeholder, from :func:`label_repeats`.
    rng : numpy.random.Generator
        Seeded per epoch, so every epoch gets a new, reproducible shuffle.
    """
    schedule = np.repeat(np.arange(len(repeats), dtype=np.int64), repeats)
    return rng.permutation(schedule)
