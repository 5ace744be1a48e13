"""Attacks on what the registry's outputs show: a stream's classifier rows, the global
count per placeholder, and the key holder's match bits read by a key holder that is also a
client (docs/privacy.md, "Threat model").

Every attack is a pure function of what its party sees, scored against the truth it does
not see: the share of labels it names right. Chance is ``1 / C`` for ``C`` classes, and
:func:`chance_bound` gives the share that guessing stays under but for a one-in-``alpha``
fluke, so a test can tell a defence that holds from one that leaks.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np


def chance_bound(trials: int, chance: float, alpha: float = 1e-3) -> float:
    """The share of ``trials`` guesses, each right with probability ``chance``, that is
    exceeded with probability at most ``alpha``: the binomial's upper ``alpha`` quantile.

    Parameters
    ----------
    trials : int
        Number of independent guesses.
    chance : float
        Probability that one guess is right.
    alpha : float
        Probability that blind guessing scores above the bound.

    Returns
    -------
    float
        The smallest ``k / trials`` with ``P(X > k) <= alpha`` for ``X ~ B(trials, chance)``.
    """
    if chance >= 1.0:
        return 1.0
    tail = 1.0  # before step k: P(X > k - 1) = P(X >= k)
    for k in range(trials + 1):
        tail -= binomial_pmf(trials, k, chance)
        if tail <= alpha:
            return k / trials
    return 1.0


def binomial_pmf(trials: int, k: int, chance: float) -> float:
    """``P(X = k)`` for ``X ~ B(trials, chance)``, in logs so that thousands of trials
    neither overflow nor underflow.

    Parameters
    ----------
    trials, k : int
        Trials and successes.
    chance : float
        Probability of a success, in ``[0, 1)``.
    """
    if chance == 0.0:
        return 1.0 if k == 0 else 0.0
    log_choose = math.lgamma(trials + 1) - math.lgamma(k + 1) - math.lgamma(trials - k + 1)
    return math.exp(log_choose + k * math.log(chance) + (trials - k) * math.log1p(-chance))


def arrival_rows(stream_labels: Sequence[Hashable]) -> dict[Hashable, int]:
    """Each label's classifier row when a label takes the next row as it first arrives
    (a fresh stream without the permutation): its rank in arrival order.

    Parameters
    ----------
    stream_labels : sequence of hashable
        The stream's labels, in arrival order.
    """
    rows: dict[Hashable, int] = {}
    for label in stream_labels:
        rows.setdefault(label, len(rows))
    return rows


def natural_order_recovery(row_of: Mapping[Any, int]) -> float:
    """The server's guess "row ``i`` is the ``i``-th label in natural order", scored: the
    share of labels whose row is their rank among the labels sorted.

    Parameters
    ----------
    row_of : mapping
        Each label's classifier row (or placeholder), which the server sees as the index
        of the model's output; the labels are what it does not see.
    """
    ranked = sorted(row_of)
    return sum(row_of[label] == rank for rank, label in enumerate(ranked)) / len(ranked)


def first_appearance_recovery(row_of: Mapping[Any, int], first_event: Mapping[Any, int]) -> float:
    """The server's guess from when each row is first trained: rows ranked by the event at
    which their first sample came, named as the labels in natural order (a class-ordered
    stream brings its labels in that order). The share of labels named right.

    Parameters
    ----------
    row_of : mapping
        Each label's row.
    first_event : mapping
        Each label's first event, which the server sees as the event at which its row (or
        placeholder) first has a sample to schedule.
    """
    rows_by_time = [row_of[label] for label in sorted(first_event, key=first_event.__getitem__)]
    guess = dict(zip(rows_by_time, sorted(row_of)))
    return sum(guess[row_of[label]] == label for label in row_of) / len(row_of)


def public_sample_rows(scores: np.ndarray) -> np.ndarray:
    """A server holding the model and one public labelled sample per class: the row it
    gives each class, an assignment of distinct rows maximising the summed log-scores of
    the samples (the Hungarian method, :func:`scipy.optimize.linear_sum_assignment`).

    Parameters
    ----------
    scores : numpy.ndarray
        ``(classes, rows)``: the model's log-probabilities (or logits) of the public
        sample of class ``c`` (row ``c`` of ``scores``) at every row of the classifier.

    Returns
    -------
    numpy.ndarray
        ``guess[c]``: the row the server names class ``c``.
    """
    from scipy.optimize import linear_sum_assignment

    classes, rows = linear_sum_assignment(-np.asarray(scores, dtype=np.float64))
    guess = np.empty(scores.shape[0], dtype=np.int64)
    guess[classes] = rows
    return guess


def rank_match(observed: np.ndarray, public: np.ndarray, seed: int = 0) -> np.ndarray:
    """Frequency analysis: placeholder ``p`` named the class whose public total has the
    rank its observed count has (ties broken at random, seeded).

    Parameters
    ----------
    observed : numpy.ndarray
        The server's global count per placeholder.
    public : numpy.ndarray
        The public total (or frequency) per class; as many as ``observed``.
    seed : int
        Seed of the tie-breaking.

    Returns
    -------
    numpy.ndarray
        ``guess[p]``: the class named for placeholder ``p``.
    """
    rng = np.random.default_rng(seed)
    # lexsort's last key sorts first: by value, ties in a random order
    by_count = np.lexsort((rng.random(len(observed)), observed))
    by_total = np.lexsort((rng.random(len(public)), public))
    guess = np.empty(len(observed), dtype=np.int64)
    guess[by_count] = by_total
    return guess


def coarsen(counts: np.ndarray, step: int) -> np.ndarray:
    """``counts`` rounded to the nearest multiple of ``step`` (a coarser count the server
    could schedule with); ``step`` 1 leaves them exact."""
    return np.round(np.asarray(counts) / step).astype(np.int64) * step


def held_share_named(client_labels: Sequence[set[Hashable]], key_holder: int = 0) -> float:
    """The key holder as a client: it knows its own labels and which of the unique labels
    each of its labels is, and the match bits it decrypts say which unique labels every
    other client holds; so it names every label another client shares with it. The share
    of the other clients' (client, label) pairs it names.

    Parameters
    ----------
    client_labels : sequence of set
        Each client's labels.
    key_holder : int
        The client that holds the secret key.
    """
    own = client_labels[key_holder]
    others = [labels for client, labels in enumerate(client_labels) if client != key_holder]
    return sum(len(labels & own) for labels in others) / sum(len(labels) for labels in others)


def named_from_match_rows(
    match_rows: Sequence[Sequence[int]],
    own_labels: Sequence[Hashable],
    key_holder: int = 0,
) -> list[dict[int, Hashable]]:
    """What the key holder names from the match bits it decrypted: per client, the unique
    label index of each of its labels (``match_rows[k]``, as the key holder reads them
    off the rows of client ``k``'s comparisons), named where the index is one of the key
    holder's own, whose labels it knows (``own_labels``, in the order of its own row).

    Parameters
    ----------
    match_rows : sequence of sequence of int
        Per client, the unique-label index matched by each of its labels.
    own_labels : sequence of hashable
        The key holder's labels in the order it encoded them (it knows this order).
    key_holder : int
        The client that holds the secret key.

    Returns
    -------
    list of dict
        Per client, unique index -> the label the key holder names for it.
    """
    known = dict(zip(match_rows[key_holder], own_labels))
    return [{index: known[index] for index in row if index in known} for row in match_rows]
