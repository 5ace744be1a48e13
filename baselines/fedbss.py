"""FedBSS (Xu, Li, Wu & Ren 2025): FedAvg with bias-aware, progressively paced samples.

Stage 1 ("diversified knowledge acquisition") is ``warmup_rounds`` rounds of plain local
training on all samples. Stage 2 ("progressive knowledge learning"), once per round for
every participant, with the model it received, in eval mode:

1. per sample, the loss ``S_i`` (cross-entropy) and the uncertainty
   ``a_i = 1 − (max p − min p)`` of the softmax ``p`` (Eq. 4);
2. the samples sorted by loss, ascending (Eq. 3); the split point ``i* = argmax a_i``
   (Eq. 5); the *unbiased* set is the samples with ``S_i ≤ S_{i*}``, the *biased* set
   the rest, kept in ascending loss;
3. local epoch ``e = 1..E`` trains on the unbiased set plus the ``⌊α_e·|biased|⌋``
   lowest-loss biased samples, ``α_e = (1 − cos(πe/E))/2`` (Eq. 6), so the last epoch
   trains on everything.

The server averages the participants' models without weights (Alg. 1, line 12).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from stratify.baselines.fedavg import FedAvg, FedAvgOptions
from stratify.card import (
    Bench,
    Comparison,
    Identity,
    MethodCard,
    Paper,
    PaperSetting,
    Rates,
    Testing,
)
from stratify.errors import ConfigError
from stratify.method import ClientUpdate, Context
from stratify.options import Probe, inherit, option
from stratify.validation import (
    check_int,
)

#: The paper's local training ("Implementation Details"): E = 10, batch 64, SGD with
#: lr 1e-3, momentum 1e-4 and weight decay 1e-5, 10% of 100 clients per round.
PAPER_LOCAL_EPOCHS = 10
PAPER_BATCH_SIZE = 64
PAPER_LR = 1e-3
PAPER_MOMENTUM = 1e-4
PAPER_WEIGHT_DECAY = 1e-5
PAPER_CLIENT_FRACTION = 0.1
#: The paper warms up for 50 of its 200 rounds ("we set the number of warmup rounds to 50").
PAPER_WARMUP_ROUNDS = 50
PAPER_ROUNDS = 200

#: Samples scored per forward pass when a client splits its data (bounds the memory).
SCORING_BATCH = 1024


FedBSSOptionsT = TypeVar("FedBSSOptionsT", bound="FedBSSOptions")


def check_warmup(value: object, flag: str) -> int:
    """A number of warm-up rounds: an integer ≥ 0."""
    return check_int(value, flag, minimum=0)


@dataclass
class FedBSSOptions(FedAvgOptions):
    """FedAvg's options with the FedBSS paper's defaults, and ``warmup_rounds``."""

    local_epochs: int | None = inherit(PAPER_LOCAL_EPOCHS)
    local_batch_size: int | None = inherit(PAPER_BATCH_SIZE)
    local_momentum: float | None = inherit(PAPER_MOMENTUM)
    local_weight_decay: float = inherit(PAPER_WEIGHT_DECAY)
    client_fraction: float = inherit(PAPER_CLIENT_FRACTION)
    weighting: str = inherit("equal")
    warmup_rounds: int = option(
        PAPER_WARMUP_ROUNDS,
        "Rounds of plain local training before the paced sample selection starts (the "
        "paper: 50 of its 200 rounds); at most --epochs.",
        check=check_warmup,
        probe=Probe(2),
    )

    def for_mode(self: FedBSSOptionsT, mode: str) -> FedBSSOptionsT:
        """Local epochs only: the pacing adds biased samples epoch by epoch."""
        if self.local_steps is not None:
            raise ConfigError(
                "--local-steps does not apply to --algorithm fedbss: its pacing admits biased "
                "samples epoch by epoch; use --local-epochs"
            )
        return super().for_mode(mode)


def uncertainty(probabilities: torch.Tensor) -> torch.Tensor:
    """Eq. 4: ``1 − (max_c p_c − min_c p_c)`` of each row of ``(N, C)`` probabilities."""
    return 1.0 - (probabilities.max(dim=1).values - probabilities.min(dim=1).values)


def split_by_uncertainty(
    losses: np.ndarray, uncertainties: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Eqs. 3 and 5: the unbiased and the biased samples, each in ascending loss.

    Parameters
    ----------
    losses, uncertainties : numpy.ndarray
        ``S_i`` and ``a_i`` of a client's samples, one entry per sample.

    Returns
    -------
    tuple of numpy.ndarray
        Positions into ``losses`` of the unbiased set (``S_i ≤ S_{i*}``) and of the
        biased set (the rest), each sorted by ascending loss.

    Notes
    -----
    Choices the paper leaves open: equal losses keep their original order (a stable
    sort); among equally uncertain samples the split point ``i*`` is the one with the
    lowest loss (the first in ascending order); every sample whose loss equals
    ``S_{i*}`` is unbiased. The unbiased set is never empty (it holds ``i*``); the biased
    set is empty when ``i*`` has the highest loss, and every epoch then trains on all.
    """
    order = np.argsort(losses, kind="stable")
    sorted_losses = losses[order]
    split = sorted_losses[int(np.argmax(uncertainties[order]))]
    count = int(np.searchsorted(sorted_losses, split, side="right"))
    return order[:count], order[count:]


def pacing(epoch: int, epochs: int) -> float:
    """Eq. 6: ``α_e = (1 − cos(π e / E)) / 2``, the share of biased samples in epoch ``e``."""
    return (1.0 - math.cos(math.pi * epoch / epochs)) / 2.0


def paced_count(alpha: float, biased: int) -> int:
    """``⌊α · |biased|⌋``, robust to rounding: ``α_5`` of ``E = 10`` is 0.49999999999999994
    in floating point, which must still take half of an even-sized biased set."""
    return min(biased, math.floor(alpha * biased + 1e-9))


def paced_epochs(unbiased: np.ndarray, biased: np.ndarray, epochs: int) -> list[np.ndarray]:
    """The samples of each local epoch ``e = 1..E``: the unbiased set and the
    ``⌊α_e·|biased|⌋`` first (lowest-loss) biased samples (Eq. 6)."""
    return [
        np.concatenate([unbiased, biased[: paced_count(pacing(epoch, epochs), len(biased))]])
        for epoch in range(1, epochs + 1)
    ]


@torch.no_grad()
def score_samples(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = SCORING_BATCH
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-sample cross-entropy, uncertainty (Eq. 4) and correctness of ``model`` in eval
    mode. The model is put back in training mode afterwards."""
    model.eval()
    losses, uncertainties, correct = [], [], []
    for start in range(0, len(x), batch_size):
        logits = model(x[start : start + batch_size])
        targets = y[start : start + batch_size]
        losses.append(F.cross_entropy(logits, targets, reduction="none"))
        uncertainties.append(uncertainty(logits.softmax(dim=1)))
        correct.append(logits.argmax(dim=1) == targets)
    model.train()
    return (
        torch.cat(losses).cpu().numpy(),
        torch.cat(uncertainties).cpu().numpy(),
        torch.cat(correct).cpu().numpy(),
    )


# its paper's shards of 2 labels, E = 10, batch 64, 200 rounds with 50 of warm-up, on the
# 8,000 training images at hand: 12 clients of about 670 samples, so that a client takes
# about 110 local steps a round as in the paper (600 samples, E = 10, batch 64), 4 of them
# a round; at its rate and at 10× it, so that stage 2 can start from a warm model well
# above chance (the summary's warm_test_accuracy tells which did)
PAPER_SETTINGS: tuple[PaperSetting, ...] = tuple(
    PaperSetting(
        f"shards-2-12-clients{suffix}",
        f"shards:2, 12 clients (about 110 local steps a round), 4 a round, "
        f"{PAPER_ROUNDS} rounds, {PAPER_WARMUP_ROUNDS} warm-up, lr {rate}",
        {"partition": "shards:2", "clients": 12, "epochs": PAPER_ROUNDS, **values},
        {"client_fraction": 1 / 3, "warmup_rounds": PAPER_WARMUP_ROUNDS},
    )
    for suffix, rate, values in (
        ("", f"{PAPER_LR:g} (its paper's)", {"lr": PAPER_LR}),
        ("-lr-0-01", "0.01", {"lr": 0.01}),
    )
)


class FedBSS(FedAvg):
    """FedBSS: warm-up rounds of local training on all samples, then, per round, each
    participant trains on its loss-sorted samples paced from unbiased to biased.

    Options (:class:`FedBSSOptions`), defaults from the paper's "Implementation Details":
    E = 10 local epochs, batch 64, SGD with lr 1e-3 (its card's ``rates.paper_lr``; on ``digits``
    and the MNIST family the ``defaults`` grids' rates, ``rates.tuned``), momentum 1e-4
    and weight decay 1e-5 (the paper states SGD, so no other optimizer is used), client
    fraction 0.1 (the paper's 10 of 100 clients), unweighted aggregation (Alg. 1,
    line 12; ``--weighting equal``, also in the warm-up). ``warmup_rounds``: the paper's
    50 of 200 rounds, a number of rounds whatever the run's length, so a tuning run and
    the run it tunes warm up alike (a tuning run is at least ``warmup_rounds + 2``
    rounds long, :meth:`informative_epochs`).

    Notes
    -----
    A warm-up longer than the run is refused when the configuration is made; one equal
    to it makes every round a warm-up round. With one local epoch (``E = 1``) the pacing
    gives ``α_1 = 1``: every round trains on all samples and only the unweighted average
    is left of the method. The split and pacing are in
    :func:`split_by_uncertainty` and :func:`paced_epochs` (ties and an empty biased set
    are described there). The scoring pass is a forward pass over the client's data and
    is not counted as steps. Each stage-2 round reports (``info`` in ``metrics.jsonl``)
    the share of the participants' samples in the biased set and how many of them the
    received model classifies correctly; the summary gives the test accuracy of the warm
    model, the global model at the end of the last warm-up round, so a run shows whether
    the split had a model to act on. Traffic: as FedAvg, the model down and up per
    participant and round.
    """

    card = MethodCard(
        Identity(
            "fedbss",
            "FedBSS",
            "FedAvg warm-up, then per-client loss-sorted samples paced by uncertainty split",
            modes=("batch",),
        ),
        Comparison(
            "fedavg",
            # the comparison grids train every client each round (its paper samples 10% of
            # 100 clients: one a round of a grid's 10, a tenth of the others' budget) and warm
            # up a quarter of the rounds, as its paper's 50 of 200: 7 of the Stratify grids' 30
            grid_options={"client_fraction": 1.0, "warmup_rounds": 7},
            grid_label="C=1",
            # E = 10 (with E = 1 its pacing α_1 = 1 trains on every sample and its mechanism
            # could not act) and one client a round, whose ten local epochs cost no more than
            # the others' ten clients; a quarter of the paired grid's 20 rounds of warm-up
            paired_setting={"warmup_rounds": 5},
        ),
        paper=Paper(PAPER_SETTINGS),
        # chosen by the `defaults` grids (docs/results/defaults-*.csv)
        rates=Rates(tuned={("digits", "batch"): 0.1, ("mnist", "batch"): 0.03}, paper_lr=PAPER_LR),
        # the paper's 50 warm-up rounds are longer than a conformance case's run
        testing=Testing(options={"warmup_rounds": 1}),
        bench=Bench(step_size_options=("local_momentum",)),
    )
    options_class = FedBSSOptions
    options: FedBSSOptions

    def setup(self, context: Context) -> None:
        super().setup(context)
        if context.total_epochs is not None:
            self.check_epochs(context.total_epochs)
        self.round_scores: list[tuple[int, int, int]] = []

    def check_epochs(self, epochs: int) -> None:
        warmup = self.options.warmup_rounds
        if warmup > epochs:
            raise ConfigError(
                f"--warmup-rounds {warmup} is longer than the run (--epochs {epochs}); give "
                f"at most {epochs} (the paper warms up {PAPER_WARMUP_ROUNDS} of its 200 rounds)"
            )

    def informative_epochs(self) -> int:
        return self.warmup_rounds + 2

    @property
    def warmup_rounds(self) -> int:
        return self.options.warmup_rounds

    def local_round(
        self, context: Context, clients: list[int], rng: np.random.Generator
    ) -> list[ClientUpdate]:
        self.round_scores = []
        if context.epoch <= self.warmup_rounds:
            return super().local_round(context, clients, rng)
        return [self.paced_client(context, client, rng) for client in clients]

    def epoch_info(self, context: Context) -> dict[str, Any]:
        """The stage, and in stage 2 the share of the participants' samples in the biased
        set and the share the received model classified correctly when scoring."""
        if context.epoch <= self.warmup_rounds or not self.round_scores:
            return {"stage": 1}
        biased, correct, total = (sum(values) for values in zip(*self.round_scores))
        return {"stage": 2, "biased_share": biased / total, "scored_accuracy": correct / total}

    def summarize(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """The warm-up, the warm model's test accuracy (end of the last warm-up round; None
        without a warm-up) and the mean biased share over the stage-2 rounds."""
        warm = next((r for r in records if r["epoch"] == self.warmup_rounds), None)
        shares = [r["info"]["biased_share"] for r in records if "biased_share" in r.get("info", {})]
        return {
            "warmup_rounds": self.warmup_rounds,
            "warm_test_accuracy": None if warm is None else warm["test_accuracy"],
            "biased_share_mean": sum(shares) / len(shares) if shares else None,
        }

    def paced_client(self, context: Context, client: int, rng: np.random.Generator) -> ClientUpdate:
        """One participant's stage-2 round: score, split, train epoch by epoch."""
        model = self.receive(context, client)
        indices = context.federation.client_indices[client]
        positions = torch.as_tensor(indices, device=context.device)
        losses, uncertainties, correct = score_samples(
            model, context.x_train[positions], context.y_train[positions]
        )
        unbiased, biased = split_by_uncertainty(losses, uncertainties)
        self.round_scores.append((len(biased), int(correct.sum()), len(indices)))
        per_epoch = [indices[part] for part in paced_epochs(unbiased, biased, self.local_epochs)]
        result = self.train_client(context, client, model, rng, indices=per_epoch)
        return self.client_update(context, client, model, result)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "warmup_rounds": self.warmup_rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        # a checkpoint of a version that resolved the warm-up from --epochs keeps its own
        self.options = dataclasses.replace(self.options, warmup_rounds=int(state["warmup_rounds"]))
