"""A stream's features: the one conversion of an event's features into a sample row,
and the standardisation the model sees them through.

The first event fixes the stream's sample shape (``--input-shape`` or its own) and, for
named features, their names (:class:`~stratify.stream.events.FeatureSchema`); every later
event's features are checked against them and converted once, at the edge, into a raw
row: a NumPy array on CPU, a tensor on the GPU. That row is what the model predicts
from, the scaler learns from and the buffers keep (docs/streaming.md, "The model").
With ``--missing zero`` a named feature new to the stream widens the input
(:meth:`StreamFeatures.add_names`), as river reads a dictionary of features.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from stratify.stream.config import StreamConfig
from stratify.stream.events import (
    Event,
    EventError,
    FeatureName,
    FeatureSchema,
    check_feature_name,
    check_features,
    is_feature_name,
)
from stratify.stream.scaling import RunningScaler

if TYPE_CHECKING:
    import torch


class StreamFeatures:
    """The stream's feature shape, names and running statistics.

    Parameters
    ----------
    config : StreamConfig
        The stream's settings (``input_shape``, ``missing``, ``scale``).
    device : str
        Where raw rows live (``cpu``: NumPy arrays; ``cuda``: tensors).
    start : callable
        Called with the sample shape when the first learned event fixes it (the learner
        builds its model and buffers).
    grow : callable
        Called with the new names and the new number of features before a named feature
        new to the stream widens the input; raises :class:`EventError` to refuse it.
    """

    def __init__(
        self,
        config: StreamConfig,
        device: str,
        start: Callable[[tuple[int, ...]], None],
        grow: Callable[[list[FeatureName], int], None],
    ) -> None:
        self.config = config
        self.device = device
        self.start = start
        self.grow = grow
        self.schema: FeatureSchema | None = None
        self.input_shape: tuple[int, ...] | None = None
        self.scaler: RunningScaler | None = None
        #: named features already warned about as missing (``--missing zero``)
        self.warned_missing: set[FeatureName] = set()
        #: whether learning may reuse the last :meth:`vector`'s row of the same object: a
        #: dictionary's (river's events, a fresh one each; an array may be refilled in
        #: between) when every feature was read (a prediction leaves new names out)
        self.reusable = False

    def fix(self, input_shape: tuple[int, ...]) -> None:
        """Fix the sample shape, with running statistics for it (``--scale running``)."""
        self.input_shape = tuple(input_shape)
        if self.config.scale == "running":
            self.scaler = RunningScaler(self.input_shape, self.device)

    def row(self, x: object, learning: bool = True, checked: bool = False) -> Any:
        """The raw row of an event's features (:meth:`vector`, shaped as the stream's
        samples, on the device); ``None`` when :meth:`vector` returns it."""
        vector = self.vector(x, learning=learning, checked=checked)
        if vector is None:
            return None
        assert self.input_shape is not None
        if self.device == "cpu":
            return vector.reshape(self.input_shape)
        import torch

        return torch.from_numpy(vector).reshape(self.input_shape).to(self.device)

    def vector(self, x: object, learning: bool = False, checked: bool = False) -> Any:
        """``x`` checked as the stream's samples, flat, float32 (raw: not standardised).
        The first learned event fixes the shape (:attr:`start`) and, for named features,
        the names; before it, when not ``learning``, returns ``None`` (nothing to predict
        with yet). ``checked``: ``x`` is what
        :func:`~stratify.stream.events.check_features` returned (a parsed event's), so
        only its number of features is checked.

        Raises
        ------
        EventError
            Not an array of finite numbers, or not as many features as the stream's.
        """
        if isinstance(x, Event):
            raise EventError("give the event's features (event.x), or call ingest(event)")
        self.reusable = isinstance(x, Mapping)
        if isinstance(x, Mapping):
            if self.schema is None and self.input_shape is not None:
                raise EventError("the stream's features are a list, not named (an object)")
            if self.schema is None:
                schema = FeatureSchema.first(x, self.config.missing)
                vector = schema.vector(x)
                if not learning:
                    return None
                self.schema = schema
            else:
                x = self.known_keys(x, learning)  # may widen the schema: read it after
                vector = self.schema.vector(x)
        else:
            if self.schema is not None:
                raise EventError("the stream's features are named (an object), not a list")
            vector = x if checked and isinstance(x, np.ndarray) else check_features(x)
        if self.input_shape is None:
            if not learning:
                return None
            shape = self.config.input_shape or tuple(vector.shape)
            if math.prod(shape) != vector.size:
                raise EventError(
                    f"{vector.size} features do not fit --input-shape {','.join(map(str, shape))}"
                )
            self.start(shape)
        assert self.input_shape is not None
        expected = math.prod(self.input_shape)
        if vector.size != expected:
            raise EventError(f"{vector.size} features, the stream's samples have {expected}")
        return vector

    def known_keys(self, x: Mapping[Any, Any], learning: bool) -> Mapping[Any, Any]:
        """Named features as river takes them, with ``--missing zero``: a missing one is
        0 (warned once per name), and a new one widens the input when learning
        (:meth:`add_names`) and is left out of a prediction (its weights would be 0).
        With ``--missing error`` ``x`` is returned as it is, for the schema to refuse."""
        assert self.schema is not None
        if self.config.missing == "error":
            return x
        index = self.schema.index
        if self.schema.string_names and x.keys() == index.keys():
            # exactly the stream's names, as most events have: nothing new, nothing missing
            # (a str name equals no other kind of key, so the set comparison is exact)
            return x
        new = [
            name
            for name in x
            if name not in index or not (type(name) is str or is_feature_name(name))
        ]
        if new and not learning:
            self.reusable = False
            return {name: value for name, value in x.items() if name in index}
        if new:
            self.add_names(new)
        for name in self.schema.names:
            if x.get(name) is None and name not in self.warned_missing:
                self.warned_missing.add(name)
                warnings.warn(
                    f"feature {name!r} is missing from an event: read as 0 (warned once)",
                    stacklevel=5,
                )
        return x

    def add_names(self, names: list[object]) -> None:
        """Widen the input by the named features ``names`` (:attr:`grow` widens the model
        and the buffers); the feature statistics count them as 0 in every event so far,
        as ``--missing zero`` reads them.

        Raises
        ------
        EventError
            A bad feature name, or an input that cannot grow; nothing was changed.
        """
        assert self.schema is not None
        checked = [check_feature_name(name) for name in names]
        features = len(self.schema.names) + len(checked)
        self.grow(checked, features)
        self.schema = FeatureSchema(self.schema.names + checked, self.config.missing)
        self.input_shape = (features,)
        if self.scaler is not None:
            self.scaler.widen(self.input_shape)
        warnings.warn(
            f"new feature(s) {', '.join(map(repr, checked))}: the input grows to {features} "
            "features, the events so far had them as 0",
            stacklevel=6,
        )

    def update(self, raw: Any) -> None:
        """Add a learned sample to the running statistics."""
        if self.scaler is not None:
            self.scaler.update(raw)

    def tensor(self, x: torch.Tensor) -> torch.Tensor:
        """Raw features (a tensor) as the model sees them: standardised by the statistics
        of the events learned so far."""
        return x if self.scaler is None else self.scaler.transform(x)

    def array(self, x: np.ndarray) -> np.ndarray:
        """:meth:`tensor` of a NumPy sample or batch."""
        return x if self.scaler is None else self.scaler.transform_array(x)
