"""The averaging baselines' shared pieces (baselines/common.py): averaging math, client
sampling and the local-training options every method checks."""

import numpy as np
import pytest
import torch

from stratify.baselines.common import participants, weighted_average
from stratify.baselines.fedavg import FedAvg
from stratify.baselines.fedavgm import FedAvgM
from stratify.baselines.fedprox import FedProx
from stratify.baselines.fedtan import FedTAN
from stratify.baselines.scaffold import Scaffold
from stratify.baselines.sfl import SFL
from stratify.errors import ConfigError

# -- shared math --------------------------------------------------------------------------


def test_weighted_average_by_hand():
    states = [
        {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)},
        {"w": torch.tensor([4.0, 8.0]), "n": torch.tensor(6)},
    ]
    average = weighted_average(states, [1, 2])
    assert torch.allclose(average["w"], torch.tensor([3.0, 6.0]))
    assert average["n"].dtype == torch.long and int(average["n"]) == 5


def test_participants_fraction():
    rng = np.random.default_rng(0)
    assert participants(10, 1.0, rng).tolist() == list(range(10))
    chosen = participants(10, 0.3, rng)
    assert len(chosen) == 3 and len(set(chosen.tolist())) == 3
    assert len(participants(10, 0.01, rng)) == 1


# -- bad options (every registered method: tests/test_testing.py) -------------------------


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: FedAvg(local_epochs=0), "--local-epochs must be a positive integer"),
        (lambda: FedAvg(local_batch_size=-2), "--local-batch-size must be a positive integer"),
        (lambda: FedAvg(client_fraction=0.0), "--client-fraction must be in"),
        (lambda: FedAvg(client_fraction=1.5), "--client-fraction must be in"),
        (lambda: FedAvg(bn_buffers="drop"), "unknown --bn-buffers"),
        (lambda: FedProx(mu=-1), "--mu must be a non-negative"),
        (lambda: FedAvgM(server_momentum=1.0), "--server-momentum must be in"),
        (lambda: FedAvgM(server_lr=0), "--server-lr must be a positive"),
        (lambda: Scaffold(server_lr=-1), "--server-lr must be a positive"),
        (lambda: SFL(local_epochs=0), "--local-epochs must be a positive integer"),
        (lambda: FedTAN(local_batch_size=0), "--local-batch-size must be a positive integer"),
    ],
)
def test_bad_options_are_config_errors(build, message):
    with pytest.raises(ConfigError, match=message):
        build()
