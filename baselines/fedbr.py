"""FedBR (Guo, Tang & Lin, ICML 2023): federated learning with local learning bias reduction.

Every local iteration of a client takes two steps on one mini-batch ``(x, y)`` and the
pseudo-data ``x_p`` (paper's Algorithm 1, Eqs. 2-7):

* **max step** on the projection head ``θ`` (an MLP ``d → 2d → 2d → d`` on the penultimate
  features ``φ``): gradient *ascent* on the mean contrastive loss ``L_con`` with the
  features detached, so that ``θ`` projects onto a space where local and global features
  differ most;
* **min step** on the feature extractor ``φ_i`` and the classifier ``ω`` with ``θ`` fixed:
  ``CE(x, y) + λ·softCE(x_p, ỹ_p) + μ·L_con``,

with ``L_con = −log(f1 / (f1 + f2))``, ``f1 = exp(cos(Pθφ_i(x_p), Pθφ_g(x_p)) / τ1)``,
``f2 = exp(cos(Pθφ_i(x_p), Pθφ_i(x)) / τ2)`` and ``φ_g`` the global extractor of the round,
frozen. The server averages ``ω``, ``φ`` and ``θ`` uniformly.

Defaults follow the official code, LINs-lab/FedBR, in its current version: commit
``d382a37`` ("minor improve the code", 2023-05-23; the later commits change only the
README and the licence). Where its first public commit ``3e24f7f`` (2023-05-22)
differed, the current one is followed and the difference is named:

* ``λ = 1``, ``μ = 0.5``, ``τ1 = τ2 = 0.5`` (the code multiplies the cosine by 2): the
  same in both commits (``FedBR.update`` in ``fedbr/algorithms.py``);
* ``K = 20`` local iterations per round (``--local_steps 20``, ``scripts/train_fed.py``),
  batch 64 and weight decay 0 on 28×28 images (``hparams_registry.py``): both commits;
* **plain SGD** for both steps, no momentum: ``d382a37`` (``3e24f7f`` used momentum 0.9);
* **lr 1e-3 on 28×28 images** (the registry's ``SMALL_IMAGES``: RotatedMNIST,
  ColoredMNIST) and 1e-2 on the others (``hparams_registry.py``, both commits);
* **one pseudo-data path at a time**, RSM by default: ``d382a37`` builds ``|D_p|`` = batch
  size pseudo-samples, each the mean of 10 samples of one random client, unless
  ``--use_Mixture`` is given, which instead mixes means of a proxy data set with local
  samples (Eq. 4); ``3e24f7f`` always mixed 32 proxy means (and added a decorrelation
  term that ``d382a37`` removed).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from stratify.baselines.common import weighted_average
from stratify.baselines.fedavg import FedAvg, FedAvgOptions
from stratify.card import Bench, Comparison, Identity, MethodCard, Paper, PaperSetting, Rates
from stratify.errors import ConfigError
from stratify.method import ClientUpdate, Context, Round
from stratify.options import Probe, inherit, option
from stratify.state import State, clone_state
from stratify.validation import (
    check_fits_in_memory,
    check_nonnegative,
    check_positive,
    check_positive_int,
)

#: Local iterations per round of the official code (``--local_steps 20``).
OFFICIAL_LOCAL_STEPS = 20

#: The official learning rates: 1e-3 on the 28×28 images of its ``SMALL_IMAGES`` data
#: sets (RotatedMNIST, ColoredMNIST), 1e-2 on the others (``hparams_registry.py``).
OFFICIAL_SMALL_IMAGE_LR = 1e-3
OFFICIAL_LR = 1e-2
SMALL_IMAGE_DATASETS = ("mnist", "mnist-10k", "fashion-mnist", "rotated-mnist", "colored-mnist")

#: The seed-papers grid's rounds of FedBR (its paper: 1,000 on rotated MNIST) and its
#: paper's Table 1 split, at the official rate of its 28×28 images.
PAPER_SETTING_ROUNDS = 300
ROTATED_DIR_0_1 = {
    "dataset": "rotated-mnist",
    "partition": "dirichlet:0.1",
    "clients": 10,
    "epochs": PAPER_SETTING_ROUNDS,
    "lr": OFFICIAL_SMALL_IMAGE_LR,
}

#: Samples averaged into one RSM pseudo-sample in the official code.
OFFICIAL_RSM_SIZE = 10

#: How the pseudo-data is built: random sample means of the clients' data (the official
#: default), or those means mixed with local samples at every iteration (Eq. 4).
PSEUDO_DATA = ("rsm", "mixture")

#: Bytes per element of the pseudo-data and the projection head (float32).
FLOAT_BYTES = 4

FedBROptionsT = TypeVar("FedBROptionsT", bound="FedBROptions")


@dataclass
class FedBROptions(FedAvgOptions):
    """FedAvg's options with the official code's defaults (equal weights, plain SGD, K = 20
    local iterations) and FedBR's.

    A client trains ``local_steps`` K mini-batches per round (the official code's 20)
    unless ``--local-epochs`` is given, which trains that many passes instead.
    """

    weighting: str = inherit("equal")
    local_momentum: float | None = inherit(0.0)
    pseudo_data: str = option(
        "rsm",
        "Pseudo-data: random sample means of the clients' data (rsm, the official default), "
        "or those means mixed with local samples at every iteration (mixture, Eq. 4).",
        choices=PSEUDO_DATA,
        probe=Probe("mixture"),
    )
    pseudo_weight: float = option(
        1.0,
        "Weight λ ≥ 0 of the pseudo-data's soft-label cross-entropy.",
        check=check_nonnegative,
        probe=Probe(0.5),
    )
    contrast_weight: float = option(
        0.5,
        "Weight μ ≥ 0 of the contrastive loss L_con in the min step.",
        check=check_nonnegative,
        probe=Probe(0.1),
    )
    positive_temperature: float = option(
        0.5,
        "Temperature τ1 > 0 of L_con's pair (local, global features of the pseudo-data).",
        check=check_positive,
        probe=Probe(0.1),
    )
    negative_temperature: float = option(
        0.5,
        "Temperature τ2 > 0 of L_con's pair (local features of the pseudo-data, of local data).",
        check=check_positive,
        probe=Probe(0.1),
    )
    rsm_size: int = option(
        OFFICIAL_RSM_SIZE,
        "Samples averaged into one random-sample-mean pseudo-sample.",
        check=check_positive_int,
        probe=Probe(5),
    )
    mixture_size: int | None = option(
        None,
        "Local samples mixed into every pseudo-sample at each iteration (Eq. 4's K; "
        "--pseudo-data mixture only) [default: 1, the official code's].",
        check=check_positive_int,
        cli_type=int,
        probe=Probe(2, {"options": {"pseudo_data": "mixture"}}),
    )

    def for_mode(self: FedBROptionsT, mode: str) -> FedBROptionsT:
        if self.pseudo_data == "rsm" and self.mixture_size is not None:
            raise ConfigError(
                "--mixture-size applies to --pseudo-data mixture; --pseudo-data rsm uses the "
                "random sample means as they are"
            )
        options = self
        if self.local_epochs is None and self.local_steps is None:
            # K iterations: the epoch count FedAvg would resolve does not apply
            options = dataclasses.replace(options, local_steps=OFFICIAL_LOCAL_STEPS)
        if self.pseudo_data == "mixture" and self.mixture_size is None:
            options = dataclasses.replace(options, mixture_size=1)
        return super(FedBROptions, options).for_mode(mode)


# -- the math -----------------------------------------------------------------------------


def projection_head(width: int) -> nn.Sequential:
    """FedBR's projection ``P_θ``: an MLP ``d → 2d → 2d → d`` with ReLU (official code)."""
    return nn.Sequential(
        nn.Linear(width, 2 * width),
        nn.ReLU(),
        nn.Linear(2 * width, 2 * width),
        nn.ReLU(),
        nn.Linear(2 * width, width),
    )


def contrastive_loss(
    local_pseudo: torch.Tensor,
    global_pseudo: torch.Tensor,
    local_data: torch.Tensor,
    positive_temperature: float,
    negative_temperature: float,
) -> torch.Tensor:
    """Mean of ``L_con = −log(f1 / (f1 + f2))`` over pairs (Eqs. 5-7).

    Parameters
    ----------
    local_pseudo, global_pseudo : torch.Tensor
        ``(P, d)`` projected local and global features of the pseudo-data,
        ``P_θ(φ_i(x_p))`` and ``P_θ(φ_g(x_p))``.
    local_data : torch.Tensor
        ``(P, d)`` projected local features ``P_θ(φ_i(x))`` of the local samples paired
        with the pseudo-samples.
    positive_temperature, negative_temperature : float
        ``τ1`` (of ``f1``) and ``τ2`` (of ``f2``).

    Notes
    -----
    ``−log(e^a / (e^a + e^b)) = softplus(b − a)`` with ``a = cos_1/τ1`` and
    ``b = cos_2/τ2``, which stays finite for any temperature.
    """
    positive = F.cosine_similarity(local_pseudo, global_pseudo, dim=1) / positive_temperature
    negative = F.cosine_similarity(local_pseudo, local_data, dim=1) / negative_temperature
    return F.softplus(negative - positive).mean()


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``mean over samples of −Σ_c ỹ_c log softmax(logits)_c`` for soft labels ``ỹ``."""
    return -(targets * F.log_softmax(logits, dim=1)).sum(dim=1).mean()


def random_sample_means(
    x_train: torch.Tensor,
    client_indices: list[np.ndarray],
    count: int,
    samples_per_mean: int,
    rng: np.random.Generator,
) -> torch.Tensor:
    """RSM pseudo-data: ``count`` means of ``samples_per_mean`` local samples each.

    Each pseudo-sample is built by one client drawn uniformly at random, from its own
    samples drawn uniformly with replacement (the RSM over the clients' data that the
    official script keeps commented out), so what leaves a client is a mean of several
    samples, never one sample.

    Parameters
    ----------
    x_train : torch.Tensor
        The training inputs; a client reads only its own indices.
    client_indices : list of numpy.ndarray
        Each client's sample indices.
    count : int
        Number of pseudo-samples ``|D_p|``.
    samples_per_mean : int
        Samples averaged into each.
    rng : numpy.random.Generator
        Draws the clients and their samples.
    """
    owners = rng.integers(0, len(client_indices), size=count)
    chosen = np.stack(
        [rng.choice(client_indices[owner], size=samples_per_mean) for owner in owners]
    )
    picked = torch.as_tensor(chosen, device=x_train.device)
    return x_train[picked.reshape(-1)].reshape(count, samples_per_mean, *x_train.shape[1:]).mean(1)


def mixture(
    pseudo_x: torch.Tensor,
    pseudo_y: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    partners: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 4: ``x̃ = (x_p + Σ_k x_k)/(K+1)``, ``ỹ = (ỹ_p + Σ_k y_k)/(K+1)``.

    Parameters
    ----------
    pseudo_x, pseudo_y : torch.Tensor
        ``(P, …)`` pseudo-samples and their ``(P, C)`` soft labels (``1/C`` each for RSM).
    x, y : torch.Tensor
        Local samples and their ``(n, C)`` one-hot labels.
    partners : torch.Tensor
        ``(P, K)`` indices into ``x``: the local samples mixed into each pseudo-sample.
    """
    mixes = partners.shape[1]
    mixed_x = (pseudo_x + x[partners].sum(dim=1)) / (mixes + 1)
    mixed_y = (pseudo_y + y[partners].sum(dim=1)) / (mixes + 1)
    return mixed_x, mixed_y


# -- the client side ----------------------------------------------------------------------


def embed(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``model.embed(x)``: the penultimate features ``φ(x)`` every toolkit model gives."""
    return cast(Callable[[torch.Tensor], torch.Tensor], model.embed)(x)


class LocalObjective:
    """A FedBR client's objective for one round, as ``LocalTrainer.train``'s ``loss_fn``.

    Each call is one local iteration: it takes the max step on the client's copy of
    ``θ`` (its own SGD optimizer, made afresh each round like the model's) and returns
    the min step's loss, which the trainer back-propagates into ``φ_i`` and ``ω`` only:
    ``θ`` is built into that loss with ``requires_grad`` off, so it stays fixed.

    Parameters
    ----------
    projection : torch.nn.Module
        The client's copy of ``θ``, trained in place.
    global_model : torch.nn.Module
        The round's global model, frozen: ``φ_g = global_model.embed``.
    pseudo_x : torch.Tensor
        The shared pseudo-data ``D_p``.
    num_classes : int
        Number of classes ``C`` (RSM labels are ``1/C`` each).
    options : FedBROptions
        λ, μ, τ1, τ2 and the mixture size.
    lr, momentum, weight_decay : float
        Of the max step's SGD (the same as the client's local SGD, as in the official code).
    rng : numpy.random.Generator
        Draws the local samples mixed into the pseudo-data.
    """

    def __init__(
        self,
        projection: nn.Module,
        global_model: nn.Module,
        pseudo_x: torch.Tensor,
        num_classes: int,
        options: FedBROptions,
        *,
        lr: float,
        momentum: float,
        weight_decay: float,
        rng: np.random.Generator,
    ) -> None:
        self.projection = projection
        self.global_model = global_model
        self.pseudo_x = pseudo_x
        self.pseudo_y = torch.full(
            (len(pseudo_x), num_classes), 1.0 / num_classes, device=pseudo_x.device
        )
        self.num_classes = num_classes
        self.options = options
        self.rng = rng
        self.optimizer = torch.optim.SGD(
            projection.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay
        )
        self.global_rsm_features: torch.Tensor | None = None

    def pseudo_batch(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This iteration's pseudo-data, soft labels and global features ``φ_g(x_p)``."""
        mixes = self.options.mixture_size
        if self.options.pseudo_data == "rsm" or not mixes:
            # RSM: fixed pseudo-data, so φ_g(x_p) is the same all round (the official code
            # computes it once per round too)
            if self.global_rsm_features is None:
                with torch.no_grad():
                    self.global_rsm_features = embed(self.global_model, self.pseudo_x)
            return self.pseudo_x, self.pseudo_y, self.global_rsm_features
        draws = self.rng.integers(0, len(x), size=(len(self.pseudo_x), mixes))
        partners = torch.as_tensor(draws, device=x.device)
        one_hot = F.one_hot(y, self.num_classes).to(self.pseudo_y.dtype)
        pseudo_x, pseudo_y = mixture(self.pseudo_x, self.pseudo_y, x, one_hot, partners)
        with torch.no_grad():
            global_features = embed(self.global_model, pseudo_x)
        return pseudo_x, pseudo_y, global_features

    def contrast(
        self, pseudo_features: torch.Tensor, global_features: torch.Tensor, paired: torch.Tensor
    ) -> torch.Tensor:
        """``L_con`` of the features through the current ``θ``."""
        return contrastive_loss(
            self.projection(pseudo_features),
            self.projection(global_features),
            self.projection(paired),
            self.options.positive_temperature,
            self.options.negative_temperature,
        )

    def max_step(
        self, pseudo_features: torch.Tensor, global_features: torch.Tensor, paired: torch.Tensor
    ) -> None:
        """One SGD step of ``θ`` up the gradient of ``L_con`` on detached features."""
        self.projection.requires_grad_(True)
        self.optimizer.zero_grad()
        (-self.contrast(pseudo_features.detach(), global_features, paired.detach())).backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.projection.requires_grad_(False)

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        pseudo_x, pseudo_y, global_features = self.pseudo_batch(x, y)
        local_features = embed(model, x)
        pseudo_features = embed(model, pseudo_x)
        # pseudo-sample i is contrasted with local sample i (cycling over a short last batch)
        paired = local_features[torch.arange(len(pseudo_x), device=x.device) % len(x)]
        self.max_step(pseudo_features, global_features, paired)
        head = model.head
        assert isinstance(head, nn.Linear)  # setup refuses other models
        return (
            F.cross_entropy(head(local_features), y)
            + self.options.pseudo_weight * soft_cross_entropy(head(pseudo_features), pseudo_y)
            + self.options.contrast_weight * self.contrast(pseudo_features, global_features, paired)
        )


# -- the strategy -------------------------------------------------------------------------


# its paper's Table 1: rotated MNIST, Dir(0.1), 10 clients, every one a round (the paper:
# 1,000 rounds, FedAvg reaching 80% at round 828; 300 here), at the official rate against
# the matched FedAvg (plain SGD) and against FedAvg with the first official commit's
# momentum 0.9; and at the official rate of its other data sets, 1e-2, as a rate check
PAPER_SETTINGS: tuple[PaperSetting, ...] = (
    PaperSetting(
        "rotated-dir-0-1",
        f"rotated-mnist, Dir(0.1), 10 clients, {PAPER_SETTING_ROUNDS} rounds, "
        f"lr {OFFICIAL_SMALL_IMAGE_LR:g} (official)",
        ROTATED_DIR_0_1,
    ),
    PaperSetting(
        "rotated-dir-0-1",
        f"rotated-mnist, Dir(0.1), 10 clients, {PAPER_SETTING_ROUNDS} rounds, "
        f"lr {OFFICIAL_SMALL_IMAGE_LR:g} (official)",
        ROTATED_DIR_0_1,
        variant="against momentum-0.9 FedAvg, first official commit",
        comparator_options={"local_momentum": 0.9},
    ),
    PaperSetting(
        "rotated-dir-0-1-lr-0-01",
        f"rotated-mnist, Dir(0.1), 10 clients, {PAPER_SETTING_ROUNDS} rounds, "
        f"lr {OFFICIAL_LR:g} (the official rate of its larger images)",
        {**ROTATED_DIR_0_1, "lr": OFFICIAL_LR},
    ),
)


class FedBR(FedAvg):
    """FedBR: FedAvg whose clients debias their classifier with pseudo-data and their
    features with a max/min contrastive game through a projection head ``θ``.

    Options: :class:`FedBROptions`, defaults from the official code's current version
    (module docstring: which commit each follows). Batch mode only (its losses need
    mini-batches).

    Notes
    -----
    Choices where the paper and the official code leave room:

    * **Pseudo-data is shared.** ``|D_p|`` = the local batch size, as the official
      ``d382a37`` builds it. It is built once, in the first round, by RSM over the
      clients' data (:func:`random_sample_means`: each pseudo-sample is the mean of
      ``--rsm-size`` samples of one random client, the official default path), and sent
      once to every client; its soft labels are uniform.
    * **Mixture** (``--pseudo-data mixture``; ``--mixture-size`` K, 1 as in the official
      code): at every local iteration each pseudo-sample is mixed with K samples drawn
      from the current mini-batch and its label with theirs (Eq. 4), and ``φ_g`` is
      applied to the mixed sample (the official code keeps the global features of the
      first iteration's mix all round; the loss is defined on the same ``x_p``). The
      official mixture averages a public proxy set (CIFAR-10/100) instead of the
      clients' data, which this toolkit cannot download, so here the means come from the
      clients' data as for RSM; the official code runs mixture only on CIFAR (it raises
      ``NotImplementedError`` on the MNIST variants), so RSM is also the only path it
      runs on 28×28 images.
    * Pseudo-sample ``i`` is paired with local sample ``i`` of the mini-batch in ``f2``
      (cycling if the batch is shorter), as the official code pairs them row by row.
    * ``φ_g`` is a frozen copy of the global model received in the round, in training
      mode like the local model (the same normalisation for both features).
    * The max step uses its own SGD on ``θ`` with the client's rate, momentum and weight
      decay (official ``d382a37``: both optimizers plain SGD at the same rate). Mixup
      (off by default in the official code) is left out.
    * ``θ`` is part of the global state: averaged with the aggregation weights (equal by
      default, Algorithm 1) and saved in the checkpoint with the pseudo-data, so
      ``--resume`` is exact.
    * The reported training loss is the min step's whole objective.
    * The official rate by data set (:meth:`paper_lr`): 1e-3 on the 28×28 MNIST
      variants, 1e-2 on every other data set.
    * The official FedAvg (its ``ERM``) steps with momentum 0.9 while its FedBR steps
      without; a matched comparison here gives FedAvg FedBR's plain SGD
      (:func:`stratify.reproduce.paired.comparator_for`).

    Traffic: FedAvg's 2 model transfers per participant and round, plus ``θ`` down and up
    (2 × its float32 bytes) per participant and round, plus the pseudo-data once in the
    first round: each pseudo-sample uploaded by the client that built it and downloaded
    by every client, ``(K + 1) · |D_p|`` float32 samples, all in ``bytes_sent``.
    """

    card = MethodCard(
        Identity(
            "fedbr",
            "FedBR",
            "FedAvg + pseudo-data: max step on a projection head, min step with soft-label CE "
            "and L_con",
            modes=("batch",),
        ),
        # its K = 20 iterations of 64 a round, not epochs
        Comparison("fedavg", paired_setting={}),
        paper=Paper(PAPER_SETTINGS),
        # chosen by the `defaults` grids (docs/results/defaults-*.csv); its paper's rate
        # depends on the data set (:meth:`paper_lr`)
        rates=Rates(
            tuned={("digits", "batch"): 0.3, ("mnist", "batch"): 0.1},
            note=f"{OFFICIAL_SMALL_IMAGE_LR} on 28×28 images, {OFFICIAL_LR} otherwise",
        ),
        bench=Bench(step_size_options=("local_momentum",)),
    )
    options_class = FedBROptions
    options: FedBROptions

    def paper_lr(self, mode: str, dataset: str | None = None) -> float | None:
        """The official rate: 1e-3 on 28×28 images (the MNIST variants), 1e-2 otherwise;
        ``None`` when the data set is not known (the dataset's default then applies).

        Parameters
        ----------
        mode : str
            The run's mode.
        dataset : str, optional
            The run's dataset.
        """
        if dataset is None:
            return None
        return OFFICIAL_SMALL_IMAGE_LR if dataset in SMALL_IMAGE_DATASETS else OFFICIAL_LR

    def setup(self, context: Context) -> None:
        super().setup(context)
        model = context.model
        head = getattr(model, "head", None)
        if not (callable(getattr(model, "embed", None)) and isinstance(head, nn.Linear)):
            raise ConfigError(
                f"--algorithm fedbr needs a model with features and a linear head "
                f"(cnn, mlp, resnet9, resnet18, resnet20), not {type(model).__name__}"
            )
        self.num_classes = head.out_features
        self.projection = projection_head(head.in_features).to(context.device)
        self.projection.requires_grad_(False)
        self.projection_bytes = FLOAT_BYTES * sum(p.numel() for p in self.projection.parameters())
        self.pseudo_x: torch.Tensor | None = None

    def configure_rounds(
        self, context: Context, epoch: int, rng: np.random.Generator
    ) -> list[Round]:
        rounds = list(super().configure_rounds(context, epoch, rng))
        if self.pseudo_x is None:
            # what the pseudo-data gather at least: an index and a sample per drawn sample
            per_draw = 8 + FLOAT_BYTES * context.x_train[0].numel()
            for flag, draws in (
                ("--rsm-size", self.options.rsm_size),
                ("--mixture-size", self.options.mixture_size or 0),
            ):
                check_fits_in_memory(
                    self.batch_size * draws * per_draw,
                    f"{flag} {draws:,} ({self.batch_size} pseudo-samples of that many samples)",
                    f"use a smaller {flag}",
                )
            self.pseudo_x = random_sample_means(
                context.x_train,
                context.federation.client_indices,
                self.batch_size,
                self.options.rsm_size,
                rng,
            )
            sample_bytes = FLOAT_BYTES * self.pseudo_x[0].numel()
            copies = context.federation.num_clients + 1  # up once, down to every client
            rounds[0].stats.extra_bytes += copies * len(self.pseudo_x) * sample_bytes
        return rounds

    def local_round(
        self, context: Context, clients: list[int], rng: np.random.Generator
    ) -> list[ClientUpdate]:
        assert self.pseudo_x is not None, "configure_rounds builds the pseudo-data"
        global_model = copy.deepcopy(context.model).requires_grad_(False)
        updates = []
        for client in clients:
            model = self.receive(context, client)
            projection = copy.deepcopy(self.projection)
            objective = LocalObjective(
                projection,
                global_model,
                self.pseudo_x,
                self.num_classes,
                self.options,
                lr=context.lr,
                momentum=self.local_momentum,
                weight_decay=self.options.local_weight_decay,
                rng=rng,
            )
            result = self.train_client(context, client, model, rng, loss_fn=objective)
            update = self.client_update(context, client, model, result)
            update.extra["projection"] = clone_state(projection.state_dict())
            update.stats.extra_bytes += 2 * self.projection_bytes
            updates.append(update)
        return updates

    def aggregate(
        self, context: Context, round_: Round, updates: list[ClientUpdate]
    ) -> State | None:
        if updates:
            average = weighted_average(
                [update.extra["projection"] for update in updates], self.weights(updates)
            )
            self.projection.load_state_dict(average)
        return super().aggregate(context, round_, updates)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "projection": clone_state(self.projection.state_dict()),
            "pseudo_x": None if self.pseudo_x is None else self.pseudo_x.detach().clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.projection.load_state_dict(state["projection"])
        pseudo_x = state["pseudo_x"]
        self.pseudo_x = None if pseudo_x is None else pseudo_x.to(self.device)
