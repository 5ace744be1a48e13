"""What the stream learner asks of its model: the :class:`StreamModel` protocol.

The learner holds one :class:`StreamModel` and never asks which kind it is
(docs/streaming.md, "The model"). Two implementations exist:

* :class:`~stratify.stream.numpy_model.NumpyStreamModel`, the default on CPU: the NumPy
  MLP of :mod:`.mlp`, nothing on its path imports torch;
* :class:`~stratify.stream.torch_model.TorchStreamModel`: any torch module with a linear
  ``head`` (a given model, another ``--model``, a GPU, or a policy that trains torch
  models); a torch MLP on CPU still predicts and steps in NumPy, through views of its
  weights (:class:`~stratify.stream.step.MLPArrays`).

:func:`stratify.stream.build.build_stream_model` is the one place the kind is chosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from stratify.stream.buffers import ClientBuffers
    from stratify.stream.step import SingleSampleStep


@dataclass(frozen=True)
class Prediction:
    """What the model said about one sample: the class it predicts (index in the
    learner's classes) and every known class's probability (empty when the classifier
    has no class yet).

    Parameters
    ----------
    row : int
        The predicted class.
    probabilities : numpy.ndarray
        Every known class's probability, in class order.
    """

    row: int
    probabilities: np.ndarray

    def probability(self, row: int | None) -> float:
        """The probability of class ``row`` (0 for a class unknown to the prediction)."""
        if row is None or row >= len(self.probabilities):
            return 0.0
        return float(self.probabilities[row])


class StreamModel(Protocol):
    """A stream's global model, as the learner and its policy use it.

    Every method takes samples as the learner keeps them (raw features of the stream's
    shape: a NumPy array on CPU, a tensor on the GPU) and standardises them itself with
    the stream's :class:`~stratify.stream.features.StreamFeatures`, given when it was
    built.
    """

    #: what a policy trains (a :class:`~stratify.stream.mlp.NumpyMLP` or a torch module)
    network: Any

    @property
    def rows(self) -> int:
        """Rows of the classifier."""
        ...

    @property
    def is_mlp(self) -> bool:
        """Whether it is an MLP (whose input can grow and whose new rows are imprinted
        by ``--new-class auto``)."""
        ...

    def probabilities(self, raw: Any, known: Sequence[int]) -> np.ndarray:
        """The softmax over rows ``known`` for one raw sample (learning nothing)."""
        ...

    def predict_rows(self, batch: np.ndarray, known: Sequence[int]) -> np.ndarray:
        """The position in ``known`` of the highest logit, for every raw sample of a
        NumPy batch."""
        ...

    def learn(self, step: SingleSampleStep, buffers: ClientBuffers, slot: int) -> Any:
        """One step of ``step`` (its rate and velocity) on the sample buffered in
        ``slot``; returns the loss before it (a float, or a tensor left on the device)."""
        ...

    def widen_classifier(self, rows: int, seed: int) -> dict[int, Any]:
        """Grow the classifier to ``rows`` rows (row ``r`` drawn from ``(seed, r)``);
        returns the ``id`` of every replaced parameter -> its successor."""
        ...

    def widen_input(self, features: int) -> dict[int, Any]:
        """Grow an MLP's first layer to ``features`` inputs (zero columns); returns what
        :meth:`widen_classifier` returns."""
        ...

    def redraw_row(self, row: int, seed: int) -> None:
        """Draw classifier row ``row`` again as growing the classifier draws it."""
        ...

    def imprint(self, row: int, raw: Any, known: Sequence[int]) -> None:
        """Set classifier row ``row`` from one raw sample, scaled to rows ``known``."""
        ...

    def save_weights(self) -> list[Any]:
        """A copy of every weight, for :meth:`restore_weights`."""
        ...

    def restore_weights(self, saved: list[Any]) -> None:
        """Put back the weights :meth:`save_weights` copied, in place."""
        ...

    def finite(self, losses: list[Any]) -> bool:
        """Whether every weight and the device-held ``losses`` are finite."""
        ...

    def state_dict(self) -> dict[str, np.ndarray]:
        """The weights as NumPy arrays under the torch model's ``state_dict`` names."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load :meth:`state_dict`'s weights in place."""
        ...
