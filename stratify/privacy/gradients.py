"""Attacks on the training messages, using only what the server saw (a
:class:`~stratify.privacy.views.ServerView`), and their measured recovery.

- Label recovery (the iDLG observation): the gradient of the summed cross-entropy with
  respect to the head's bias is ``Σ_i (softmax_i − onehot(y_i))``. A label absent from
  the message has a positive entry (a sum of probabilities); a present label's entry is
  negative unless the model already gives it most of the mass. So the negative entries
  name labels the message's samples hold, and for one sample the most negative entry
  is its label. Every message also names its positions' placeholders: counting, over
  the messages, how often a placeholder appears with a negative label entry and
  assigning placeholders to labels (a linear assignment) maps every placeholder to a
  label (docs/privacy.md, "Threat model").
- Input reconstruction: for one sample, a linear layer ``z = W x + b`` on the raw input
  has ``∂L/∂W = δ xᵀ`` and ``∂L/∂b = δ``, so any row ``i`` with ``δ_i ≠ 0`` gives
  ``x = (∂L/∂W)_i / (∂L/∂b)_i``: the input exactly, from a one-sample share or from the
  model before and after a one-step hop (``Δ = −lr·∇``; ``lr`` cancels).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from stratify.backend import resolve_device
from stratify.client import LocalTrainer, private_trainer
from stratify.config import TrainConfig
from stratify.data.datasets import load_dataset
from stratify.errors import ConfigError
from stratify.experiment import Experiment, build_experiment
from stratify.nn.models import MLP
from stratify.privacy.accounting import DPSettings, epsilon_spent
from stratify.privacy.aggregate import label_counts_from_bias, match_placeholders
from stratify.privacy.views import (
    GradientMessage,
    RecordingTrainer,
    ServerView,
    Truth,
    placeholder_labels,
)

#: relative error below which an input counts as recovered
RECOVERED_ERROR = 1e-3


def present_labels(bias_gradient: np.ndarray) -> np.ndarray:
    """Labels a message's samples hold, read from its summed head-bias gradient: the
    negative entries (an absent label's entry is a sum of probabilities, positive).

    Parameters
    ----------
    bias_gradient : numpy.ndarray
        ``(C,)``: ``∂ Σ_i loss_i / ∂ b_head``.
    """
    return np.flatnonzero(bias_gradient < 0)


def one_sample_label(bias_gradient: np.ndarray) -> int:
    """The label of a one-sample message: the only negative entry of ``softmax − onehot``
    (iDLG), i.e. the smallest.

    Parameters
    ----------
    bias_gradient : numpy.ndarray
        ``(C,)``: the head bias's gradient of one sample's cross-entropy.
    """
    return int(np.argmin(bias_gradient))


def label_votes(
    messages: Sequence[GradientMessage], num_placeholders: int, head_bias: str = "head.bias"
) -> np.ndarray:
    """How often each placeholder appears in a message whose head-bias gradient names a
    label, over the messages it appears in: ``votes[p, l]`` in ``[0, 1]``.

    A one-sample message names exactly its label (:func:`one_sample_label`); a larger one
    every negative entry (:func:`present_labels`). A placeholder's own label is named in
    (nearly) every message holding it; another label only where the two share a message.

    Parameters
    ----------
    messages : sequence of ShareGradient or HopUpdate
        What the server saw.
    num_placeholders : int
        ``U``.
    head_bias : str
        The name of the head's bias parameter.
    """
    votes: np.ndarray | None = None
    seen = np.zeros(num_placeholders)
    for message in messages:
        gradient = message.summed_gradient()[head_bias].detach().cpu().double().numpy()
        if votes is None:
            votes = np.zeros((num_placeholders, len(gradient)))
        named = np.zeros(len(gradient))
        if len(message.positions) == 1:
            named[one_sample_label(gradient)] = 1.0
        else:
            named[present_labels(gradient)] = 1.0
        for placeholder in np.unique(message.placeholders):
            votes[placeholder] += named
            seen[placeholder] += 1
    if votes is None:
        return np.zeros((num_placeholders, 0))
    return votes / np.maximum(seen, 1)[:, None]


def assign_labels(votes: np.ndarray, seed: int = 0) -> np.ndarray:
    """The placeholder → label map that maximises the summed votes (one label each,
    a linear assignment); ties broken at random (seeded), so a view that names nothing
    maps at chance rather than by index order.

    Parameters
    ----------
    votes : numpy.ndarray
        ``(U, C)``, from :func:`label_votes`.
    seed : int
        Seed of the tie-breaking.

    Returns
    -------
    numpy.ndarray
        ``(U,)``: the label given to every placeholder (``-1`` where none is left).
    """
    from scipy.optimize import linear_sum_assignment

    placeholders, labels = votes.shape
    mapping = np.full(placeholders, -1, dtype=np.int64)
    if labels == 0:
        return mapping
    # far below the smallest vote difference of a view (1 / messages), so only ties move
    jitter = np.random.default_rng(seed).random(votes.shape) * 1e-9
    rows, columns = linear_sum_assignment(votes + jitter, maximize=True)
    mapping[rows] = columns
    return mapping


def recover_labels(view: ServerView, head_bias: str = "head.bias", seed: int = 0) -> np.ndarray:
    """The attacker's map placeholder → label from the view's shares and hops.

    Parameters
    ----------
    view : ServerView
        What the server saw.
    head_bias : str
        The head bias's parameter name.
    seed : int
        Seed of the tie-breaking (:func:`assign_labels`).
    """
    votes = label_votes(view.gradient_messages(), view.num_placeholders, head_bias)
    return assign_labels(votes, seed)


def recover_labels_from_counts(view: ServerView, head_bias: str = "head.bias") -> np.ndarray:
    """The attacker's map placeholder → label from each global batch's SUMMED gradient
    only, as a server behind secure aggregation holds it: every class's count in a batch
    from the head bias (:func:`~stratify.privacy.aggregate.label_counts_from_bias`, with
    the model's mean prediction on the server's own inputs, :attr:`ServerView.predictions`),
    matched across batches to the placeholder counts the server scheduled
    (:func:`~stratify.privacy.aggregate.match_placeholders`).

    Parameters
    ----------
    view : ServerView
        What the server saw, recorded with a ``probe`` (batch mode); its shares are
        summed here, so no single share is read.
    head_bias : str
        The head bias's parameter name.

    Raises
    ------
    ValueError
        A view without batch shares or without the predictions of its batches.
    """
    summed = view.aggregated().shares
    if not summed or any(share.batch not in view.predictions for share in summed):
        raise ValueError("the count attack needs batch shares recorded with a probe")
    label_counts = []
    placeholder_counts = []
    for share in summed:
        size = len(share.positions)
        mean_gradient = share.gradient[head_bias].detach().cpu().numpy() / size
        label_counts.append(
            label_counts_from_bias(mean_gradient, size, view.predictions[share.batch])
        )
        placeholder_counts.append(np.bincount(share.placeholders, minlength=view.num_placeholders))
    return match_placeholders(np.array(placeholder_counts), np.array(label_counts))


def label_recovery(mapping: np.ndarray, truth: Truth) -> float:
    """Share of the placeholders mapped to their real label (chance ``1/C`` for a
    random one-to-one map of ``C`` labels).

    Parameters
    ----------
    mapping : numpy.ndarray
        The attacker's label of every placeholder.
    truth : Truth
        The real labels.
    """
    return float(np.mean(mapping == truth.placeholder_labels))


def one_sample_input(weight_gradient: np.ndarray, bias_gradient: np.ndarray) -> np.ndarray:
    """The input of one sample from its first linear layer's gradient:
    ``(∂L/∂W)_i / (∂L/∂b)_i`` at the row with the largest ``|∂L/∂b_i|`` (the best
    conditioned; any row with ``δ_i ≠ 0`` gives the same).

    Parameters
    ----------
    weight_gradient : numpy.ndarray
        ``(H, F)``: ``∂L/∂W = δ xᵀ``.
    bias_gradient : numpy.ndarray
        ``(H,)``: ``∂L/∂b = δ``.
    """
    row = int(np.argmax(np.abs(bias_gradient)))
    return weight_gradient[row] / bias_gradient[row]


def reconstruct_inputs(view: ServerView, layer: str = "layers.1") -> tuple[np.ndarray, np.ndarray]:
    """Every input the view gives away: one per one-sample share and one-step hop,
    from the raw input's linear layer ``layer`` (the MLP's first, ``layers.1``).

    Parameters
    ----------
    view : ServerView
        What the server saw (the layer's ``weight`` and ``bias`` recorded).
    layer : str
        The module name of the linear layer applied to the flattened input.

    Returns
    -------
    positions : numpy.ndarray
        ``(M,)``: the position each reconstruction claims to be.
    inputs : numpy.ndarray
        ``(M, F)``: the reconstructed inputs, flattened.
    """
    positions, inputs = [], []
    for message in view.gradient_messages():
        if len(message.positions) != 1:
            continue  # several samples' gradients are mixed in every row
        gradient = message.summed_gradient()
        weight = gradient[f"{layer}.weight"].detach().cpu().double().numpy()
        bias = gradient[f"{layer}.bias"].detach().cpu().double().numpy()
        if not np.any(bias):
            continue  # no ReLU unit active: the sample moved nothing in the layer
        positions.append(int(message.positions[0]))
        inputs.append(one_sample_input(weight, bias))
    if not inputs:
        return np.zeros(0, dtype=np.int64), np.zeros((0, 0))
    return np.asarray(positions, dtype=np.int64), np.stack(inputs)


def relative_errors(positions: np.ndarray, inputs: np.ndarray, truth: Truth) -> np.ndarray:
    """``‖x̂ − x‖ / ‖x‖`` of every reconstruction against the real input.

    Parameters
    ----------
    positions, inputs : numpy.ndarray
        From :func:`reconstruct_inputs`.
    truth : Truth
        The real inputs.
    """
    if len(positions) == 0:
        return np.zeros(0)
    index = torch.as_tensor(positions, device=truth.x_train.device)
    real = truth.x_train[index].reshape(len(positions), -1).detach().cpu().double().numpy()
    norms = np.maximum(np.linalg.norm(real, axis=1), 1e-12)
    return np.linalg.norm(inputs - real, axis=1) / norms


def input_recovery(positions: np.ndarray, inputs: np.ndarray, truth: Truth) -> float:
    """Share of the training samples whose input the attacker reconstructs within
    :data:`RECOVERED_ERROR` relative error.

    Parameters
    ----------
    positions, inputs : numpy.ndarray
        From :func:`reconstruct_inputs`.
    truth : Truth
        The real inputs (their count is the denominator).
    """
    errors = relative_errors(positions, inputs, truth)
    recovered = np.unique(positions[errors < RECOVERED_ERROR])
    return len(recovered) / len(truth.x_train)


#: the attacks :func:`attack_run` measures
ATTACKS = ("labels", "labels-aggregated", "labels-counts", "inputs")
#: test samples on which the server computes its model's mean prediction before each
#: global batch (the count attack's estimate of the batch's summed probabilities)
PROBE_SAMPLES = 512
#: the parameters the attacks read: the head's bias, the MLP's first layer
ATTACKED_PARAMETERS = ("head.bias", "layers.1.weight", "layers.1.bias")


@dataclass
class RecordedRun:
    """A trained run and what its server saw.

    Parameters
    ----------
    experiment : Experiment
        The built and trained run.
    view : ServerView
        Its training messages.
    truth : Truth
        The real labels and inputs, for scoring.
    """

    experiment: Experiment
    view: ServerView
    truth: Truth


def record_run(
    config: TrainConfig,
    *,
    trainer: Callable[[torch.Tensor, torch.Tensor], LocalTrainer] = LocalTrainer,
    parameters: Collection[str] | None = ATTACKED_PARAMETERS,
) -> RecordedRun:
    """Build and train ``config``'s run (``config.epochs`` epochs) through a
    :class:`~stratify.privacy.views.RecordingTrainer`.

    Parameters
    ----------
    config : TrainConfig
        The run (its ``validation`` must be 0: the recorder indexes the samples as
        loaded).
    trainer : callable
        ``trainer(x_train, y_train)`` builds the client trainer whose messages are
        recorded (default: plain SGD; a differentially private trainer goes here).
    parameters : collection of str, optional
        The parameters recorded (default: those the attacks read; ``None``: all).

    Raises
    ------
    ConfigError
        A validation split.
    """

    if config.validation:
        raise ConfigError("a recorded run indexes the samples as loaded: leave validation at 0")
    dataset = load_dataset(
        config.dataset,
        data_dir=config.data_dir,
        device=resolve_device(config.device),
        seed=config.seed,
        **config.dataset_options,
    )
    recorder = RecordingTrainer(
        trainer(dataset.x_train, dataset.y_train),
        parameters=parameters,
        probe=dataset.x_test[:PROBE_SAMPLES] if config.mode == "batch" else None,
    )
    experiment = build_experiment(config, dataset=dataset, trainer=recorder)
    recorder.attach(experiment.federation, experiment.placeholders)
    for epoch in range(1, config.epochs + 1):
        experiment.engine.run_epoch(epoch)
    truth = Truth(placeholder_labels(experiment.placeholders), dataset.x_train, dataset.y_train)
    return RecordedRun(experiment, recorder.view, truth)


def attack_run(
    config: TrainConfig,
    attacks: Sequence[str] = ATTACKS,
    *,
    trainer: Callable[[torch.Tensor, torch.Tensor], LocalTrainer] = LocalTrainer,
    seed: int = 0,
) -> dict[str, float]:
    """Train ``config``'s run with its messages recorded, then run the attacks on what
    the server saw.

    Parameters
    ----------
    config : TrainConfig
        The run, trained by :func:`record_run`.
    attacks : sequence of str
        Any of :data:`ATTACKS`: ``labels`` (the placeholder → label map from every share
        and hop, :func:`recover_labels`), ``labels-aggregated`` (the same on the view
        behind secure aggregation, :meth:`ServerView.aggregated`: batch mode only),
        ``inputs`` (inputs from one-sample shares and one-step hops,
        :func:`reconstruct_inputs`: the MLP only).
    trainer : callable
        ``trainer(x_train, y_train)`` builds the client trainer whose messages are
        recorded (default: plain SGD; a differentially private trainer goes here).
    seed : int
        Seed of the label attacks' tie-breaking.

    Returns
    -------
    dict of str to float
        ``accuracy`` (the trained model's test accuracy); with differential privacy,
        ``epsilon`` (spent, at the run's δ) and ``noise-multiplier``; per attack its recovery: for
        the label attacks the share of placeholders mapped to their real label (chance
        ``1/C``), for ``inputs`` the share of training samples reconstructed within
        :data:`RECOVERED_ERROR` relative error, with ``inputs-error`` (the median
        relative error of the reconstructions) and ``one-sample-messages``. ``nan``
        where an attack does not apply (``labels-aggregated`` in single-sample mode,
        ``inputs`` on a model other than the MLP, the label attacks on a model with
        batch-statistics norms, whose shares the recorder does not split: see
        :mod:`stratify.privacy.batchnorm`) or found nothing to read.

    Raises
    ------
    ConfigError
        An unknown attack, or a validation split (:func:`record_run`).
    """

    unknown = sorted(set(attacks) - set(ATTACKS))
    if unknown:
        raise ConfigError(
            f"unknown attack(s) {', '.join(unknown)}; choose from {', '.join(ATTACKS)}"
        )
    run = record_run(config, trainer=trainer)
    experiment, view, truth = run.experiment, run.view, run.truth
    results = {"accuracy": experiment.engine.evaluate()[0]}
    private = private_trainer(experiment.engine.context.trainer)
    if private is not None and isinstance(private.privacy, DPSettings):
        # the (ε, δ) the recorded messages carry, over the most uses of any one sample
        uses = int(private.uses.max(initial=0))
        results["noise-multiplier"] = private.noise_multiplier
        results["epsilon"] = epsilon_spent(private.noise_multiplier, private.privacy.delta, uses)
    if "labels" in attacks:
        # a model with batch-statistics norms: its shares are not recorded (nothing to read)
        results["labels"] = (
            label_recovery(recover_labels(view, seed=seed), truth)
            if view.gradient_messages()
            else float("nan")
        )
    if "labels-aggregated" in attacks:
        aggregated = view.aggregated()
        results["labels-aggregated"] = (
            label_recovery(recover_labels(aggregated, seed=seed), truth)
            if aggregated.shares
            else float("nan")
        )
    if "labels-counts" in attacks:
        results["labels-counts"] = (
            label_recovery(recover_labels_from_counts(view), truth)
            if view.shares and view.predictions
            else float("nan")
        )
    if "inputs" in attacks:
        nan = float("nan")
        results.update({"inputs": nan, "inputs-error": nan, "one-sample-messages": nan})
        if isinstance(experiment.model, MLP):
            positions, inputs = reconstruct_inputs(view)
            errors = relative_errors(positions, inputs, truth)
            results["one-sample-messages"] = float(len(positions))
            results["inputs"] = input_recovery(positions, inputs, truth)
            results["inputs-error"] = float(np.median(errors)) if len(errors) else nan
    return results
