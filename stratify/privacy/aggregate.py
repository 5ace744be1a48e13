"""The gradient label attack on what a server holds when shares are summed (docs/flower.md,
"Secure aggregation"): a global batch's summed gradient and the placeholders it scheduled.

With the cross-entropy, the head bias's gradient summed over a batch is
``sum_i (p_i - onehot(y_i))``: minus the batch's label counts plus its summed predicted
probabilities. The server, which holds the model and a test split, estimates the summed
probabilities as the batch size times the model's mean prediction, and so every class's
count in the batch (:func:`label_counts_from_bias`). It also knows how many times each
placeholder the batch holds (it drew the schedule). Across an epoch's batches the
placeholder whose counts follow a label's estimated counts is that label's
(:func:`match_placeholders`): a linear assignment on the squared differences.

Per share (no secure sum), the same estimate from each share's own gradient gives the
per-share iDLG of docs/privacy.md; summed over a batch only counts remain.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment


def label_counts_from_bias(
    bias_gradient: np.ndarray, batch_size: int, mean_probabilities: np.ndarray
) -> np.ndarray:
    """Every class's estimated count in a batch, from the head bias's mean gradient.

    ``n_c = B * (m_c - g_c)``, with ``g`` the batch's mean gradient of the head bias and
    ``m`` the model's mean predicted probabilities (the server's estimate of the batch's).

    Parameters
    ----------
    bias_gradient : numpy.ndarray
        ``g``, shape ``(classes,)``: the gradient of the batch's mean cross-entropy.
    batch_size : int
        ``B``, the samples in the batch.
    mean_probabilities : numpy.ndarray
        ``m``, shape ``(classes,)``.

    Returns
    -------
    numpy.ndarray
        ``n``, shape ``(classes,)``, floats (not rounded: the matching weighs them).
    """
    gradient = np.asarray(bias_gradient, dtype=np.float64)
    return batch_size * (np.asarray(mean_probabilities, dtype=np.float64) - gradient)


def match_placeholders(placeholder_counts: np.ndarray, label_counts: np.ndarray) -> np.ndarray:
    """The label each placeholder most likely stands for, batch counts against batch counts.

    Parameters
    ----------
    placeholder_counts : numpy.ndarray
        Shape ``(batches, placeholders)``: how many times each placeholder each batch holds
        (known to the server).
    label_counts : numpy.ndarray
        Shape ``(batches, labels)``: each label's estimated count in each batch
        (:func:`label_counts_from_bias`).

    Returns
    -------
    numpy.ndarray
        Shape ``(placeholders,)``: the label matched to each placeholder (``-1`` where
        there are more placeholders than labels), one placeholder per label.
    """
    placeholders = np.asarray(placeholder_counts, dtype=np.float64)
    labels = np.asarray(label_counts, dtype=np.float64)
    # cost[p, l] = sum_b (P[b, p] - N[b, l])^2
    cost = (
        (placeholders**2).sum(0)[:, None]
        + (labels**2).sum(0)[None, :]
        - 2 * placeholders.T @ labels
    )
    rows, columns = linear_sum_assignment(cost)
    matched = np.full(placeholders.shape[1], -1, dtype=np.int64)
    matched[rows] = columns
    return matched


def mapped_right(matched: np.ndarray, truth: np.ndarray) -> float:
    """The share of placeholders matched to their real label.

    Parameters
    ----------
    matched : numpy.ndarray
        :func:`match_placeholders`'s answer.
    truth : numpy.ndarray
        The real label of every placeholder.
    """
    return float((np.asarray(matched) == np.asarray(truth)).mean())
