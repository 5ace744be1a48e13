"""Small methods that exist only for the tests, registered with
``monkeypatch.setitem(ALGORITHMS, name, "toy_methods:Class")`` where a test needs them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from stratify.baselines.fedavg import FedAvg, FedAvgOptions
from stratify.baselines.fedavgm import FedAvgM
from stratify.baselines.fedprox import FedProx
from stratify.client import LocalResult
from stratify.method import ClientUpdate, Context
from stratify.options import option
from stratify.state import State
from stratify.validation import check_nonnegative


@dataclass
class NoisyFedAvgOptions(FedAvgOptions):
    """FedAvg's options and the standard deviation of the server's noise."""

    algorithm = "noisy-fedavg"

    noise: float = option(
        0.01, "Standard deviation of the noise added to the average.", check=check_nonnegative
    )


class NoisyFedAvg(FedAvg):
    """FedAvg whose server adds Gaussian noise to the averaged parameters (the server step
    of DP-FedAvg), drawn from torch's global generator: a method whose numbers depend on
    that generator, which a checkpoint must carry."""

    name = "noisy-fedavg"
    description = "FedAvg plus Gaussian noise on the average, from torch's generator"
    options_class = NoisyFedAvgOptions
    options: NoisyFedAvgOptions

    def server_update(self, context: Context, average: State) -> State:
        return {
            key: value + self.options.noise * torch.randn_like(value)
            for key, value in average.items()
        }


class ForgetfulFedAvgM(FedAvgM):
    """FedAvgM whose checkpoint leaves out the server's velocity: a resumed run restarts
    the server momentum from zero. A broken method, for the conformance checks to refuse."""

    name = "forgetful-fedavgm"

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        del state["velocity"]
        return state


class GlobalNumpyFedAvg(FedAvg):
    """FedAvg whose server adds noise drawn from numpy's process-wide generator instead of
    the round's: its numbers depend on whatever drew from that generator before, and no
    checkpoint carries it. A broken method, for the conformance checks to refuse."""

    name = "global-numpy-fedavg"

    def server_update(self, context: Context, average: State) -> State:
        return {
            key: value
            + 0.01 * torch.as_tensor(np.random.standard_normal(tuple(value.shape))).to(value.dtype)
            for key, value in average.items()
        }


class OneWayFedAvg(FedAvg):
    """FedAvg that counts only the upload of each participant's model, not the download:
    half the traffic it sends. A broken method, for the conformance checks to refuse."""

    name = "one-way-fedavg"

    def client_update(
        self, context: Context, client: int, model: nn.Module, result: LocalResult
    ) -> ClientUpdate:
        update = super().client_update(context, client, model, result)
        update.stats.transfers = 1
        return update


class DoubleWorkFedProx(FedProx):
    """FedProx whose clients make two passes where its options say one: its local work
    is not what its options (and so its matched comparator) plan."""

    name = "double-work-fedprox"

    @property
    def local_epochs(self) -> int:
        return 2 * super().local_epochs
