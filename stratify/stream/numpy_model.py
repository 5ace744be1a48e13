"""The stream's default model on CPU as a :class:`~stratify.stream.model.StreamModel`:
the NumPy MLP of :mod:`.mlp`, predicted and stepped in NumPy and BLAS, never importing
torch (docs/streaming.md, "The model")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from stratify.stream.mlp import NumpyMLP, row_generator, uniform_rows
from stratify.stream.step import quiet

if TYPE_CHECKING:
    from stratify.stream.buffers import ClientBuffers
    from stratify.stream.features import StreamFeatures
    from stratify.stream.step import SingleSampleStep


def softmax_of(arrays: Any, x: np.ndarray, known: Sequence[int]) -> np.ndarray:
    """The softmax over rows ``known`` of an MLP's logits (``arrays``: an
    :class:`~stratify.stream.step.MLPArrays`) for one flat sample, in NumPy only, under
    one errstate: torch's no_grad and a second errstate cost as much as the softmax
    (docs/architecture.md, "Streaming")."""
    with quiet():
        logits = arrays.activations(x)[-1][known]
        exp = np.exp(logits - logits.max())
        return exp / exp.sum()


def arrays_finite(arrays: Any) -> bool:
    """Whether an MLP's weights are finite: the squared norms of its own memory, in
    float32 as torch's norm (a NaN or an infinity, or weights beyond ~1e19, whose square
    overflows, make it non-finite)."""
    squares = 0.0
    with quiet():
        for flat in arrays.flat:
            squares += float(np.dot(flat, flat))
    return math.isfinite(squares)


class NumpyStreamModel:
    """The NumPy MLP as a stream's model.

    Parameters
    ----------
    network : NumpyMLP
        The MLP (trained in place).
    features : StreamFeatures
        The standardisation of raw samples.
    """

    is_mlp = True

    def __init__(self, network: NumpyMLP, features: StreamFeatures) -> None:
        self.network = network
        self.features = features

    @property
    def rows(self) -> int:
        """Rows of the classifier."""
        return self.network.rows

    def probabilities(self, raw: Any, known: Sequence[int]) -> np.ndarray:
        """The softmax over rows ``known`` for one raw sample."""
        return softmax_of(self.network, self.features.array(raw).reshape(-1), known)

    def predict_rows(self, batch: np.ndarray, known: Sequence[int]) -> np.ndarray:
        """The position in ``known`` of the highest logit of every raw sample."""
        with quiet():
            logits = self.network.logits(self.features.array(batch))
            return logits[:, known].argmax(axis=1)

    def learn(self, step: SingleSampleStep, buffers: ClientBuffers, slot: int) -> float:
        """One NumPy step on the sample buffered in ``slot``."""
        assert buffers.x_array is not None  # a NumPy model's buffers are on CPU
        x = self.features.array(buffers.x_array[slot]).reshape(-1)
        return step.step_array(x, buffers.target(slot))

    def widen_classifier(self, rows: int, seed: int) -> dict[int, Any]:
        """:meth:`NumpyMLP.widen_classifier`."""
        return self.network.widen_classifier(rows, seed)

    def widen_input(self, features: int) -> dict[int, Any]:
        """:meth:`NumpyMLP.widen_input`."""
        return self.network.widen_input(features)

    def redraw_row(self, row: int, seed: int) -> None:
        """Draw row ``row`` again from ``row_generator(seed, row)``."""
        weight, bias = self.network.weights[-1], self.network.biases[-1]
        new_weight, new_bias = uniform_rows(row_generator(seed, row), 1, weight.shape[1])
        weight[row], bias[row] = new_weight[0], new_bias[0]

    def imprint(self, row: int, raw: Any, known: Sequence[int]) -> None:
        """Imprint row ``row`` from the sample as training sees it."""
        with quiet():
            embedding = self.network.embedding(self.features.array(raw).reshape(-1))
            self.network.imprint_row(row, embedding, known)

    def save_weights(self) -> list[Any]:
        """One copy of the MLP's single storage."""
        return [self.network.storage.copy()]

    def restore_weights(self, saved: list[Any]) -> None:
        """Put the storage back, in place (every view stays valid)."""
        self.network.storage[...] = saved[0]

    def finite(self, losses: list[Any]) -> bool:
        """Whether every weight is finite (a NumPy step leaves no loss on a device)."""
        return arrays_finite(self.network)

    def state_dict(self) -> dict[str, np.ndarray]:
        """:meth:`NumpyMLP.state_dict`."""
        return self.network.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """:meth:`NumpyMLP.load_state_dict`."""
        self.network.load_state_dict(state)
