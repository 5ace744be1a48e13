"""A validation split carved from the training samples, to choose without the test set.

:func:`stratified_holdout` picks, per label, a share of the training samples;
:func:`holdout_validation` returns the dataset training on the rest, its test set
untouched, and the held-out samples as an :class:`EvaluationSet`. A run evaluates on
both every epoch, so an epoch or a learning rate can be chosen on the validation split
and the test accuracy read only where it was chosen (docs/architecture.md, "Data flow").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from stratify.data.datasets import Dataset

# the holdout draws from its own stream of the run's seed, so it does not repeat the
# partition's draws (which use the seed alone)
HOLDOUT_STREAM = 7919


def stratified_holdout(
    labels: np.ndarray, share: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted indices ``(kept, held_out)``: per label, ``round(share · n_l)`` samples held out.

    Parameters
    ----------
    labels : numpy.ndarray
        Training labels, one per sample.
    share : float
        Share of every label's samples to hold out, in ``[0, 1)``; at least one sample of
        every label is kept for training.
    seed : int
        Seeds which samples are held out.
    """
    rng = np.random.default_rng([seed, HOLDOUT_STREAM])
    held: list[np.ndarray] = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        count = min(int(round(share * len(members))), len(members) - 1)
        held.append(rng.permutation(members)[:count])
    held_out = np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
    kept = np.setdiff1d(np.arange(len(labels)), held_out)
    return kept, held_out


@dataclass
class EvaluationSet:
    """Samples a model is evaluated on: inputs, labels and, where the data has them,
    attribute ids (for the worst-group accuracy)."""

    x: torch.Tensor
    y: torch.Tensor
    domains: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.y)


def holdout_validation(dataset: Dataset, share: float, seed: int) -> tuple[Dataset, EvaluationSet]:
    """``dataset`` training on the kept samples, and the held-out samples.

    Parameters
    ----------
    dataset : Dataset
        The loaded dataset; it is not changed.
    share : float
        Share of every label's training samples held out (:func:`stratified_holdout`).
    seed : int
        Seeds which samples are held out.

    Returns
    -------
    tuple
        A :class:`Dataset` with the kept training samples and ``dataset``'s own test set,
        and the held-out samples as an :class:`EvaluationSet`.
    """
    kept, held_out = stratified_holdout(dataset.train_labels, share, seed)
    device = dataset.x_train.device
    kept_index = torch.as_tensor(kept, dtype=torch.long, device=device)
    held_index = torch.as_tensor(held_out, dtype=torch.long, device=device)
    domains = dataset.domains_train
    training = Dataset(
        name=dataset.name,
        x_train=dataset.x_train[kept_index],
        y_train=dataset.y_train[kept_index],
        x_test=dataset.x_test,
        y_test=dataset.y_test,
        num_classes=dataset.num_classes,
        domains_train=None if domains is None else domains[kept],
        domains_test=dataset.domains_test,
        meta={**dataset.meta, "validation_samples": len(held_out)},
    )
    validation = EvaluationSet(
        dataset.x_train[held_index],
        dataset.y_train[held_index],
        None if domains is None else domains[held_out],
    )
    return training, validation
