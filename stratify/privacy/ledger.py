"""A node's own count of its privacy loss: the (ε, δ) its samples have spent, kept in a
file the node's operator names, so that a server cannot spend more than the node allows
(docs/flower.md, "The node's own budget").

The server calibrates σ for the run's planned uses of a sample; a server that asks for
more epochs, hops or shares than it planned would spend more ε than it reports. A node
with a budget counts every noised use of each of its samples before the update leaves
(spend before send) and refuses the message that would take its ε above the budget.

The bound is the accounting's (:mod:`stratify.privacy.accounting`: no subsampling, each
use one Gaussian mechanism), taken over runs the node cannot tell apart: in each run, for
each σ, the most uses of any one sample at that σ; the ε is that of all these mechanisms
composed (Rényi DP adds over mechanisms), which bounds every sample's, whether or not
another run's partition holds the same samples at the same positions.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from stratify.errors import ConfigError
from stratify.privacy.accounting import composed_epsilon
from stratify.runfolder import write_atomically


def worst_case_spent(runs: Mapping[str, Mapping[str, list[int]]]) -> dict[float, int]:
    """Over ``runs`` (run → σ as text → uses of each of the node's samples), per σ the sum
    over runs of the most uses of one sample: what the samples that were used most, in
    every run, have spent."""
    spent: dict[float, int] = {}
    for by_noise in runs.values():
        for noise, uses in by_noise.items():
            spent[float(noise)] = spent.get(float(noise), 0) + max(uses, default=0)
    return spent


def run_key(client: int, run: str) -> str:
    """The ledger's name of one run of one client: its settings' digest."""
    return f"{client}:{hashlib.sha256(run.encode()).hexdigest()[:16]}"


class Ledger:
    """The JSON file holding a node's noised uses per run, σ and sample, and the ε they
    spend, read and rewritten under an exclusive lock at every charge, so that the fresh
    process a deployed node starts for each message, or two at once, count together.

    Parameters
    ----------
    path : path
        The file (created at the first charge; its folder must exist).
    budget : float
        The most ε the node spends, at ``delta``.
    delta : float
        The node's δ.
    """

    def __init__(self, path: str | os.PathLike, budget: float, delta: float) -> None:
        self.path = Path(path)
        self.budget = float(budget)
        self.delta = float(delta)

    def read(self) -> dict[str, dict[str, list[int]]]:
        """The runs recorded so far (none if the file does not exist yet)."""
        try:
            runs = json.loads(self.path.read_text())["runs"]
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as error:
            # a damaged ledger is never taken as an empty one: that would reset the count
            raise ConfigError(f"cannot read the DP ledger {self.path}: {error!r}") from None
        return runs

    def epsilon(self) -> float:
        """The ε spent so far, at the ledger's δ."""
        return composed_epsilon(worst_case_spent(self.read()), self.delta)

    def charge(self, run: str, noise: float, positions: np.ndarray, size: int) -> float:
        """Count one use at σ = ``noise`` of each entry of ``positions`` (a position twice:
        two uses) among the node's ``size`` samples in ``run``, and return the ε spent
        with them; refuse (one line, nothing counted) if that ε is above the budget.

        Parameters
        ----------
        run : str
            :func:`run_key` of the run.
        noise : float
            σ of the uses.
        positions : numpy.ndarray
            The node's sample positions the message's noised steps use.
        size : int
            How many samples the node holds in the run.
        """
        lock_path = self.path.with_name(f".{self.path.name}.lock")
        with open(lock_path, "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            runs = self.read()
            key = repr(float(noise))
            uses = np.array(runs.get(run, {}).get(key, [0] * size), dtype=np.int64)
            np.add.at(uses, np.asarray(positions, dtype=np.int64), 1)
            charged = {name: dict(by_noise) for name, by_noise in runs.items()}
            charged.setdefault(run, {})[key] = uses.tolist()
            epsilon = composed_epsilon(worst_case_spent(charged), self.delta)
            if epsilon > self.budget:
                spent = composed_epsilon(worst_case_spent(runs), self.delta)
                raise ConfigError(
                    f"this node spends at most ε = {self.budget:g} at δ = {self.delta:g} "
                    f"(--node-config dp-max-epsilon); it has spent {spent:.3g}, and the "
                    f"message's {len(positions)} noised uses at σ = {noise:g} would take "
                    f"it to {epsilon:.3g}"
                )
            document = {"delta": self.delta, "epsilon": epsilon, "runs": charged}
            write_atomically(self.path, json.dumps(document).encode(), 0o600)
        return epsilon
