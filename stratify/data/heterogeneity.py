"""Statistical data heterogeneity metrics of FedDiverse (papers/feddiverse_*, §III-C).

For a dataset ``D`` with labels ``Y`` and a non-discriminative attribute ``A`` (a domain,
a colour, a background), with ``H`` and ``I`` the entropy and mutual information of the
empirical distribution of ``D`` (Eqs. 2-4 of the paper, taken from Yang et al. 2023):

- class imbalance      ``ΔCI(D) = 1 - H(Y) / log|Y|``
- attribute imbalance  ``ΔAI(D) = 1 - H(A) / log|A|``
- spurious correlation ``ΔSC(D) = 2 I(Y; A) / (H(Y) + H(A))``

each in ``[0, 1]`` (the base of the logarithm cancels). The six federated metrics are
these three on the union of the clients' datasets (*global*, Eqs. 5-7) and their
unweighted mean over the ``K`` clients (*client*, Eqs. 8-10).

Equations 5-10 were lost in the paper's text extraction; this module reads them from the
surrounding text ("computed on the union of the clients' datasets"; "the local values
of CI, AI and SC are averaged across all the K clients") and fixes these details:

- ``|Y|`` and ``|A|`` are the sizes of the whole label and attribute spaces
  (``num_classes``, ``num_attributes``), for clients too: a client holding one label of
  ten has ``ΔCI = 1``. This matches the paper's ``|Y| x |A|`` interaction matrix ``N^k``.
- The union is the multiset sum of the clients' interaction matrices,
  ``N = Σ_k N^k`` (the paper's identity); samples held by no client are not in it.
- The client mean is over clients holding at least one sample (an empty client has no
  empirical distribution).
- Degenerate cases where a formula is 0/0 are 0: ``ΔCI`` with one class, ``ΔAI`` with
  one attribute, ``ΔSC`` when ``H(Y) + H(A) = 0`` (one label and one attribute).

Note that ``ΔSC = 1`` needs ``I(Y; A) = H(Y) = H(A)``: label and attribute determine each
other. An attribute that is a function of the label but coarser (e.g. colour = digit >= 5
on ten digits) gives ``ΔSC = 2 H(A) / (H(Y) + H(A)) < 1``.
"""

from __future__ import annotations

import numpy as np

METRIC_NAMES: tuple[str, ...] = (
    "global_ci",
    "global_ai",
    "global_sc",
    "client_ci",
    "client_ai",
    "client_sc",
)


def entropy(counts: np.ndarray) -> float:
    """Shannon entropy (nats) of the empirical distribution given by non-negative ``counts``.

    Parameters
    ----------
    counts : numpy.ndarray
        Counts of any shape; 0 for an all-zero array.
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    total = counts.sum()
    if total <= 0:
        return 0.0
    probabilities = counts[counts > 0] / total
    return float(-(probabilities * np.log(probabilities)).sum())


def interaction_matrix(
    labels: np.ndarray,
    attributes: np.ndarray | None,
    num_classes: int,
    num_attributes: int | None = None,
) -> np.ndarray:
    """The ``(num_classes, num_attributes)`` count matrix ``N[y, a]`` of a dataset.

    Parameters
    ----------
    labels : numpy.ndarray
        ``(N,)`` labels in ``[0, num_classes)``.
    attributes : numpy.ndarray, optional
        ``(N,)`` attribute ids in ``[0, num_attributes)``; ``None`` gives a single column.
    num_classes : int
        Size of the label space ``|Y|``.
    num_attributes : int, optional
        Size of the attribute space ``|A|``; default ``max(attributes) + 1``.
    """
    labels = np.asarray(labels, dtype=np.int64)
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes})")
    if attributes is None:
        return np.bincount(labels, minlength=num_classes)[:num_classes, None]
    attributes = np.asarray(attributes, dtype=np.int64)
    if num_attributes is None:
        num_attributes = int(attributes.max()) + 1 if len(attributes) else 1
    if len(attributes) and (attributes.min() < 0 or attributes.max() >= num_attributes):
        raise ValueError(f"attributes must lie in [0, {num_attributes})")
    flat = np.bincount(labels * num_attributes + attributes, minlength=num_classes * num_attributes)
    return flat.reshape(num_classes, num_attributes)


def _one_minus_normalised_entropy(marginal: np.ndarray) -> float:
    if len(marginal) <= 1 or marginal.sum() <= 0:
        return 0.0
    return float(np.clip(1.0 - entropy(marginal) / np.log(len(marginal)), 0.0, 1.0))


def class_imbalance(matrix: np.ndarray) -> float:
    """``ΔCI = 1 - H(Y) / log|Y|`` of an interaction matrix (Eq. 2).

    Parameters
    ----------
    matrix : numpy.ndarray
        ``(|Y|, |A|)`` counts, or ``(|Y|,)`` class counts.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    return _one_minus_normalised_entropy(matrix if matrix.ndim == 1 else matrix.sum(axis=1))


def attribute_imbalance(matrix: np.ndarray) -> float:
    """``ΔAI = 1 - H(A) / log|A|`` of a ``(|Y|, |A|)`` interaction matrix (Eq. 3).

    Parameters
    ----------
    matrix : numpy.ndarray
        ``(|Y|, |A|)`` counts.
    """
    return _one_minus_normalised_entropy(np.asarray(matrix, dtype=np.float64).sum(axis=0))


def spurious_correlation(matrix: np.ndarray) -> float:
    """``ΔSC = 2 I(Y; A) / (H(Y) + H(A))`` of a ``(|Y|, |A|)`` interaction matrix (Eq. 4).

    Parameters
    ----------
    matrix : numpy.ndarray
        ``(|Y|, |A|)`` counts.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    label_entropy = entropy(matrix.sum(axis=1))
    attribute_entropy = entropy(matrix.sum(axis=0))
    denominator = label_entropy + attribute_entropy
    if denominator <= 0:
        return 0.0
    mutual_information = denominator - entropy(matrix)  # I(Y;A) = H(Y) + H(A) - H(Y,A)
    return float(np.clip(2.0 * mutual_information / denominator, 0.0, 1.0))


def heterogeneity_triplet(matrix: np.ndarray) -> tuple[float, float, float]:
    """FedDiverse's data heterogeneity triplet ``(ΔCI, ΔAI, ΔSC)`` of an interaction matrix.

    Parameters
    ----------
    matrix : numpy.ndarray
        ``(|Y|, |A|)`` counts.
    """
    return class_imbalance(matrix), attribute_imbalance(matrix), spurious_correlation(matrix)


def client_matrices(
    labels: np.ndarray,
    attributes: np.ndarray | None,
    client_indices: list[np.ndarray],
    num_classes: int,
    num_attributes: int | None = None,
) -> list[np.ndarray]:
    """Per-client interaction matrices ``N^k`` (see :func:`interaction_matrix`).

    Parameters
    ----------
    labels, attributes : numpy.ndarray
        Per-sample labels and attribute ids (``attributes`` may be ``None``).
    client_indices : list of numpy.ndarray
        Each client's sample indices.
    num_classes, num_attributes : int
        Sizes of the label and attribute spaces.
    """
    labels = np.asarray(labels)
    if attributes is not None:
        attributes = np.asarray(attributes)
        if num_attributes is None:
            num_attributes = int(attributes.max()) + 1 if len(attributes) else 1
    return [
        interaction_matrix(
            labels[indices],
            None if attributes is None else attributes[indices],
            num_classes,
            num_attributes,
        )
        for indices in client_indices
    ]


def client_triplets(
    labels: np.ndarray,
    attributes: np.ndarray | None,
    client_indices: list[np.ndarray],
    num_classes: int,
    num_attributes: int | None = None,
) -> np.ndarray:
    """``(K, 3)`` array of each client's ``(ΔCI, ΔAI, ΔSC)``; NaN where undefined.

    AI and SC are NaN without attributes; all three are NaN for an empty client.

    Parameters
    ----------
    labels, attributes, client_indices, num_classes, num_attributes
        As in :func:`heterogeneity_metrics`.
    """
    matrices = client_matrices(labels, attributes, client_indices, num_classes, num_attributes)
    triplets = np.full((len(matrices), 3), np.nan)
    for client, matrix in enumerate(matrices):
        if matrix.sum() > 0:
            triplets[client] = heterogeneity_triplet(matrix)
            if attributes is None:
                triplets[client, 1:] = np.nan
    return triplets


def heterogeneity_metrics(
    labels: np.ndarray,
    attributes: np.ndarray | None,
    client_indices: list[np.ndarray],
    num_classes: int,
    num_attributes: int | None = None,
) -> dict[str, float | None]:
    """The six FedDiverse heterogeneity metrics of a partition.

    Parameters
    ----------
    labels : numpy.ndarray
        ``(N,)`` labels in ``[0, num_classes)`` of the partitioned set.
    attributes : numpy.ndarray, optional
        ``(N,)`` attribute (domain) ids, or ``None`` when the data has none.
    client_indices : list of numpy.ndarray
        Each client's sample indices (a :func:`~stratify.data.partition.partition`).
    num_classes : int
        ``|Y|``, the number of classes of the dataset.
    num_attributes : int, optional
        ``|A|``; default ``max(attributes) + 1``.

    Returns
    -------
    dict
        ``global_ci``, ``global_ai``, ``global_sc`` (on the union of the clients' data) and
        ``client_ci``, ``client_ai``, ``client_sc`` (mean over non-empty clients), floats
        in ``[0, 1]`` (NaN when no client holds a sample); the AI and SC entries are
        ``None`` when ``attributes`` is ``None``.
    """
    matrices = client_matrices(labels, attributes, client_indices, num_classes, num_attributes)
    union = np.sum(matrices, axis=0) if matrices else np.zeros((num_classes, 1), np.int64)
    non_empty = [m for m in matrices if m.sum() > 0]
    global_values = heterogeneity_triplet(union) if union.sum() > 0 else (np.nan,) * 3
    client_values = (
        np.mean([heterogeneity_triplet(m) for m in non_empty], axis=0)
        if non_empty
        else (np.nan,) * 3
    )
    metrics: dict[str, float | None] = {}
    for scope, values in (("global", global_values), ("client", client_values)):
        for name, value in zip(("ci", "ai", "sc"), values):
            has_value = name == "ci" or attributes is not None
            metrics[f"{scope}_{name}"] = float(value) if has_value else None
    return metrics
