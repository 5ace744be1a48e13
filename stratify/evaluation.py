"""Evaluation of a global model: accuracy, mean loss and worst-group accuracy.

Pure functions of a model and tensors, so the engine, the stream learner and the tests
evaluate the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def test_metrics(
    model: nn.Module,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    domains: np.ndarray | None = None,
    batch_size: int = 1000,
) -> TestMetrics:
    """Accuracy, mean cross-entropy and, where the test samples have attributes, the
    worst-group accuracy (:func:`worst_group_accuracy`) of ``model``.

    Parameters
    ----------
    model : torch.nn.Module
        Evaluated in eval mode; put back in train mode afterwards.
    x_test, y_test : torch.Tensor
        Test samples and their labels, on the model's device.
    domains : numpy.ndarray, optional
        Attribute (domain) id of every test sample; ``None`` when the data has none.
    batch_size : int
        Samples per forward pass.
    """
    model.eval()
    correct = torch.zeros(len(x_test), dtype=torch.bool, device=x_test.device)
    loss_sum = 0.0
    for start in range(0, len(x_test), batch_size):
        logits = model(x_test[start : start + batch_size])
        targets = y_test[start : start + batch_size]
        loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
        correct[start : start + batch_size] = logits.argmax(dim=1) == targets
    model.train()
    hits = correct.cpu().numpy()
    return TestMetrics(
        accuracy=float(hits.mean()),
        loss=loss_sum / len(x_test),
        worst_group_accuracy=None
        if domains is None
        else worst_group_accuracy(hits, y_test.cpu().numpy(), domains),
    )


@dataclass
class TestMetrics:
    """The global model on the test set.

    Parameters
    ----------
    accuracy : float
        Share of test samples classified correctly.
    loss : float
        Mean cross-entropy.
    worst_group_accuracy : float, optional
        The lowest accuracy over the (label, attribute) groups of the test set; ``None``
        when the dataset has no attributes.
    """

    __test__ = False  # not a pytest test class, despite its name

    accuracy: float
    loss: float
    worst_group_accuracy: float | None = None


def worst_group_accuracy(correct: np.ndarray, labels: np.ndarray, attributes: np.ndarray) -> float:
    """``min over (y, a) of accuracy on the samples with label y and attribute a``.

    The worst-group accuracy of Sagawa et al. (2020) that FedDiverse reports: only the
    groups that hold at least one test sample count, so a label never drawn in some
    colour does not make the minimum 0.

    Parameters
    ----------
    correct : numpy.ndarray
        ``(N,)`` booleans: sample classified correctly.
    labels, attributes : numpy.ndarray
        ``(N,)`` label and attribute ids of the samples.
    """
    correct = np.asarray(correct, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    attributes = np.asarray(attributes, dtype=np.int64)
    if len(correct) == 0:
        raise ValueError("worst_group_accuracy needs at least one sample")
    groups = labels * (int(attributes.max()) + 1) + attributes
    counts = np.bincount(groups)
    hits = np.bincount(groups, weights=correct, minlength=len(counts))
    held = counts > 0
    return float((hits[held] / counts[held]).min())
