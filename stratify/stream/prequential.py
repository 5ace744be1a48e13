"""Prequential (test-then-train) metrics: each arriving sample is predicted by the model
as it is before that sample is learned, so every prediction is on unseen data.

Beside the accuracy (over the whole stream and a sliding window): macro-F1, per-class
recall, log-loss, and the accuracy of always predicting the class seen most often so far
(the majority-class baseline a model must beat). Memory is bounded by the window and by
the number of classes squared (the confusion counts), never by the stream's length.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

#: probabilities are clipped to ``[LOG_LOSS_FLOOR, 1]`` before the log, as common
#: log-loss implementations do (a class without a classifier row has probability 0)
LOG_LOSS_FLOOR = 1e-15


class Prequential:
    """Running test-then-train metrics over the classifier's rows.

    Parameters
    ----------
    window : int
        Most recent predictions the window accuracy covers.
    """

    def __init__(self, window: int) -> None:
        self.window: deque[bool] = deque(maxlen=window)
        self.window_correct = 0
        self.correct = 0
        self.seen = 0
        self.majority_correct = 0
        self.log_loss_sum = 0.0
        #: confusion[true row, predicted row]; a prediction of no row (an empty
        #: classifier) is counted in the last column
        self.confusion = np.zeros((0, 1), dtype=np.int64)
        #: samples of each true row so far (the confusion matrix's row sums)
        self.supports: list[int] = []
        #: the row with the most samples so far (-1 before any)
        self.majority = -1

    def record(
        self,
        correct: bool,
        target: int | None = None,
        predicted: int = -1,
        probability: float = 0.0,
    ) -> None:
        """Add one prediction's outcome.

        Parameters
        ----------
        correct : bool
            Whether it was right.
        target : int, optional
            The true class's row (given when the row exists, i.e. after it was added).
        predicted : int
            The predicted row (-1: none).
        probability : float
            The probability the model gave the true class (0 when it had no row).
        """
        if target is not None:
            self.majority_correct += self.majority == target
            self._grow(max(target, predicted) + 1)
            self.confusion[target, predicted if predicted >= 0 else -1] += 1
            self.supports[target] += 1
            # the majority class so far, the first row among equals (as argmax): kept as
            # the supports grow, since summing the confusion matrix per event costs more
            # than the rest of the record
            top = self.supports[self.majority] if self.majority >= 0 else 0
            if self.supports[target] > top or (
                self.supports[target] == top and target < self.majority
            ):
                self.majority = target
            if not math.isfinite(probability):  # non-finite logits: no usable probability
                probability = 0.0
            self.log_loss_sum -= math.log(max(probability, LOG_LOSS_FLOOR))
        if len(self.window) == self.window.maxlen:
            self.window_correct -= self.window[0]
        self.window.append(correct)
        self.window_correct += correct
        self.correct += correct
        self.seen += 1

    def _grow(self, rows: int) -> None:
        have = self.confusion.shape[0]
        if rows > have:
            grown = np.zeros((rows, rows + 1), dtype=np.int64)
            grown[:have, :have] = self.confusion[:, :have]
            grown[:have, -1] = self.confusion[:, -1]
            self.confusion = grown
            self.supports.extend([0] * (rows - have))

    @property
    def window_accuracy(self) -> float | None:
        """Share of correct predictions among the last ``window`` (``None`` before any)."""
        return self.window_correct / len(self.window) if self.window else None

    @property
    def accuracy(self) -> float | None:
        """Share of correct predictions over the whole stream (``None`` before any)."""
        return self.correct / self.seen if self.seen else None

    def metrics(self, labels: list[Any]) -> dict[str, Any]:
        """Macro-F1, per-class recall (keyed by label), log-loss and the majority-class
        baseline's accuracy over the stream so far (``None`` before any prediction).

        Parameters
        ----------
        labels : list
            The label of every classifier row, in row order.
        """
        counted = int(self.confusion.sum())
        if not counted:
            return {
                "macro_f1": None,
                "log_loss": None,
                "majority_accuracy": None,
                "class_recall": {},
            }
        rows = self.confusion.shape[0]
        matrix = self.confusion[:, :rows]
        true_positives = np.diag(matrix).astype(np.float64)
        support = self.confusion.sum(axis=1)
        predicted = matrix.sum(axis=0)
        # macro-F1 over the classes that occurred or were predicted
        present = (support > 0) | (predicted > 0)
        f1 = 2 * true_positives / np.maximum(support + predicted, 1)
        return {
            "macro_f1": float(f1[present].mean()),
            "log_loss": self.log_loss_sum / counted,
            "majority_accuracy": self.majority_correct / counted,
            "class_recall": {
                str(labels[row]): float(true_positives[row] / support[row])
                for row in range(rows)
                if support[row] > 0
            },
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "window": np.array(self.window, dtype=bool),
            "correct": self.correct,
            "seen": self.seen,
            "majority_correct": self.majority_correct,
            "log_loss_sum": self.log_loss_sum,
            "confusion": self.confusion.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window.clear()
        self.window.extend(bool(value) for value in np.asarray(state["window"]).tolist())
        self.window_correct = sum(self.window)
        self.correct = int(state["correct"])
        self.seen = int(state["seen"])
        self.majority_correct = int(state["majority_correct"])
        self.log_loss_sum = float(state["log_loss_sum"])
        confusion = np.array(state["confusion"], dtype=np.int64)
        if confusion.ndim != 2 or confusion.shape[1] != confusion.shape[0] + 1:
            raise ValueError(f"a confusion matrix of shape {confusion.shape}")
        self.confusion = confusion
        self.supports = [int(count) for count in confusion.sum(axis=1)]
        self.majority = (
            int(np.argmax(self.supports)) if self.supports and max(self.supports) > 0 else -1
        )
