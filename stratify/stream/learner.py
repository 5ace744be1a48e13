"""The stream learner: events in, a global model that keeps learning, prequential metrics.

For every arriving labeled event (:meth:`StreamLearner.ingest`):

1. check it (features, client, label) without changing anything; a refused event
   raises :class:`~stratify.stream.events.EventError` and leaves the learner as it was;
2. predict its label with the current model (test-then-train, :mod:`.prequential`);
3. if its client holds this label for the first time: a label new to the whole
   federation is registered now (:meth:`~stratify.registry.base.LabelRegistry.add_label`,
   plain or CKKS) and gets a classifier row (:mod:`.classifier`); a label the federation
   knows waits at the client, its samples buffered but not scheduled, until the client
   registers all such labels of its own in one round (at once for a scarce class:
   :meth:`scarce`)
   (:meth:`~stratify.registry.base.LabelRegistry.add_labels`, :meth:`register_held`);
4. add it to the running feature statistics (:mod:`.scaling`) and buffer it at its
   client (:mod:`.buffers`), evicting that client's oldest sample when the buffer is full;
5. let the training policy train (:mod:`.policies`; by default single-sample Stratify
   updates along the SLS over the placeholders the buffers hold), and check that the
   loss and the weights stayed finite.

:meth:`~StreamLearner.learn_one`, :meth:`~StreamLearner.predict_one` and
:meth:`~StreamLearner.predict_proba_one` are the per-event API online-learning users know:
learn without testing, and predict without learning.

The server's side (schedule, routing, model) sees placeholders and buffer counts only;
real labels stay with the clients: in their buffers, their label maps and the map from
labels to classifier rows (docs/architecture.md, "Streaming"). In a fresh stream a label's
classifier row is its placeholder, placed by a key the clients hold
(:meth:`~stratify.registry.base.LabelRegistry.place_stream`; the plain registry's key
follows from ``--seed``), not its arrival order (docs/streaming.md, "Placeholders").

With its defaults (an MLP on CPU trained by single-sample updates) the learner's model is
the NumPy MLP of :mod:`.mlp` and nothing on its path imports torch; a torch model (given,
another ``--model``, a GPU, or a policy that trains torch models) loads torch when the
learner starts.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from stratify.errors import ConfigError, RegistryError, TrainingError
from stratify.privacy.accounting import DPSettings, dp_settings_of
from stratify.registry import PlainRegistry
from stratify.registry.base import LabelRegistry
from stratify.stream.buffers import ClientBuffers
from stratify.stream.classifier import (
    classifier_head,
    head_input,
    imprint_row,
    widen_classifier,
    widen_input,
)
from stratify.stream.config import StreamConfig, check_buffer_memory, check_model_memory
from stratify.stream.events import (
    Event,
    EventError,
    FeatureSchema,
    Identifier,
    as_numpy,
    check_feature_name,
    check_features,
    check_identifier,
    check_label,
)
from stratify.stream.mlp import NumpyMLP
from stratify.stream.policies import (
    PeriodicFedAvg,
    SingleSampleUpdates,
    StreamContext,
    StreamPolicy,
    Training,
)
from stratify.stream.prequential import Prequential
from stratify.stream.scaling import RunningScaler
from stratify.stream.step import MLPArrays, configure_blas_for_single_sample, copy_of, quiet

if TYPE_CHECKING:
    import torch
    from torch import nn

#: held-out samples evaluated per forward pass
EVAL_BATCH = 1000
#: step losses kept on the device before they are summed (always after the same number of
#: steps, so a resumed stream sums exactly as an uninterrupted one)
PENDING_LOSSES = 1024
#: events between two aggregations of the label counts registered since: each counts the
#: one sample that brought its label, so they are public and added in the clear
#: (``flush_counts(public=True)``, docs/architecture.md, "Streaming"); the registry's
#: global counts lag the stream by at most this many events
COUNT_ROUND_EVENTS = 1000
#: events a client receives after a label the federation already knows arrived there for
#: the first time before it registers it: its new labels are then registered together, one
#: encrypted comparison for all of them (docs/architecture.md, "Streaming"); at most half
#: its buffer's capacity, so the sample that brought the label is still there. A label new
#: to the federation is registered at once.
REGISTRATION_ARRIVALS = 20


#: the placeholder of a buffered sample whose label its client has not registered yet
UNREGISTERED = -1


class DivergenceError(TrainingError):
    """The loss or the weights became non-finite; learning stopped (``--on-diverge stop``)."""


@dataclass
class StreamStats:
    """Counters of a stream learner (the policy keeps its own, e.g. transfers).

    Parameters
    ----------
    events : int
        Labeled events learned.
    steps : int
        Optimizer steps taken (undone ones not counted).
    trained_samples : int
        Per-sample gradients computed (a single-sample step: one; a mini-batch: its size),
        the training work whatever the policy.
    loss_sum, loss_count : float, int
        Summed training loss and the samples it covers since the last :meth:`train_loss`
        (losses still on the device are in ``pending_losses``).
    undone : int
        Events whose updates were undone because they diverged (``--on-diverge skip``).
    predicted : int
        Unlabeled events predicted.
    """

    events: int = 0
    steps: int = 0
    trained_samples: int = 0
    loss_sum: float = 0.0
    loss_count: int = 0
    undone: int = 0
    predicted: int = 0

    def __post_init__(self) -> None:
        self.pending_losses: list[torch.Tensor] = []

    def add_losses(self, losses: list[torch.Tensor]) -> None:
        for loss in losses:
            self.pending_losses.append(loss)
            if len(self.pending_losses) == PENDING_LOSSES:
                self._sum_pending()

    def _sum_pending(self) -> None:
        if self.pending_losses:
            import torch

            self.loss_sum += float(torch.stack(self.pending_losses).sum())
            self.loss_count += len(self.pending_losses)
            self.pending_losses = []

    def train_loss(self) -> float | None:
        """Mean training loss since the last call (``None`` without steps); resets it."""
        self._sum_pending()
        mean = self.loss_sum / self.loss_count if self.loss_count else None
        self.loss_sum, self.loss_count = 0.0, 0
        return mean

    def state_dict(self) -> dict[str, Any]:
        pending = self.pending_losses
        return {
            "events": self.events,
            "steps": self.steps,
            "trained_samples": self.trained_samples,
            "loss_sum": self.loss_sum,
            "loss_count": self.loss_count,
            "pending_losses": np.array([float(loss) for loss in pending], dtype=np.float32),
            "undone": self.undone,
            "predicted": self.predicted,
        }

    def load_state_dict(self, state: dict[str, Any], device: str) -> None:
        for name in ("events", "steps", "trained_samples", "loss_count", "undone", "predicted"):
            setattr(self, name, int(state[name]))
        self.loss_sum = float(state["loss_sum"])
        pending = np.asarray(state["pending_losses"], dtype=np.float32)
        if pending.ndim != 1:
            raise ValueError("pending losses must be a vector")
        self.pending_losses = []
        if len(pending):  # only a torch model's steps leave losses on the device
            import torch

            self.pending_losses = list(torch.from_numpy(pending).to(device).unbind())


@dataclass(frozen=True)
class Prediction:
    """What the model said about one sample: the row it predicts and every known row's
    probability (empty when the classifier has no class yet)."""

    row: int
    probabilities: np.ndarray

    def probability(self, row: int | None) -> float:
        if row is None or row >= len(self.probabilities):
            return 0.0
        return float(self.probabilities[row])


def placement_key(registry: LabelRegistry, seed: int) -> bytes:
    """The key placing a fresh stream's labels: derived from the clients' secrets (the
    secure registry draws them from the OS), else from ``seed`` (the plain registry's
    placement, like its placeholders, is seeded: anyone knowing ``--seed`` can undo it)."""
    if registry.secrets is not None:
        # what the clients share (all of them hold the label -> row map), never a client's
        # own order key
        return registry.secrets.shared.derive(b"stream placeholders")
    return hashlib.sha256(b"stratify stream placeholders %d" % seed).digest()


def make_stream_registry(config: StreamConfig) -> LabelRegistry:
    """The registry of ``config``: CKKS bounded by ``--num-classes``, or the plain one."""
    if not config.secure:
        return PlainRegistry(seed=config.seed)
    from stratify.registry.ckks import CKKSRegistry

    return CKKSRegistry(seed=config.seed, protocol=config.protocol, max_unique=config.num_classes)


class StreamLearner:
    """Learns a global model from samples arriving at clients, one event at a time.

    Parameters
    ----------
    config : StreamConfig
        The stream's settings (buffers, schedule, model, registry, scaling).
    model : torch.nn.Module, optional
        A model to keep training, e.g. one pre-trained in batch mode (default: a
        ``config.model`` sized from the first event's features: on CPU, an MLP is the
        NumPy :class:`~stratify.stream.mlp.NumpyMLP` when the policy trains one). Its
        ``head`` must be a ``nn.Linear`` for the classifier to grow. A model trained on
        raw features wants ``scale="none"``.
    classes : sequence, optional
        The labels ``model``'s classifier rows stand for, in row order.
    registry : LabelRegistry, optional
        A registry to continue (default: a fresh one by ``config.secure``); its clients
        are ``clients``, in index order.
    clients : sequence, optional
        The clients ``registry`` already holds.
    policy : StreamPolicy, optional
        How to train (default: by ``config.algorithm``,
        :class:`~stratify.stream.policies.SingleSampleUpdates` or
        :class:`~stratify.stream.policies.PeriodicFedAvg` with ``config``'s settings).

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
    ) -> None:
        if not isinstance(config, StreamConfig):
            raise ConfigError(f"a StreamLearner needs a StreamConfig, got {type(config).__name__}")
        if policy is not None and not isinstance(policy, StreamPolicy):
            raise ConfigError(f"policy must be a StreamPolicy, got {type(policy).__name__}")
        self.config = config
        #: whether the classifier rows are the registry's discovery order, which the clients
        #: then know (they hold the label -> row map): a fresh stream's, where a label
        #: takes the next row as it takes the next unique index; its registrations need no
        #: encrypted comparison (docs/architecture.md, "Streaming")
        self.rows_are_indices = registry is None and not classes
        self.registry = registry if registry is not None else make_stream_registry(config)
        #: the model's row of each class (by index in :attr:`classes`): the keyed
        #: placeholder in a fresh stream, else the index itself
        self.model_rows: list[int] = []
        self.row_key: bytes | None = None
        if self.rows_are_indices:
            self.row_key = placement_key(self.registry, config.seed)
            self.registry.place_stream(self.row_key, config.num_classes)
        registered = len(self.registry.result.client_maps) if self.registry.result else 0
        if registered != len(clients):
            raise ConfigError(
                f"the registry holds {registered} clients but {len(clients)} were named"
            )
        self.classes: list[Identifier] = [check_label(label) for label in classes]
        self.class_of = {label: row for row, label in enumerate(self.classes)}
        self.model_rows = list(range(len(self.classes)))
        self.clients: list[Identifier] = [check_identifier(c, "client") for c in clients]
        self.client_of = {client: index for index, client in enumerate(self.clients)}
        if len(self.class_of) != len(self.classes) or len(self.client_of) != len(self.clients):
            raise ConfigError("classes and clients must be distinct")
        self.policy = policy if policy is not None else default_policy(config)
        self.device = stream_device(config, model, self.policy)
        if self.device == "cpu":
            configure_blas_for_single_sample()
        #: whether the model is (to be) the NumPy MLP: no torch on the learner's path
        self.numpy_model = (
            model is None
            and config.model == "mlp"
            and self.device == "cpu"
            and self.policy.numpy_models
        )
        self.prequential = Prequential(config.window)
        self.stats = StreamStats()
        #: (client, label) in the order the clients registered them
        self.registrations: list[tuple[int, Identifier]] = []
        #: client -> labels it holds and has not registered yet (:data:`REGISTRATION_ARRIVALS`)
        self.unregistered: dict[int, list[Identifier]] = {}
        #: client -> events it received since the first of them
        self.waiting: dict[int, int] = {}
        self.model: Any = model  # NumpyMLP or torch module; set by start()
        self.buffers: ClientBuffers = None  # type: ignore[assignment]  # set by start()
        self.scaler: RunningScaler | None = None
        self.schema: FeatureSchema | None = None
        self.input_shape: tuple[int, ...] | None = None
        self.mode_matters = True
        #: an MLP's weights on CPU as NumPy arrays (the NumPy MLP itself, or views of a
        #: torch MLP's), for the prediction (:mod:`.step`)
        self.arrays: MLPArrays | None = None
        #: the model's parameters (arrays, or tensors detached): walking its modules for
        #: them every event would cost as much as a small model's step
        self.weights: list[Any] = []
        self._context: StreamContext | None = None
        #: named features already warned about as missing (``--missing zero``)
        self.warned_missing: set[str] = set()
        #: the event at which training diverged (``--on-diverge stop``); learning is over
        self.diverged: str | None = None
        if model is not None and config.input_shape is not None:
            self.start(config.input_shape)

    # -- set-up ---------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self.input_shape is not None

    @property
    def rows(self) -> int:
        """Rows of the classifier."""
        if isinstance(self.model, NumpyMLP):
            return self.model.rows
        return classifier_head(self.model).out_features

    def context(self) -> StreamContext:
        """What the policy sees (:class:`~stratify.stream.policies.StreamContext`); made
        again only when the model changed (:meth:`follow_model`)."""
        if self._context is None or self._context.buffers is not self.buffers:
            self._context = StreamContext(
                self.model, self.buffers, self.rows, self.training_features, self.array_features
            )
        return self._context

    def start(self, input_shape: tuple[int, ...], rows: int | None = None) -> None:
        """Build the model (unless given), the buffers, the scaler and the policy for
        samples of ``input_shape``; ``rows`` overrides the classifier's initial size.

        Raises
        ------
        ConfigError
            The model or the first client's buffer would not fit in memory, or the model
            cannot take such samples.
        """
        config = self.config
        features = math.prod(input_shape)
        check_buffer_memory(config.capacity, features)
        if rows is None:
            rows = config.num_classes or max(1, len(self.classes))
        if self.model is None and self.numpy_model:
            check_model_memory(config, tuple(input_shape), rows)
            self.model = NumpyMLP.build(features, rows, config.mlp_hidden, config.seed)
            self.mode_matters = False
        else:
            self.start_torch_model(tuple(input_shape), rows)
        if self.rows < len(self.classes) or (
            config.num_classes is not None and self.rows != config.num_classes
        ):
            raise ConfigError(
                f"the model's classifier has {self.rows} rows for "
                f"{len(self.classes)} known classes and --num-classes {config.num_classes}"
            )
        self.follow_model()
        self.input_shape = tuple(input_shape)
        self.buffers = ClientBuffers(
            config.capacity, self.input_shape, self.device, max_uses=config.max_uses
        )
        if config.scale == "running":
            self.scaler = RunningScaler(self.input_shape, self.device)
        for _ in self.clients:
            self.buffers.add_client()
        if self.registry.result is not None:
            self.buffers.add_placeholder(self.registry.result.num_placeholders - 1)
        self.policy.setup(self.context())

    def start_torch_model(self, input_shape: tuple[int, ...], rows: int) -> None:
        """Build (unless given) the torch model on the device, with torch's CPU settings
        for single-sample steps, and check that it can learn one sample at a time."""
        import torch
        from torch import nn

        from stratify.backend import configure_cpu_for_single_sample
        from stratify.nn.models import build_model
        from stratify.nn.norm import has_batch_norm

        if self.device == "cpu":
            configure_cpu_for_single_sample()
        config = self.config
        if self.model is None:
            check_model_memory(config, input_shape, rows)
            torch.manual_seed(config.seed)
            self.model = build_model(
                config.model, input_shape, rows, norm=config.norm, hidden=config.mlp_hidden
            )
        self.model = self.model.to(self.device)
        if has_batch_norm(self.model):
            raise ConfigError(
                f"{type(self.model).__name__} normalises with batch statistics, which one "
                "sample cannot give; use --norm gn (or none)"
            )
        classifier_head(self.model)  # refuses a model whose classifier cannot grow
        # switching a model between train and eval mode walks all its modules: on a small
        # model that costs as much as the prediction, so it is done only where it matters
        mode_dependent = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._NormBase)
        self.mode_matters = any(
            isinstance(module, mode_dependent) for module in self.model.modules()
        )

    def follow_model(self) -> None:
        """Take the model's parameters now (after it was built or its classifier grew)."""
        self.arrays = MLPArrays.of(self.model)
        if isinstance(self.model, NumpyMLP):
            self.weights = list(self.model.arrays)
        else:
            self.weights = [parameter.detach() for parameter in self.model.parameters()]
        self._context = None

    # -- features -------------------------------------------------------------------------

    def features(self, x: object, fix_shape: bool = True, checked: bool = False) -> Any:
        """``x`` checked and shaped as the stream's samples (raw: not standardised): a
        NumPy array on CPU, a tensor on the GPU. The first event fixes the shape
        (``config.input_shape`` or its own) and, for named features, the feature names;
        before it, with ``fix_shape=False``, returns ``None`` (nothing to predict with
        yet). ``checked``:
        ``x`` is what :func:`~stratify.stream.events.check_features` returned (a parsed
        event's), so only its number of features is checked.

        Raises
        ------
        EventError
            Not an array of finite numbers, or not as many features as the stream's.
        """
        if isinstance(x, Event):
            raise EventError("give the event's features (event.x), or call ingest(event)")
        if isinstance(x, Mapping):
            if self.schema is None and self.started:
                raise EventError("the stream's features are a list, not named (an object)")
            if self.schema is None:
                schema = FeatureSchema.first(x, self.config.missing)
                vector = schema.vector(x)
                if not fix_shape:
                    return None
                self.schema = schema
            else:
                x = self.known_keys(x, fix_shape)  # may widen the schema: read it after
                vector = self.schema.vector(x)
        else:
            if self.schema is not None:
                raise EventError("the stream's features are named (an object), not a list")
            vector = x if checked and isinstance(x, np.ndarray) else check_features(x)
        if not self.started:
            if not fix_shape:
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
        if self.device == "cpu":
            return vector.reshape(self.input_shape)
        import torch

        return torch.from_numpy(vector).reshape(self.input_shape).to(self.device)

    def known_keys(self, x: Mapping[Any, Any], learning: bool) -> Mapping[Any, Any]:
        """Named features as river takes them, with ``--missing zero``: a missing one is
        0 (warned once per name), and a new one widens the input when learning
        (:meth:`add_features`) and is left out of a prediction (its weights would be 0).
        With ``--missing error`` ``x`` is returned as it is, for the schema to refuse."""
        assert self.schema is not None
        if self.config.missing == "error":
            return x
        index = self.schema.index
        new = [name for name in x if not isinstance(name, str) or name not in index]
        if new and not learning:
            return {name: value for name, value in x.items() if name in index}
        if new:
            self.add_features(new)
        for name in self.schema.names:
            if x.get(name) is None and name not in self.warned_missing:
                self.warned_missing.add(name)
                warnings.warn(
                    f"feature {name!r} is missing from an event: read as 0 (warned once)",
                    stacklevel=4,
                )
        return x

    def add_features(self, names: list[object]) -> None:
        """Widen the input by the named features ``names``: zero weights in the first
        layer (every prediction stays as it was), zeros in the buffers and the feature
        statistics (the events so far had them as 0, as ``--missing zero`` reads them).

        Raises
        ------
        EventError
            A bad feature name, or a model whose input cannot grow (``--input-shape``
            given, or not an MLP); nothing was changed.
        """
        assert self.schema is not None and self.input_shape is not None
        checked = [check_feature_name(name) for name in names]
        if self.config.input_shape is not None or not self.is_mlp():
            raise EventError(
                f"feature {checked[0]!r} is new, and the model's input is fixed (an MLP "
                "sized from the first event grows; give --missing error to refuse such events)"
            )
        features = len(self.schema.names) + len(checked)
        try:
            check_buffer_memory(self.config.capacity, features)
            check_model_memory(self.config, (features,), self.rows)
        except ConfigError as error:
            raise EventError(str(error)) from None
        replaced: dict[int, Any]
        if isinstance(self.model, NumpyMLP):
            replaced = self.model.widen_input(features)
        else:
            replaced = widen_input(self.model, features)
        self.schema = FeatureSchema(self.schema.names + checked, self.config.missing)
        self.input_shape = (features,)
        self.buffers.widen(self.input_shape)
        if self.scaler is not None:
            self.scaler.widen(self.input_shape)
        self.follow_model()
        # the policy carries its state over to the replaced first layer as it does for a
        # grown classifier (zero velocity for the new columns)
        self.policy.classifier_grown(self.context(), replaced)
        warnings.warn(
            f"new feature(s) {', '.join(map(repr, checked))}: the input grows to {features} "
            "features, the events so far had them as 0",
            stacklevel=5,
        )

    def is_mlp(self) -> bool:
        """Whether the model is an MLP (NumPy's or :class:`stratify.nn.models.MLP`)."""
        if isinstance(self.model, NumpyMLP):
            return True
        from stratify.nn.models import MLP

        return isinstance(self.model, MLP)

    def model_features(self, x: torch.Tensor) -> torch.Tensor:
        """Raw features as the model sees them at prediction: standardised by the
        statistics of the events learned so far."""
        return x if self.scaler is None else self.scaler.transform(x)

    def training_features(self, x: torch.Tensor) -> torch.Tensor:
        """Buffered features as the model sees them in training (the same statistics)."""
        return self.model_features(x)

    def array_features(self, x: np.ndarray) -> np.ndarray:
        """:meth:`model_features` of a NumPy sample (the CPU path of an MLP)."""
        return x if self.scaler is None else self.scaler.transform_array(x)

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
        self._learn(x, y, client, 0, None, test=False, checked=False)

    def predict(self, x: object) -> Prediction | None:
        """The model's prediction for one sample, learning nothing (``None`` before the
        first labeled event)."""
        self.check_learning()
        features = self.features(x, fix_shape=False)
        if features is None or not self.classes:
            return None
        return self._predict(features)

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
        label = check_label(label)
        client_id = check_identifier(client_id, "client")
        raw = self.features(x, checked=checked)
        assert raw is not None
        client = self.client_of.get(client_id)
        if client is None:
            if len(self.clients) >= self.config.max_clients:
                raise EventError(
                    f"client {client_id!r} is new and --max-clients "
                    f"{self.config.max_clients} clients are registered"
                )
            client = len(self.clients)
        row = self.class_of.get(label)
        if row is not None and type(self.classes[row]) is not type(label):
            # Python takes 1 and True (0 and False) for one key: refused, never merged
            raise EventError(
                f"label {label!r} ({type(label).__name__}) equals the stream's label "
                f"{self.classes[row]!r} ({type(self.classes[row]).__name__}); give every "
                "label as one type"
            )
        if row is None and self.config.num_classes is not None:
            if len(self.classes) >= self.config.num_classes:
                raise EventError(
                    f"label {label!r} would be class {len(self.classes) + 1} of "
                    f"--num-classes {self.config.num_classes}"
                )
        if test and prediction is None and self.classes:
            prediction = self._predict(raw)
        is_new_client = client == len(self.clients)
        # a label new to the federation is registered now (the learner must know its
        # placeholder to train it, and only such a label can be refused); a known one new
        # to this client waits for the next batch of registrations
        if row is None:
            placeholder = self.placeholder_of(client, label)
        else:
            placeholder = self.known(client, label)
        # everything is checked: from here on the event is ingested
        if is_new_client:
            self.clients.append(client_id)
            self.client_of[client_id] = client
            self.buffers.add_client()
        if placeholder == UNREGISTERED and label not in self.unregistered.get(client, ()):
            self.waiting.setdefault(client, 0)
            self.unregistered.setdefault(client, []).append(label)
        if placeholder != UNREGISTERED:
            self.buffers.add_placeholder(placeholder)
        new_class = row is None
        if row is None:
            row = self.add_class(label)
        correct = prediction is not None and prediction.row == row
        if test:
            self.prequential.record(
                correct,
                target=row,
                predicted=prediction.row if prediction is not None else -1,
                probability=prediction.probability(row) if prediction is not None else 0.0,
            )
        if self.scaler is not None:
            self.scaler.update(raw)
        self.buffers.insert(client, raw, self.model_rows[row], placeholder, line)
        if new_class and self.imprints:
            self.imprint(row, raw)
        self.stats.events += 1
        if client in self.waiting:
            self.waiting[client] += 1
            limit = min(REGISTRATION_ARRIVALS, self.config.capacity // 2)
            if self.waiting[client] >= limit or (placeholder == UNREGISTERED and self.scarce(row)):
                self.register_held([client])
        if self.stats.events % COUNT_ROUND_EVENTS == 0:
            # each registration counts its one sample: the server knows these totals
            self.registry.flush_counts(public=True)
        self.train(line)
        return correct

    def train(self, line: int) -> None:
        """Let the policy train, and check that the loss and the weights stayed finite."""
        undo = self.config.on_diverge == "skip"
        if undo:
            saved = [copy_of(weight) for weight in self.weights]
            point = self.policy.save_point()
        done: Training = self.policy.after_arrival(self.context())
        if done.steps == 0 or self.finite(done):
            self.stats.steps += done.steps
            self.stats.trained_samples += done.trained_samples
            self.stats.add_losses(done.losses)
            self.stats.loss_sum += done.loss_sum
            self.stats.loss_count += done.loss_count
            return
        if undo:
            for weight, value in zip(self.weights, saved):
                weight[...] = value
            self.policy.restore_point(point)
            self.stats.undone += 1
            return
        where = f"event {self.stats.events}" + (f" (line {line})" if line else "")
        scaled = "" if self.scaler is not None else " --scale none"
        self.diverged = (
            f"training diverged at {where}: the loss or the weights became non-finite "
            f"with {self.policy.step_flags()}{scaled}; lower --lr"
            f"{'' if self.scaler is not None else ', use --scale running'}, or give "
            "--on-diverge skip to undo such updates and go on"
        )
        raise DivergenceError(self.diverged)

    def finite(self, done: Training) -> bool:
        """Whether the losses of ``done`` and every weight are finite (one device sync)."""
        if self.arrays is not None and not done.losses:
            # the squared norms of the MLP's own memory, in float32 as torch's norm: a NaN
            # or an infinity in a weight, or weights beyond ~1e19 (their square
            # overflows), make it non-finite
            squares = 0.0
            with quiet():
                for flat in self.arrays.flat:
                    squares += float(np.dot(flat, flat))
            return math.isfinite(squares) and math.isfinite(done.loss_sum)
        import torch

        total = torch.stack(torch._foreach_norm(self.weights)).sum()
        if done.losses:
            total = total + torch.stack(done.losses).sum()
        return math.isfinite(float(total)) and math.isfinite(done.loss_sum)

    def scarce(self, row: int) -> bool:
        """Whether the clients buffer fewer samples of class ``row`` than half a class's
        share of all they buffer: a class that appeared late, whose every sample should
        be trained at once (its client then registers it without waiting)."""
        held = np.bincount(self.buffers.targets()[self.buffers.occupied], minlength=self.rows)
        return 2 * len(self.classes) * int(held[self.model_rows[row]]) < int(held.sum())

    def known(self, client: int, label: Identifier) -> int:
        """The placeholder ``client`` registered for ``label``, or :data:`UNREGISTERED`."""
        maps = self.registry.result.client_maps if self.registry.result is not None else []
        if client < len(maps):
            return maps[client].get(label, UNREGISTERED)
        return UNREGISTERED

    def placeholder_of(self, client: int, label: Identifier) -> int:
        """The placeholder of ``label``, new to the federation, at ``client``: the labels
        the clients hold unregistered are registered first (clients join the registry in
        their order), then this one.

        Raises
        ------
        EventError
            The registry refuses ``label`` (too many classes, a hash collision); the
            learner is unchanged but for the labels registered first.
        """
        joined = len(self.registry.result.client_maps) if self.registry.result else 0
        self.register_held(range(joined, client))  # clients join the registry in order
        try:
            # the count waits for the next flush_counts (public: added in the clear)
            placeholder = self.registry.add_label(
                client, label, 1, defer_count=True, index=self.index_of(label)
            )
        except RegistryError as error:
            raise EventError(f"the registry refused it: {error}") from None
        self.registrations.append((client, label))
        return placeholder

    def register_held(self, clients: Sequence[int] | range) -> None:
        """Register the labels ``clients`` hold unregistered: each client all of its own
        in one round (:meth:`~stratify.registry.base.LabelRegistry.add_labels`), and make
        their buffered samples available to the schedule. A client that has not joined
        the registry has every client before it join first."""
        joined = len(self.registry.result.client_maps) if self.registry.result else 0
        wanted = set(clients)
        if wanted and max(wanted) >= joined:
            wanted.update(range(joined, max(wanted)))
        for client in sorted(wanted & set(self.unregistered)):
            labels = self.unregistered.pop(client)
            del self.waiting[client]
            indices = [self.class_of[label] for label in labels] if self.rows_are_indices else None
            placeholders = self.registry.add_labels(
                client, labels, [1] * len(labels), defer_count=True, indices=indices
            )
            for label, placeholder in zip(labels, placeholders):
                self.registrations.append((client, label))
                self.buffers.add_placeholder(placeholder)
                self.buffers.assign(client, self.model_rows[self.class_of[label]], placeholder)

    def index_of(self, label: Identifier) -> int | None:
        """Where the clients know ``label`` stands among the registry's unique labels: its
        classifier row (the next one for a new label) when :attr:`rows_are_indices`, else
        unknown (``None``: the registry discovers it)."""
        if not self.rows_are_indices:
            return None
        row = self.class_of.get(label)
        return len(self.classes) if row is None else row

    def model_row(self, index: int) -> int:
        """The model's row of the ``index``-th class: its keyed placeholder in a fresh
        stream (registered before its class is added), else ``index``."""
        if self.rows_are_indices and self.registry.stream_key is not None:
            return self.registry.placeholder_of_index[index]
        return index

    def add_class(self, label: Identifier) -> int:
        """Give ``label`` the next class index and its classifier row, widening the
        classifier if needed; returns the index."""
        row = len(self.classes)
        self.classes.append(label)
        self.class_of[label] = row
        model_row = self.model_row(row)
        self.model_rows.append(model_row)
        if model_row < self.rows and self.rows_are_indices and row > 0 and not self.imprints:
            # a keyed row that waited for its class was pushed down by every step since:
            # it starts afresh, as a row grown for it would (an imprinted row is set from
            # the class's sample instead; docs/streaming.md, "Placeholders")
            self.redraw_row(model_row)
        if model_row >= self.rows:
            replaced: dict[int, Any]
            # up to the span of the placement, so that every placeholder has its row
            rows = max(model_row + 1, self.registry.placeholder_span())
            if isinstance(self.model, NumpyMLP):
                replaced = self.model.widen_classifier(rows, self.config.seed)
            else:
                replaced = widen_classifier(self.model, rows, self.config.seed)
            self.follow_model()
            self.policy.classifier_grown(self.context(), replaced)
        return row

    def redraw_row(self, row: int) -> None:
        """Draw classifier row ``row`` again as growing the classifier draws it (from
        ``row_generator(seed, row)``, uniform in ``±1/sqrt(width)``)."""
        if isinstance(self.model, NumpyMLP):
            from stratify.stream.mlp import row_generator, uniform_rows

            weight, bias = self.model.weights[-1], self.model.biases[-1]
            new_weight, new_bias = uniform_rows(
                row_generator(self.config.seed, row), 1, weight.shape[1]
            )
            weight[row], bias[row] = new_weight[0], new_bias[0]
            return
        import torch

        from stratify.stream.classifier import row_generator as torch_row_generator

        head = classifier_head(self.model)
        width = head.in_features
        bound = 1.0 / math.sqrt(width)
        values = torch.empty(width + 1).uniform_(
            -bound, bound, generator=torch_row_generator(self.config.seed, row)
        )
        with torch.no_grad():
            head.weight[row] = values[:width].to(head.weight)
            if head.bias is not None:
                head.bias[row] = values[width].to(head.bias)

    @property
    def imprints(self) -> bool:
        """Whether a new class's row is imprinted (``--new-class``): ``auto`` imprints
        an MLP's only; a CNN on raw pixels learned worse with it (docs/architecture.md,
        "Streaming")."""
        choice = self.config.new_class
        return choice == "imprint" or (choice == "auto" and self.is_mlp())

    def imprint(self, row: int, raw: Any) -> None:
        """Imprint the classifier row of class ``row`` from the sample ``raw`` (raw
        features) that brought it, as training sees it (:func:`~.classifier.imprint_row`),
        scaled to the rows of the classes known before it."""
        target, known = self.model_rows[row], self.model_rows[:row]
        if isinstance(self.model, NumpyMLP):
            with quiet():
                self.model.imprint_row(
                    target, self.model.embedding(self.array_features(raw).reshape(-1)), known
                )
            return
        x = self.training_features(self.as_tensor(raw))
        embedding = head_input(self.model, x.unsqueeze(0))[0]
        imprint_row(classifier_head(self.model), target, embedding, known)

    def as_tensor(self, raw: Any) -> torch.Tensor:
        """Raw features (:meth:`features`) as a tensor on the device."""
        import torch

        return torch.as_tensor(raw).to(self.device)

    def _predict(self, raw: Any) -> Prediction:
        """The prediction for one sample of raw features (:meth:`features`)."""
        # the known classes' rows, in class order (the first event's row before it is added)
        known = self.model_rows or [0]
        if self.arrays is not None:
            # NumPy only, under one errstate: torch's no_grad and a second errstate cost
            # as much as the softmax (docs/architecture.md, "Streaming")
            x = self.array_features(raw).reshape(-1)
            with quiet():
                logits = self.arrays.activations(x)[-1][known]
                exp = np.exp(logits - logits.max())
                probabilities = exp / exp.sum()
            return Prediction(int(probabilities.argmax()), probabilities)
        import torch

        with torch.no_grad():
            x_model = self.model_features(self.as_tensor(raw))
            if self.mode_matters:
                self.model.eval()
            output = self.model(x_model.unsqueeze(0))[0, known]
            if self.mode_matters:
                self.model.train()
            probabilities_tensor = torch.softmax(output.float(), dim=0)
        return Prediction(int(probabilities_tensor.argmax()), probabilities_tensor.cpu().numpy())

    def test_accuracy(self, x_test: Any, labels: Sequence[Identifier]) -> float | None:
        """Accuracy on held-out samples (raw features, one row each, standardised as
        predictions are); a label the stream has not brought yet counts as wrong.
        ``None`` before the first event."""
        if self.input_shape is None:
            return None
        shape = self.input_shape
        x_test = as_numpy(x_test)
        targets = np.array([self.class_of.get(label, -1) for label in labels])
        predicted = np.empty(len(targets), dtype=np.int64)
        for start in range(0, len(targets), EVAL_BATCH):
            batch = x_test[start : start + EVAL_BATCH].reshape(-1, *shape)
            predicted[start : start + len(batch)] = self.predict_rows(batch)
        return float((predicted == targets).sum()) / len(targets)

    def predict_rows(self, batch: np.ndarray) -> np.ndarray:
        """The predicted class (index in :attr:`classes`) of every sample of a batch of
        raw features: the known classes' rows only, as :meth:`predict` (a keyed stream's
        classifier has rows no class has yet: docs/streaming.md, "Placeholders")."""
        known = self.model_rows or [0]
        if isinstance(self.model, NumpyMLP):
            with quiet():
                return self.model.logits(self.array_features(batch))[:, known].argmax(axis=1)
        import torch

        self.model.eval()
        with torch.no_grad():
            x = self.model_features(torch.from_numpy(batch).to(self.device))
            predicted = self.model(x)[:, known].argmax(dim=1).cpu().numpy()
        self.model.train()
        return predicted

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
        return {
            "input_shape": list(self.input_shape or ()),
            "rows": self.rows if self.started else 0,
            "model": model_state(self.model) if self.started else {},
            "classes": list(self.classes),
            # the clients' placement key: resuming needs the same placeholders and rows
            "row_key": self.row_key.hex() if self.row_key is not None else None,
            "clients": list(self.clients),
            "schema": list(self.schema.names) if self.schema is not None else None,
            "registrations": [[client, label] for client, label in self.registrations],
            "unregistered": [
                [client, label] for client, labels in self.unregistered.items() for label in labels
            ],
            "waiting": [[client, events] for client, events in self.waiting.items()],
            "buffers": self.buffers.state_dict() if self.started else {},
            "scaler": self.scaler.state_dict() if self.scaler is not None else {},
            "policy": self.policy.state_dict() if self.started else {},
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
        if self.started or self.registrations or self.clients or self.unregistered:
            raise ValueError("only a fresh learner can load a stream's state")
        rows = {label: row for row, label in enumerate(state["classes"])}
        if self.rows_are_indices:
            # a checkpoint of an earlier version placed labels in arrival order
            key = state.get("row_key")
            self.row_key = bytes.fromhex(key) if key is not None else None
            self.registry.place_stream(self.row_key, self.config.num_classes)
        for client, label in state["registrations"]:
            index = rows[label] if self.rows_are_indices else None
            self.registry.add_label(int(client), label, 1, defer_count=True, index=index)
            self.registrations.append((int(client), label))
        self.registry.flush_counts(public=True)
        # a checkpoint of an earlier version registered every label at once
        for client, label in state.get("unregistered", []):
            self.unregistered.setdefault(int(client), []).append(label)
        self.waiting = {int(client): int(events) for client, events in state.get("waiting", [])}
        self.classes = list(state["classes"])
        self.class_of = {label: row for row, label in enumerate(self.classes)}
        self.model_rows = [self.model_row(index) for index in range(len(self.classes))]
        self.clients = list(state["clients"])
        self.client_of = {client: index for index, client in enumerate(self.clients)}
        if state["schema"] is not None:
            self.schema = FeatureSchema(
                [str(name) for name in state["schema"]], self.config.missing
            )
        self.prequential.load_state_dict(state["prequential"])
        self.stats.load_state_dict(state["stats"], self.device)
        if not state["input_shape"]:
            return
        self.model = None  # type: ignore[assignment]  # rebuilt by start() at its saved size
        self.start(tuple(int(size) for size in state["input_shape"]), rows=int(state["rows"]))
        load_model_state(self.model, state["model"])
        self.buffers.load_state_dict(state["buffers"])
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.policy.load_state_dict(state["policy"])


def stream_device(config: StreamConfig, model: object, policy: StreamPolicy) -> str:
    """Where a stream's model and buffers live: ``cpu`` or ``cuda``. ``auto`` is the CPU
    for the default MLP of a policy that trains the NumPy MLP (a single-sample step of it
    is launch-bound on a GPU: docs/architecture.md, "Streaming"), else ``cuda`` when torch
    sees a GPU; torch is loaded only to ask it."""
    if config.device == "cpu" or (
        config.device == "auto" and model is None and config.model == "mlp" and policy.numpy_models
    ):
        return "cpu"
    from stratify.backend import resolve_device

    return resolve_device(config.device).type


def model_state(model: Any) -> dict[str, np.ndarray]:
    """The weights of ``model`` (the NumPy MLP, or a torch module) as NumPy arrays under
    its ``state_dict`` names."""
    if isinstance(model, NumpyMLP):
        return model.state_dict()
    return {name: value.detach().cpu().numpy() for name, value in model.state_dict().items()}


def load_model_state(model: Any, state: dict[str, Any]) -> None:
    """Load :func:`model_state`'s weights into ``model``."""
    if isinstance(model, NumpyMLP):
        model.load_state_dict(state)
        return
    import torch

    model.load_state_dict(
        {name: torch.as_tensor(np.asarray(value)) for name, value in state.items()}
    )


def default_policy(config: StreamConfig) -> StreamPolicy:
    """The policy of ``config.algorithm`` with ``config``'s settings."""
    if config.algorithm == "fedavg-periodic":
        return PeriodicFedAvg(
            every=int(config.fedavg_option("retrain_every")),
            local_epochs=int(config.fedavg_option("local_epochs")),
            local_batch_size=int(config.fedavg_option("local_batch_size")),
            lr=config.lr,
            local_momentum=float(config.fedavg_option("local_momentum")),
            seed=config.seed,
        )
    privacy = dp_settings_of(config)
    return SingleSampleUpdates(
        steps_per_event=config.steps_per_event,
        chunk=config.chunk,
        selection=config.selection,
        lr=config.lr,
        momentum=config.momentum,
        seed=config.seed,
        **({} if privacy is None else stream_privacy(config, privacy)),
    )


def stream_privacy(config: StreamConfig, privacy: DPSettings) -> dict[str, Any]:
    """The DP arguments of a stream's policy: each sample takes at most ``--max-uses``
    noised steps, so σ is calibrated for that many (docs/architecture.md, "Differential
    privacy")."""
    assert config.max_uses is not None  # StreamConfig refuses DP without it
    return {
        "dp_clip": privacy.clip,
        "dp_noise": privacy.sigma(config.max_uses),
        "dp_seed": privacy.seed,
    }
