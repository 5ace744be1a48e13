"""What a stream learner reports and saves: its counters for the live display and the
metrics lines, and its state for a checkpoint (docs/streaming.md, "The model")."""

from __future__ import annotations

from typing import Any

from stratify.stream.buffers import ClientBuffers
from stratify.stream.class_rows import ClassRows
from stratify.stream.config import StreamConfig
from stratify.stream.events import FeatureSchema, Identifier
from stratify.stream.features import StreamFeatures
from stratify.stream.model import StreamModel
from stratify.stream.policies import StreamPolicy
from stratify.stream.prequential import Prequential
from stratify.stream.stats import StreamStats


class LearnerState:
    """The reporting and checkpoint half of :class:`~stratify.stream.learner.StreamLearner`
    (a mixin over the parts the learner holds)."""

    config: StreamConfig
    class_rows: ClassRows
    features: StreamFeatures
    model: StreamModel
    buffers: ClientBuffers
    policy: StreamPolicy
    prequential: Prequential
    stats: StreamStats
    device: str

    def start(self, input_shape: tuple[int, ...], rows: int | None = None) -> None:
        """Build the model and buffers for samples of ``input_shape`` (the learner's)."""
        raise NotImplementedError

    @property
    def started(self) -> bool:
        return self.features.input_shape is not None

    @property
    def classes(self) -> list[Identifier]:
        """The labels seen so far, in class order."""
        return self.class_rows.classes

    @property
    def clients(self) -> list[Identifier]:
        """The clients seen so far, in index order."""
        return self.class_rows.clients

    # -- reporting and checkpoints --------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """A few counters, cheap to read often (the live display)."""
        return {
            "events": self.stats.events,
            "window_accuracy": self.prequential.window_accuracy,
            "clients": len(self.clients),
            "classes": len(self.classes),
            "buffer_fill": self.buffers.fill if self.started else 0.0,
        }

    def snapshot(self) -> dict[str, Any]:
        """The learner's counters now, for a metrics line; the training loss is the mean
        since the previous snapshot."""
        started = self.started
        return {
            **self.status(),
            "steps": self.stats.steps,
            "trained_samples": self.stats.trained_samples,
            "prequential_accuracy": self.prequential.accuracy,
            **self.prequential.metrics(self.classes),
            "train_loss": self.stats.train_loss(),
            "undone_updates": self.stats.undone,
            "predicted": self.stats.predicted,
            "buffered": self.buffers.size if started else 0,
            "evicted_full": self.buffers.evicted_full if started else 0,
            "evicted_used": self.buffers.evicted_used if started else 0,
            **self.policy.counters(),
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue: the model and policy (server side), the buffers,
        label maps and registrations (client side), the feature statistics and the
        counters.

        The registry is kept as its sequence of registrations and replayed on load, so a
        learner continuing a registry it was given (``registry=``) cannot be restored.
        """
        started, features = self.started, self.features
        return {
            "input_shape": list(features.input_shape or ()),
            "rows": self.model.rows if started else 0,
            "model": self.model.state_dict() if started else {},
            **self.class_rows.state_dict(),
            "schema": list(features.schema.names) if features.schema is not None else None,
            "buffers": self.buffers.state_dict() if started else {},
            "scaler": features.scaler.state_dict() if features.scaler is not None else {},
            "policy": self.policy.state_dict() if started else {},
            "prequential": self.prequential.state_dict(),
            "stats": self.stats.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into a fresh learner of the same configuration.

        Raises
        ------
        ValueError, KeyError, TypeError, RuntimeError
            A state that does not fit this configuration.
        """
        rows = self.class_rows
        if self.started or rows.registrations or rows.clients or rows.unregistered:
            raise ValueError("only a fresh learner can load a stream's state")
        rows.load_state_dict(state)
        if state["schema"] is not None:
            # integer names (river's synthetic streams) stay integers
            names = [name if isinstance(name, int) else str(name) for name in state["schema"]]
            self.features.schema = FeatureSchema(names, self.config.missing)
        self.prequential.load_state_dict(state["prequential"])
        self.stats.load_state_dict(state["stats"], self.device)
        if not state["input_shape"]:
            return
        self.start(tuple(int(size) for size in state["input_shape"]), rows=int(state["rows"]))
        self.model.load_state_dict(state["model"])
        self.buffers.load_state_dict(state["buffers"])
        if self.features.scaler is not None:
            self.features.scaler.load_state_dict(state["scaler"])
        self.policy.load_state_dict(state["policy"])
