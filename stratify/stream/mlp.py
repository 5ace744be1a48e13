"""The stream's default model on CPU, in NumPy: an MLP that never imports torch.

A stream learns one sample at a time, so its model's per-event arithmetic is small (a
200-200 MLP on one sample: a few hundred thousand multiply-adds) and its start-up and
memory are dominated by what it imports: ``import torch`` alone peaks at about 630 MB.
:class:`NumpyMLP` is the same network as :class:`stratify.nn.models.MLP` (flatten,
``Linear`` + ReLU per hidden width, a linear ``head``), its weights NumPy arrays,
initialised as ``torch.nn.Linear`` initialises (uniform in ``±1/sqrt(fan_in)`` for weights
and biases) from a NumPy generator seeded by the run's seed, with what a stream does to
its model: predict, step (:class:`~stratify.stream.step.SingleSampleStep`), grow its
classifier and its input, imprint a row, and save its weights under the torch model's
``state_dict`` names, so either reads the other's weights (docs/architecture.md,
"Streaming").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from stratify.nn.catalog import MLP_HIDDEN
from stratify.stream.step import MLPArrays


def row_generator(seed: int, row: int) -> np.random.Generator:
    """The generator that initialises classifier row ``row`` of a run seeded ``seed``."""
    return np.random.default_rng([seed, row, 0x6E6577])


def uniform_rows(
    generator: np.random.Generator, rows: int, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """A weight of ``rows × width`` and a bias of ``rows``, uniform in ``±1/sqrt(width)``
    as ``torch.nn.Linear`` draws them, float32."""
    bound = 1.0 / math.sqrt(width)
    weight = generator.uniform(-bound, bound, (rows, width)).astype(np.float32)
    bias = generator.uniform(-bound, bound, rows).astype(np.float32)
    return weight, bias


class NumpyMLP(MLPArrays):
    """An MLP ``F → hidden → … → rows`` with ReLU, its weights NumPy float32 arrays.

    Every weight and bias is a view of one contiguous array (:attr:`storage`), so the
    learner's check that the weights are finite is one dot product, and a copy of the
    model one copy.

    Parameters
    ----------
    weights, biases : list of numpy.ndarray
        Per layer (the head last): a ``(out, in)`` weight and an ``(out,)`` bias (copied).
    """

    def __init__(self, weights: list[np.ndarray], biases: list[np.ndarray]) -> None:
        pairs = [array for pair in zip(weights, biases) for array in pair]
        self.storage = np.empty(sum(array.size for array in pairs), dtype=np.float32)
        views, start = [], 0
        for array in pairs:
            view = self.storage[start : start + array.size].reshape(array.shape)
            view[...] = array
            views.append(view)
            start += array.size
        super().__init__(views[0::2], views[1::2])
        self.flat = [self.storage]

    @classmethod
    def build(
        cls,
        features: int,
        rows: int,
        hidden: tuple[int, ...] | None = None,
        seed: int = 0,
    ) -> NumpyMLP:
        """A fresh MLP of ``features`` inputs and ``rows`` outputs.

        Parameters
        ----------
        features : int
            Input width (a sample's features, flattened).
        rows : int
            Classifier rows.
        hidden : tuple of int, optional
            Hidden widths (default :data:`~stratify.nn.catalog.MLP_HIDDEN`).
        seed : int
            Seeds the initial weights (layer by layer, weight then bias).
        """
        widths = (features, *(MLP_HIDDEN if hidden is None else hidden), rows)
        generator = np.random.default_rng([seed, 0x4D4C50])
        layers = [uniform_rows(generator, out, width) for width, out in zip(widths, widths[1:])]
        return cls([weight for weight, _ in layers], [bias for _, bias in layers])

    @property
    def rows(self) -> int:
        """Rows of the classifier."""
        return len(self.biases[-1])

    @property
    def features(self) -> int:
        """Input width."""
        return self.weights[0].shape[1]

    def parameters(self) -> list[np.ndarray]:
        """The weights and biases, layer by layer (as ``torch.nn.Module.parameters``)."""
        return list(self.arrays)

    def names(self) -> list[str]:
        """The names of :attr:`arrays` in ``stratify.nn.models.MLP``'s ``state_dict``
        (``layers.1.weight``, ``layers.1.bias``, …, ``head.weight``, ``head.bias``: the
        torch model's hidden ``Linear`` layers sit after its ``Flatten``, between ReLUs)."""
        prefixes = [f"layers.{2 * index + 1}" for index in range(len(self.weights) - 1)]
        prefixes.append("head")
        return [f"{prefix}.{kind}" for prefix in prefixes for kind in ("weight", "bias")]

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The logits of a batch ``x`` (samples of any shape, flattened), float32."""
        values = x.reshape(len(x), -1).astype(np.float32, copy=False)
        last = len(self.weights) - 1
        for index, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            values = values @ weight.T + bias
            if index < last:
                np.maximum(values, 0.0, out=values)
        return values

    def embedding(self, x: np.ndarray) -> np.ndarray:
        """What the head receives for one flat sample ``x`` (the last hidden layer)."""
        return self.activations(x)[-2]

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the weights under the torch MLP's ``state_dict`` names."""
        return {name: array.copy() for name, array in zip(self.names(), self.arrays)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the weights of ``state`` (:meth:`state_dict`'s, or a torch MLP's as
        NumPy arrays), in place: the views handed out stay valid.

        Raises
        ------
        ValueError
            A missing, extra or misshapen weight.
        """
        names = self.names()
        if set(state) != set(names):
            raise ValueError(f"MLP weights {sorted(state)} do not match {names}")
        for name, array in zip(names, self.arrays):
            value = np.asarray(state[name], dtype=np.float32)
            if value.shape != array.shape:
                raise ValueError(f"{name} of shape {value.shape} does not fit {array.shape}")
            array[...] = value

    def widen_classifier(self, rows: int, seed: int) -> dict[int, np.ndarray]:
        """Grow the head to ``rows`` rows, the old ones kept, row ``r`` drawn from
        :func:`row_generator` ``(seed, r)`` (weights then bias, ``±1/sqrt(width)``).

        Returns
        -------
        dict
            ``id`` of each replaced array -> its successor (for the step's velocity).
        """
        weight, bias = self.weights[-1], self.biases[-1]
        old_rows, width = weight.shape
        if rows < old_rows:
            raise ValueError(f"a classifier of {old_rows} rows cannot shrink to {rows}")
        new_weight = np.empty((rows, width), dtype=np.float32)
        new_bias = np.empty(rows, dtype=np.float32)
        new_weight[:old_rows], new_bias[:old_rows] = weight, bias
        for row in range(old_rows, rows):
            row_weight, row_bias = uniform_rows(row_generator(seed, row), 1, width)
            new_weight[row], new_bias[row] = row_weight[0], row_bias[0]
        return self.replace(len(self.weights) - 1, new_weight, new_bias)

    def widen_input(self, features: int) -> dict[int, np.ndarray]:
        """Grow the first layer to ``features`` inputs, the new columns zero (every
        output stays as it was for inputs whose new features are 0); returns what
        :meth:`widen_classifier` returns."""
        weight = self.weights[0]
        if features < weight.shape[1]:
            raise ValueError(f"an input of {weight.shape[1]} features cannot shrink to {features}")
        wider = np.zeros((weight.shape[0], features), dtype=np.float32)
        wider[:, : weight.shape[1]] = weight
        return self.replace(0, wider, self.biases[0].copy())

    def replace(self, layer: int, weight: np.ndarray, bias: np.ndarray) -> dict[int, np.ndarray]:
        """Put ``weight`` and ``bias`` in place of layer ``layer``'s (every array moves to
        a new storage); the map from each old array's ``id`` to its successor."""
        old = list(self.arrays)
        weights, biases = list(self.weights), list(self.biases)
        weights[layer], biases[layer] = weight, bias
        NumpyMLP.__init__(self, weights, biases)
        return {id(before): after for before, after in zip(old, self.arrays)}

    def imprint_row(
        self, row: int, embedding: np.ndarray, known: Sequence[int] | None = None
    ) -> bool:
        """Set classifier row ``row`` from one sample's ``embedding`` (weight imprinting,
        :func:`stratify.stream.classifier.imprint_row`'s rule: the embedding rescaled to
        the known rows' mean norm, the bias their mean bias; ``known``: those rows when
        they are not ``0 … row − 1``); whether it was."""
        norm = float(np.linalg.norm(embedding))
        rows = list(range(row)) if known is None else list(known)
        if not rows or norm == 0 or not math.isfinite(norm):
            return False
        weight, bias = self.weights[-1], self.biases[-1]
        known_norm = float(np.linalg.norm(weight[rows], axis=1).mean())
        weight[row] = embedding * (known_norm / norm)
        bias[row] = bias[rows].mean()
        return True
