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
from stratify.card import Identity
from stratify.client import LocalResult
from stratify.method import ClientUpdate, Context, Round, Strategy
from stratify.options import option
from stratify.state import State
from stratify.validation import check_nonnegative


@dataclass
class NoisyFedAvgOptions(FedAvgOptions):
    """FedAvg's options and the standard deviation of the server's noise."""

    noise: float = option(
        0.01, "Standard deviation of the noise added to the average.", check=check_nonnegative
    )


class NoisyFedAvg(FedAvg):
    """FedAvg whose server adds Gaussian noise to the averaged parameters (the server step
    of DP-FedAvg), drawn from torch's global generator: a method whose numbers depend on
    that generator, which a checkpoint must carry."""

    card = FedAvg.card.derive(
        Identity(
            "noisy-fedavg",
            "Noisy FedAvg",
            "FedAvg plus Gaussian noise on the average, from torch's generator",
        )
    )
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

    card = FedAvgM.card.derive(Identity("forgetful-fedavgm", "Forgetful FedAvgM"))

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        del state["velocity"]
        return state


class GlobalNumpyFedAvg(FedAvg):
    """FedAvg whose server adds noise drawn from numpy's process-wide generator instead of
    the round's: its numbers depend on whatever drew from that generator before, and no
    checkpoint carries it. A broken method, for the conformance checks to refuse."""

    card = FedAvg.card.derive(Identity("global-numpy-fedavg", "Global-numpy FedAvg"))

    def server_update(self, context: Context, average: State) -> State:
        return {
            key: value
            + 0.01 * torch.as_tensor(np.random.standard_normal(tuple(value.shape))).to(value.dtype)
            for key, value in average.items()
        }


class OneWayFedAvg(FedAvg):
    """FedAvg that counts only the upload of each participant's model, not the download:
    half the traffic it sends. A broken method, for the conformance checks to refuse."""

    card = FedAvg.card.derive(Identity("one-way-fedavg", "One-way FedAvg"))

    def client_update(
        self, context: Context, client: int, model: nn.Module, result: LocalResult
    ) -> ClientUpdate:
        update = super().client_update(context, client, model, result)
        update.stats.transfers = 1
        return update


class DoubleWorkFedProx(FedProx):
    """FedProx whose clients make two passes where its options say one: its local work
    is not what its options (and so its matched comparator) plan."""

    card = FedProx.card.derive(Identity("double-work-fedprox", "Double-work FedProx"))

    @property
    def local_epochs(self) -> int:
        return 2 * super().local_epochs


class IdleFedAvg(FedAvg):
    """FedAvg whose clients make no pass over their data (its local epochs come out 0):
    its rounds send models back and forth and nothing trains. A broken method, for the
    conformance checks to refuse."""

    card = FedAvg.card.derive(Identity("idle-fedavg", "Idle FedAvg"))

    @property
    def local_epochs(self) -> int:
        return 0


class PrivateGeneratorFedAvg(FedAvg):
    """FedAvg whose server adds noise drawn from a generator of its own, which its
    checkpoint leaves out: a resumed run draws the first rounds' noise again. A broken
    method, for the conformance checks to refuse."""

    card = FedAvg.card.derive(Identity("private-generator-fedavg", "Private-generator FedAvg"))

    def setup(self, context: Context) -> None:
        super().setup(context)
        self.generator = torch.Generator().manual_seed(0)

    def server_update(self, context: Context, average: State) -> State:
        return {
            key: value + 0.01 * torch.randn(value.shape, generator=self.generator)
            for key, value in average.items()
        }


class MeanLossFedAvg(FedAvg):
    """FedAvg that keeps the mean training loss of its rounds so far, a diagnostic that
    never changes the training. Its checkpoint holds the mean but not how many rounds it
    covers, so a resumed run weighs the restored mean as a single round's: the method
    state of a resumed run is wrong while its weights and metrics are right. A broken
    method, for the conformance checks to refuse."""

    card = FedAvg.card.derive(Identity("mean-loss-fedavg", "Mean-loss FedAvg"))

    def setup(self, context: Context) -> None:
        super().setup(context)
        self.loss_total, self.rounds = 0.0, 0

    def fit(self, context: Context, round_: Round, rng: np.random.Generator) -> list[ClientUpdate]:
        updates = super().fit(context, round_, rng)
        stats = [update.stats for update in updates]
        self.loss_total += sum(s.loss_sum for s in stats) / max(sum(s.loss_count for s in stats), 1)
        self.rounds += 1
        return updates

    def state_dict(self) -> dict[str, Any]:
        mean = self.loss_total / max(self.rounds, 1)
        return {**super().state_dict(), "mean_loss": torch.tensor(mean, dtype=torch.float64)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.loss_total, self.rounds = float(state["mean_loss"]), 1


class StaleLossFedAvg(FedAvg):
    """FedAvg that keeps its last round's training loss in its state but does not restore
    it: a resumed run overwrites it in its first round, so only a state loaded and read
    back shows it lost. A broken method, for the conformance checks to refuse."""

    card = FedAvg.card.derive(Identity("stale-loss-fedavg", "Stale-loss FedAvg"))

    def setup(self, context: Context) -> None:
        super().setup(context)
        self.last_loss = torch.tensor(0.0, dtype=torch.float64)

    def fit(self, context: Context, round_: Round, rng: np.random.Generator) -> list[ClientUpdate]:
        updates = super().fit(context, round_, rng)
        stats = [update.stats for update in updates]
        loss = sum(s.loss_sum for s in stats) / max(sum(s.loss_count for s in stats), 1)
        self.last_loss = torch.tensor(loss, dtype=torch.float64)
        return updates

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "last_loss": self.last_loss.clone()}


@dataclass
class UncheckedNoisyFedAvgOptions(FedAvgOptions):
    """NoisyFedAvg's options with the check of the noise forgotten."""

    noise: float = option(0.01, "Standard deviation of the noise added to the average.")


class UncheckedNoisyFedAvg(NoisyFedAvg):
    """NoisyFedAvg whose ``--noise`` takes any value, a negative or NaN one or a word
    included: bad input that reaches the run instead of being refused in one line. A
    broken method, for the conformance checks to refuse."""

    card = NoisyFedAvg.card.derive(Identity("unchecked-noisy-fedavg", "Unchecked noisy FedAvg"))
    options_class = UncheckedNoisyFedAvgOptions


class UnplannedFedProx(FedProx):
    """FedProx that plans no local work a round: a paired dry run cannot show it doing
    its comparator's work. A broken method, for the conformance checks to refuse."""

    card = FedProx.card.derive(Identity("unplanned-fedprox", "Unplanned FedProx"))

    def planned_sample_gradients(self, client_sizes: list[int]) -> float | None:
        return None


class NamesakeFedAvg(FedAvg):
    """A FedAvg variant that forgot its own label: it would show as FedAvg in every grid
    and table. A broken method, for the declarations check to refuse."""

    card = FedAvg.card.derive(Identity("namesake-fedavg", "FedAvg"))


class UndeclaredMethod(Strategy):
    """A method without a card (:class:`stratify.card.MethodCard`): nothing says its
    label, comparator, test options, ...: a broken method, for the declarations check to
    refuse. Its rounds train nobody."""

    def configure_rounds(
        self, context: Context, epoch: int, rng: np.random.Generator
    ) -> list[Round]:
        return [Round()]

    def fit(self, context: Context, round_: Round, rng: np.random.Generator) -> list[ClientUpdate]:
        return []
