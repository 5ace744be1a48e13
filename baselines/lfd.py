"""LfD, Learning from Drift (Kim & Shin 2022): FedAvg with a drift regulariser in logit space.

The model's final layer is a cosine classifier (normalised features and class weights, no
bias) with temperature ``τ``; in training, the true class's cosine is lowered by a margin
``m`` (Eq. 7). Each client keeps the model it trained the last time it took part. In a
round, for each of its samples, the *drift* between that previous local model and the
received global model, both frozen, is (Eq. 3)

    f_D = log σ(f_prev(x)) − log σ(f_global(x)),

and the auxiliary label is ``ŷ = σ(−f_D)`` with its gradient stopped (Eq. 8). The local
objective is cross-entropy plus the regulariser ``R = −Σ_c ŷ_c log σ(f(x))_c`` (Eqs. 9–10).
The server takes the sample-weighted average (Eq. 2).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from stratify.baselines.fedavg import FedAvg, FedAvgOptions
from stratify.card import Bench, Comparison, Identity, MethodCard, Paper, PaperSetting, Rates
from stratify.client import LocalResult, LossFunction
from stratify.errors import ConfigError
from stratify.method import ClientUpdate, Context
from stratify.nn.cosine import CosineClassifier, margin_logits
from stratify.options import Probe, inherit, option
from stratify.state import State, clone_state, load_into
from stratify.validation import check_nonnegative, check_positive

#: The paper's settings (Sec. 5.1, CIFAR-10): τ = 0.1, m = 0.15, SGD lr 0.01, momentum
#: 0.9, weight decay 1e-5, batch 128, 10 local epochs.
PAPER_TEMPERATURE = 0.1
PAPER_MARGIN = 0.15
PAPER_LR = 0.01
PAPER_WEIGHT_DECAY = 1e-5
PAPER_BATCH_SIZE = 128


def check_margin(value: object, flag: str) -> float:
    """A margin ``m ∈ [0, 1]`` (the paper's range: a cosine is at most 1)."""
    margin = check_nonnegative(value, flag)
    if margin > 1:
        raise ConfigError(f"{flag} must be in [0, 1], got {value!r}")
    return margin


@dataclass
class LfDOptions(FedAvgOptions):
    """FedAvg's options with the LfD paper's defaults, the temperature and the margin."""

    local_batch_size: int | None = inherit(PAPER_BATCH_SIZE)
    local_weight_decay: float = inherit(PAPER_WEIGHT_DECAY)
    cosine_temperature: float = option(
        PAPER_TEMPERATURE,
        "Temperature τ > 0 of the cosine classifier: logits are cos θ / τ.",
        check=check_positive,
        probe=Probe(0.5),
    )
    margin: float = option(
        PAPER_MARGIN,
        "Margin m in [0, 1] taken off the true class's cosine in local training.",
        check=check_margin,
        probe=Probe(0.5),
    )
    drift_weight: float = option(
        1.0,
        "Weight ≥ 0 of the drift regulariser (Eq. 9 adds it with weight 1); 0 trains the "
        "cosine classifier with its margin alone, an ablation of the regulariser.",
        check=check_nonnegative,
        probe=Probe(0.0),
    )


def drift(previous_logits: torch.Tensor, global_logits: torch.Tensor) -> torch.Tensor:
    """Eq. 3: ``f_D = log σ(f_prev) − log σ(f_global)`` per class, ``(N, C)``."""
    return previous_logits.log_softmax(dim=1) - global_logits.log_softmax(dim=1)


def auxiliary_labels(drift_values: torch.Tensor) -> torch.Tensor:
    """Eq. 8: ``ŷ = σ(−f_D)``, detached (no gradient flows into the label)."""
    return (-drift_values).softmax(dim=1).detach()


def drift_regularised_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    auxiliary: torch.Tensor | None,
    weight: float = 1.0,
) -> torch.Tensor:
    """Eq. 9, averaged over the batch: ``CE(f, y) − weight · Σ_c ŷ_c log σ(f)_c``.

    Parameters
    ----------
    logits : torch.Tensor
        ``(N, C)`` training logits of the local model (with the margin, Eq. 7).
    targets : torch.Tensor
        ``(N,)`` true classes.
    auxiliary : torch.Tensor or None
        ``(N, C)`` auxiliary labels ``ŷ``; ``None``: cross-entropy only.
    weight : float
        The regulariser's weight (the paper's 1).
    """
    log_probabilities = logits.log_softmax(dim=1)
    loss = F.nll_loss(log_probabilities, targets)
    if auxiliary is None:
        return loss
    return loss - weight * (auxiliary * log_probabilities).sum(dim=1).mean()


# its paper's E = 10 on Dir(0.5) (its CIFAR-10 β = 0.5), 10 clients, every one a
# round; and what its gain at one local epoch a round (the paired grid's setting) is
# made of: LfD whole, without the drift regulariser (its cosine classifier with
# margin), and without the margin too (the cosine classifier with τ alone), each
# against the same matched FedAvg
PAPER_SETTINGS: tuple[PaperSetting, ...] = (
    PaperSetting(
        "dir-0-5",
        "Dir(0.5), 10 clients, E = 10, 20 rounds",
        {"partition": "dirichlet:0.5", "clients": 10, "epochs": 20, "lr": PAPER_LR},
    ),
    *(
        PaperSetting(
            f"{split_key}-e1",
            f"{split_label}, 10 clients, E = 1, 20 rounds",
            {"partition": split, "clients": 10, "epochs": 20, "lr": PAPER_LR},
            {"local_epochs": 1, **options},
            variant,
        )
        for split, split_key, split_label in (
            ("dirichlet:0.5", "dir-0-5", "Dir(0.5)"),
            ("classes:3", "classes-3", "#C=3"),
        )
        for variant, options in (
            ("", {}),
            ("no drift regulariser", {"drift_weight": 0.0}),
            ("cosine classifier alone", {"drift_weight": 0.0, "margin": 0.0}),
        )
    ),
)


class LfD(FedAvg):
    """LfD: cosine classifier with margin, and a drift regulariser from each client's
    previous local model.

    Options (:class:`LfDOptions`), defaults from the paper (Sec. 5.1): ``τ = 0.1``
    (``cosine_temperature``; the paper's CIFAR-10 and CINIC-10 value, 0.05 on CIFAR-100),
    ``m = 0.15`` (``margin``), SGD lr 0.01 (its card's ``rates.paper_lr``), momentum 0.9, weight
    decay 1e-5, batch 128, E = 10 local epochs, every client in every round, and the
    sample-weighted average of Eq. 2.

    Notes
    -----
    Choices the paper leaves open:

    * **Where τ applies.** "For all softmax functions" is read as: every model's logits
      are ``cos θ/τ`` (the trained model's, the previous local model's and the global
      model's), so ``σ(f_prev)`` and ``σ(f_global)`` in the drift carry ``τ``. The
      auxiliary label ``ŷ = σ(−f_D)`` takes no second temperature (the issue's worked
      example, ``p_prev = (0.8, 0.2)``, ``p_global = (0.6, 0.4)`` → ``ŷ = (3/11, 8/11)``).
    * **Margin.** Only the model being trained has it, in both terms of its loss (Eq. 10
      writes them over one ``σ(f)``); the frozen models' predictions in the drift are
      without margin, as at evaluation ("we use the margin only in the training phase").
    * **A client's first round.** A client that has never trained has no previous local
      model and therefore no drift estimate: it trains on the margin cross-entropy alone.
      (``f_prev := f_global`` would give ``ŷ`` uniform, a label-smoothing term of weight
      one that the paper does not describe.) With ``client_fraction < 1`` the previous
      model is the one from the client's last round, however long ago.
    * **Frozen models** run in eval mode (BatchNorm with running statistics).

    The global model carries the cosine head, so evaluation uses ``cos θ/τ`` without
    margin; it replaces the model's final ``nn.Linear`` in :meth:`setup` (its weights are
    kept, its bias dropped) and is what travels: ``model_bytes`` counts it. The previous
    local models stay on their clients (no traffic) and are in the checkpoint, so a
    resumed run continues exactly. The reported training loss is the regularised one.
    """

    card = MethodCard(
        Identity(
            "lfd",
            "LfD",
            "cosine classifier with margin; drift regulariser from each client's last model",
            modes=("batch",),
        ),
        Comparison("fedavg"),
        paper=Paper(PAPER_SETTINGS),
        # chosen by the `defaults` grids (docs/results/defaults-*.csv)
        rates=Rates(
            tuned={("digits", "batch"): 0.003, ("mnist", "batch"): 0.01}, paper_lr=PAPER_LR
        ),
        bench=Bench(step_size_options=("local_momentum",)),
    )
    options_class = LfDOptions
    options: LfDOptions

    def setup(self, context: Context) -> None:
        install_cosine_head(context.model, self.options.cosine_temperature)
        super().setup(context)
        self.previous_models: dict[int, State] = {}

    def local_round(
        self, context: Context, clients: list[int], rng: np.random.Generator
    ) -> list[ClientUpdate]:
        # the round's frozen global model, and one module the previous models load into
        self.frozen_global = frozen_copy(context.model)
        self.frozen_previous = frozen_copy(context.model)
        return super().local_round(context, clients, rng)

    def local_objective(self, context: Context, client: int) -> LossFunction:
        return self.drift_objective(client, self.frozen_global, self.frozen_previous)

    def drift_objective(
        self, client: int, frozen_global: nn.Module, frozen_previous: nn.Module
    ) -> LossFunction:
        """The client's mini-batch loss: margin cross-entropy, plus the drift regulariser
        once the client has a previous local model (``frozen_previous`` is loaded with it)."""
        margin, temperature = self.options.margin, self.options.cosine_temperature
        weight = self.options.drift_weight
        # without weight the drift is not estimated at all (an ablation run costs no more
        # than FedAvg's)
        previous = self.previous_models.get(client) if weight > 0 else None
        if previous is not None:
            load_into(frozen_previous, previous)

        def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            auxiliary = None
            if previous is not None:
                with torch.no_grad():
                    auxiliary = auxiliary_labels(drift(frozen_previous(x), frozen_global(x)))
            logits = margin_logits(head_cosine(model, x), y, margin, temperature)
            return drift_regularised_loss(logits, y, auxiliary, weight)

        return loss

    def client_update(
        self, context: Context, client: int, model: nn.Module, result: LocalResult
    ) -> ClientUpdate:
        update = super().client_update(context, client, model, result)
        assert update.state is not None
        self.previous_models[client] = clone_state(update.state)
        return update

    def state_dict(self) -> dict[str, Any]:
        previous = {client: clone_state(state) for client, state in self.previous_models.items()}
        return {**super().state_dict(), "previous_models": previous}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.previous_models = {
            int(client): clone_state(model, device=self.device)
            for client, model in state["previous_models"].items()
        }


def install_cosine_head(model: nn.Module, temperature: float) -> None:
    """Replace ``model.head`` (an ``nn.Linear``) by a :class:`CosineClassifier` with its
    weights, or set the temperature of a cosine head already there."""
    head = getattr(model, "head", None)
    if isinstance(head, CosineClassifier):
        head.temperature = temperature
        return
    if not (hasattr(model, "embed") and isinstance(head, nn.Linear)):
        raise ConfigError(
            f"lfd needs a model computed as head(embed(x)) with a linear head; "
            f"{type(model).__name__} is not (use one of the built-in --model choices)"
        )
    model.head = CosineClassifier.from_linear(head, temperature)


def head_cosine(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The cosines of ``model``'s cosine head on the features of ``x``."""
    head, embed = model.head, model.embed
    assert isinstance(head, CosineClassifier), "setup() installs the cosine head"
    assert callable(embed)
    return head.cosine(embed(x))


def frozen_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` in eval mode without gradients: a fixed reference model."""
    frozen = copy.deepcopy(model).eval()
    frozen.requires_grad_(False)
    return frozen
