"""Small methods that exist only for the tests, registered with
``monkeypatch.setitem(ALGORITHMS, name, "toy_methods:Class")`` where a test needs them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stratify.baselines.fedavg import FedAvg, FedAvgOptions
from stratify.method import Context
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
