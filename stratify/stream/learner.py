"""The stream learner: events in, a global model that keeps learning, prequential metrics.

For every arriving labeled event (:meth:`StreamLearner.ingest`) it checks the event
without changing anything (a refused one raises :class:`~.events.EventError`), turning
its features into a raw row once, at the edge (:mod:`.features`); predicts it
(test-then-train, :mod:`.prequential`); registers its label and client where they are
new (:mod:`.class_rows`); adds it to the feature statistics and its client's buffer
(:mod:`.buffers`); and lets the policy train (:mod:`.policies`; more after a drift,
:mod:`.drift`), checking that the loss and the weights stayed finite. It holds a
:class:`~.model.StreamModel` and never asks which kind it is (docs/streaming.md, "The
model"). ``learn_one``, ``predict_one``, ``predict_proba_one``: river's per-event API.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from stratify.errors import ConfigError
from stratify.registry.base import LabelRegistry
from stratify.stream.blas import SingleThreadBlas
from stratify.stream.buffers import ClientBuffers
from stratify.stream.build import (
    build_stream_model,
    check_input_growth,
    default_policy,
    stream_device,
)
from stratify.stream.class_rows import ClassRows
from stratify.stream.config import StreamConfig, check_buffer_memory
from stratify.stream.drift import DriftAging, detector_of
from stratify.stream.events import (
    Event,
    EventError,
    FeatureName,
    Identifier,
    as_numpy,
    check_identifier,
    check_label,
)
from stratify.stream.features import StreamFeatures
from stratify.stream.learner_state import LearnerState
from stratify.stream.model import Prediction, StreamModel
from stratify.stream.policies import (
    DivergenceError,
    StreamContext,
    StreamPolicy,
    Training,
    divergence_message,
)
from stratify.stream.prequential import Prequential
from stratify.stream.stats import StreamStats

if TYPE_CHECKING:
    from torch import nn

__all__ = ["DivergenceError", "Prediction", "StreamLearner"]

#: held-out samples evaluated per forward pass
EVAL_BATCH = 1000
#: events between two aggregations of the label counts registered since: each counts the
#: one sample that brought its label, so they are public and added in the clear
#: (``flush_counts(public=True)``, docs/architecture.md, "Streaming"); the registry's
#: global counts lag the stream by at most this many events
COUNT_ROUND_EVENTS = 1000


class StreamLearner(LearnerState):
    """Learns a global model from samples arriving at clients, one event at a time.

    Parameters
    ----------
    config : StreamConfig
        The stream's settings (buffers, schedule, model, registry, scaling).
    model : torch.nn.Module, optional
        A model to keep training, e.g. one pre-trained in batch mode (default: a
        ``config.model`` sized from the first event's features,
        :func:`~stratify.stream.build.build_stream_model`). Its ``head`` must be a
        ``nn.Linear`` for the classifier to grow. A model trained on raw features wants
        ``scale="none"``.
    classes : sequence, optional
        The labels ``model``'s classifier rows stand for, in row order.
    registry : LabelRegistry, optional
        A registry to continue (default: a fresh one by ``config.secure``); its clients
        are ``clients``, in index order.
    clients : sequence, optional
        The clients ``registry`` already holds.
    policy : StreamPolicy, optional
        How to train (default: by ``config.algorithm``,
        :func:`~stratify.stream.build.default_policy`).
    drift : DriftAging, optional
        Drift detection that ages the buffers out (:mod:`.drift`); default: ``config.drift``'s.

    Examples
    --------
    >>> learner = StreamLearner(StreamConfig(secure=False, device="cpu"))
    >>> learner.learn_one({"size": 3.0, "ratio": 0.2}, "big")
    >>> learner.predict_one({"size": 2.9, "ratio": 0.3})
    'big'
    """

    def __init__(
        self,
        config: StreamConfig,
        *,
        model: nn.Module | None = None,
        classes: Sequence[Identifier] = (),
        registry: LabelRegistry | None = None,
        clients: Sequence[Identifier] = (),
        policy: StreamPolicy | None = None,
        drift: DriftAging | None = None,
    ) -> None:
        if not isinstance(config, StreamConfig):
            raise ConfigError(f"a StreamLearner needs a StreamConfig, got {type(config).__name__}")
        if policy is not None and not isinstance(policy, StreamPolicy):
            raise ConfigError(f"policy must be a StreamPolicy, got {type(policy).__name__}")
        self.config = config
        #: clients, classes, their registrations and the classes' model rows
        self.class_rows = ClassRows(config, registry, classes, clients)
        self.registry = self.class_rows.registry
        self.policy = policy if policy is not None else default_policy(config)
        self.device = stream_device(config, model, self.policy)
        #: one BLAS thread around the learner's own work on CPU (:mod:`.blas`)
        self.blas = SingleThreadBlas(enabled=self.device == "cpu")
        self.features = StreamFeatures(config, self.device, self.start, self.grow_input)
        self.prequential = Prequential(config.window)
        self.stats = StreamStats()
        self.given_model = model
        self.drift = drift if drift is not None else detector_of(config.drift)
        #: the last :meth:`predict`'s (features, row or None, prediction), for a ``learn_one``
        #: of the same object (progressive validation; docs/streaming.md, "river")
        self._last_prediction: tuple[object, Any, Prediction] | None = None
        self.model: StreamModel = None  # type: ignore[assignment]  # set by start()
        self.buffers: ClientBuffers = None  # type: ignore[assignment]  # set by start()
        self._context: StreamContext | None = None
        #: the event at which training diverged (``--on-diverge stop``); learning is over
        self.diverged: str | None = None
        if model is not None and config.input_shape is not None:
            self.start(config.input_shape)

    def context(self) -> StreamContext:
        """What the policy sees; made again only when the model grew or was rebuilt."""
        if self._context is None or self._context.buffers is not self.buffers:
            self._context = StreamContext(
                self.model, self.buffers, self.model.rows, self.features.tensor
            )
        return self._context

    def start(self, input_shape: tuple[int, ...], rows: int | None = None) -> None:
        """Build the model, the buffers, the scaler and the policy for samples of
        ``input_shape``; ``rows`` overrides the classifier's initial size.

        Raises
        ------
        ConfigError
            The model or the first client's buffer would not fit in memory, or the model
            cannot take such samples.
        """
        config, shape = self.config, tuple(input_shape)
        check_buffer_memory(config.capacity, math.prod(shape))
        known = len(self.classes)
        self.model = build_stream_model(
            config, shape, self.features, self.policy, self.device, self.given_model, known, rows
        )
        self._context = None
        self.features.fix(shape)
        self.buffers = ClientBuffers(config.capacity, shape, self.device, max_uses=config.max_uses)
        for _ in self.clients:
            self.buffers.add_client()
        if self.registry.result is not None:
            self.buffers.add_placeholder(self.registry.result.num_placeholders - 1)
        self.policy.setup(self.context())

    def grown(self, replaced: dict[int, Any]) -> None:
        """The model's parameters were replaced (``id`` of the old -> the new): the
        policy carries its state over (zero velocity for new rows or columns)."""
        self._context = None
        self.policy.classifier_grown(self.context(), replaced)

    def grow_input(self, names: list[FeatureName], features: int) -> None:
        """Widen the model's input and the buffers to ``features`` for the named features
        ``names``, new to the stream (:meth:`StreamFeatures.add_names`): zero weights in
        the first layer, so every prediction stays as it was.

        Raises
        ------
        EventError
            A model whose input cannot grow (``--input-shape`` given, or not an MLP), or
            one that would not fit in memory; nothing was changed.
        """
        check_input_growth(self.config, self.model, names[0], features)
        replaced = self.model.widen_input(features)
        self.buffers.widen((features,))
        self.grown(replaced)

    # -- one event ------------------------------------------------------------------------

    def ingest(self, event: Event, prediction: Prediction | None = None) -> bool:
        """Test on a labeled event, then learn from it; returns whether it was predicted
        right.

        Parameters
        ----------
        event : Event
            The event; its ``label`` must be given.
        prediction : Prediction, optional
            The prediction made when the event arrived without its label (a late label):
            it is scored instead of predicting again.

        Raises
        ------
        EventError
            The event cannot be ingested (bad features or feature count, a missing or
            mistyped label or client, a new client beyond ``max_clients``, a label beyond
            ``num_classes``, a label the registry refuses); nothing was changed.
        DivergenceError
            The updates after it made the loss or the weights non-finite
            (``--on-diverge stop``); learning is over.
        """
        if not isinstance(event, Event):
            raise EventError(f"ingest takes an Event, got {type(event).__name__}")
        with self.blas:
            return self._learn(
                event.x, event.label, event.client, event.line, prediction, True, event.checked
            )

    def learn_one(self, x: object, y: object, client: object = 0) -> None:
        """Learn one labeled sample arriving at ``client``, without testing on it.

        Parameters
        ----------
        x : list, dict, numpy.ndarray or torch.Tensor
            Its features (the first sample fixes their number or names).
        y : int, str or bool
            Its label.
        client : int or str
            The client it arrived at.

        Raises
        ------
        EventError, DivergenceError
            As :meth:`ingest`.
        """
        with self.blas:
            self._learn(x, y, client, 0, None, test=False, checked=False)

    def predict(self, x: object) -> Prediction | None:
        """The model's prediction for one sample, learning nothing (``None`` before the
        first labeled event)."""
        self.check_learning()
        raw = self.features.row(x, learning=False)
        if raw is None or not self.classes:
            return None
        with self.blas:
            prediction = self._predict(raw)
        self._last_prediction = (x, raw if self.features.reusable else None, prediction)
        return prediction

    def predict_one(self, x: object) -> Identifier | None:
        """The label predicted for one sample (``None`` before the first labeled event)."""
        prediction = self.predict(x)
        if prediction is None:
            return None
        return self.classes[prediction.row] if prediction.row < len(self.classes) else None

    def predict_proba_one(self, x: object) -> dict[Identifier, float]:
        """Every known label's probability for one sample (``{}`` before the first
        labeled event)."""
        prediction = self.predict(x)
        if prediction is None:
            return {}
        return {
            label: float(prediction.probabilities[row]) for row, label in enumerate(self.classes)
        }

    def check_learning(self) -> None:
        if self.diverged is not None:
            raise DivergenceError(self.diverged)

    def _learn(
        self,
        x: object,
        label: object,
        client_id: object,
        line: int,
        prediction: Prediction | None,
        test: bool,
        checked: bool,
    ) -> bool:
        self.check_learning()
        last, self._last_prediction = self._last_prediction, None
        last = last if last is not None and last[0] is x else None
        label = check_label(label)
        client_id = check_identifier(client_id, "client")
        raw = last[1] if last and last[1] is not None else self.features.row(x, checked=checked)
        rows = self.class_rows
        client = rows.client_index(client_id)
        row = rows.class_index(label)
        if not test and self.drift is not None and last is not None:
            prediction = last[2]  # nothing was learned since it was made
        if (test or self.drift is not None) and prediction is None and self.classes:
            prediction = self._predict(raw)
        # everything is checked once the label is registered (or refused)
        placeholder = rows.admit(client_id, client, label, row, self.buffers)
        new_class = row is None
        row = self.add_class(label) if row is None else row
        correct = prediction is not None and prediction.row == row
        if test:
            self.prequential.record(
                correct,
                target=row,
                predicted=prediction.row if prediction is not None else -1,
                probability=prediction.probability(row) if prediction is not None else 0.0,
            )
        self.features.update(raw)
        self.buffers.insert(client, raw, rows.model_rows[row], placeholder, line)
        if self.drift is not None:
            self.drift.update(not correct, self.buffers)
        if new_class and self.imprints:
            self.model.imprint(rows.model_rows[row], raw, rows.model_rows[:row])
        self.stats.events += 1
        rows.arrived(client, row, placeholder, self.buffers)
        if self.stats.events % COUNT_ROUND_EVENTS == 0:
            # each registration counts its one sample: the server knows these totals
            self.registry.flush_counts(public=True)
        for _ in range(1 if self.drift is None else 1 + self.drift.extra_rounds()):
            self.train(line)
        return correct

    def train(self, line: int) -> None:
        """Let the policy train, and check that the loss and the weights stayed finite."""
        undo = self.config.on_diverge == "skip"
        if undo:
            saved = self.model.save_weights()
            point = self.policy.save_point()
        done: Training = self.policy.after_arrival(self.context())
        if done.steps == 0 or (self.model.finite(done.losses) and math.isfinite(done.loss_sum)):
            self.stats.add(done)
        elif undo:
            self.model.restore_weights(saved)
            self.policy.restore_point(point)
            self.stats.undone += 1
        else:
            where = f"event {self.stats.events}" + (f" (line {line})" if line else "")
            self.diverged = divergence_message(self.policy, where, self.features.scaler is not None)
            raise DivergenceError(self.diverged)

    def add_class(self, label: Identifier) -> int:
        """Give ``label`` the next class index and its classifier row, widening the
        classifier if needed; returns the index."""
        row, model_row = self.class_rows.add_class(label)
        seed = self.config.seed
        rows_are_indices = self.class_rows.rows_are_indices
        if model_row < self.model.rows and rows_are_indices and row > 0 and not self.imprints:
            # a keyed row that waited for its class was pushed down by every step since:
            # it starts afresh, as a row grown for it would (an imprinted row is set from
            # the class's sample instead; docs/streaming.md, "Placeholders")
            self.model.redraw_row(model_row, seed)
        if model_row >= self.model.rows:
            # up to the span of the placement, so that every placeholder has its row
            rows = max(model_row + 1, self.registry.placeholder_span())
            self.grown(self.model.widen_classifier(rows, seed))
        return row

    @property
    def imprints(self) -> bool:
        """Whether a new class's row is imprinted (``--new-class``): ``auto`` imprints
        an MLP's only; a CNN on raw pixels learned worse with it (docs/architecture.md,
        "Streaming")."""
        choice = self.config.new_class
        return choice == "imprint" or (choice == "auto" and self.model.is_mlp)

    def _predict(self, raw: Any) -> Prediction:
        """The prediction for one raw row (the known classes' rows only, in class order:
        a keyed stream's classifier has rows no class has yet; docs/streaming.md,
        "Placeholders"); before the first class, row 0's."""
        probabilities = self.model.probabilities(raw, self.class_rows.model_rows or [0])
        return Prediction(int(probabilities.argmax()), probabilities)

    def test_accuracy(self, x_test: Any, labels: Sequence[Identifier]) -> float | None:
        """Accuracy on held-out samples (raw features, one row each, standardised as
        predictions are); a label the stream has not brought yet counts as wrong.
        ``None`` before the first event."""
        shape = self.features.input_shape
        if shape is None:
            return None
        targets = np.array([self.class_rows.class_of.get(label, -1) for label in labels])
        known = self.class_rows.model_rows or [0]
        x = as_numpy(x_test).reshape(-1, *shape)
        with self.blas:
            predicted = np.concatenate(
                [
                    self.model.predict_rows(x[at : at + EVAL_BATCH], known)
                    for at in range(0, len(x), EVAL_BATCH)
                ]
            )
        return float((predicted == targets).sum()) / len(targets)
