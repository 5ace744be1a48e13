"""The stream learner as a river classifier: river's tooling takes it as it takes its own.

:class:`StreamClassifier` follows river's ``base.Classifier`` contract (docs/streaming.md,
"river"): ``learn_one(x, y)`` returns nothing, ``predict_one`` a label,
``predict_proba_one`` a dict; it is multiclass, ``clone()`` makes a fresh one from its
constructor parameters, and ``evaluate.progressive_val_score``, ``compose.Pipeline`` and
river's metrics accept it. It reads a dictionary of features as river's linear models
do: a missing feature is 0 and a new one widens the input (``strict=True`` refuses
either, as ``--missing error`` does), names may be strings or integers, and clients are
not capped unless asked. It pickles with the secure registry: the pickle holds what a
stream's checkpoint holds (the model, the buffers, the feature statistics, the label
registrations and the placement key), never the registry's encryption keys, and an
unpickled classifier replays the registrations into a registry of its own, as
``stratify stream --resume`` does.

river is an optional dependency (``pip install -e '.[river]'``); nothing in the
core imports this module.
"""

from __future__ import annotations

import sys
from typing import Any

try:
    from river import base
except ImportError as missing:  # pragma: no cover - the extra is installed in the suite
    raise ImportError(
        "stratify.stream.river needs river: pip install -e '.[river]' in the checkout"
    ) from missing

from stratify.errors import ConfigError
from stratify.stream.config import StreamConfig
from stratify.stream.events import Identifier
from stratify.stream.learner import StreamLearner

#: what "no cap" on the clients is: registered as they come, the buffers of each
#: allocated at its first event, so memory grows with the clients the stream brings
UNCAPPED_CLIENTS = sys.maxsize


class StreamClassifier(base.Classifier):
    """Stratify's stream learner behind river's ``base.Classifier`` interface.

    Parameters
    ----------
    client : int or str, default 0
        The client a sample arrives at when ``learn_one`` is not told (river's tooling
        never tells it).
    strict : bool, default False
        Refuse an event whose named features differ from the first event's (a missing
        or a new one), as ``--missing error``; by default a missing feature is 0 and a
        new one widens the input, as river's linear models read them.
    max_clients : int, optional
        At most this many clients, a further new one refused; default: no cap.
    drift : bool, default True
        Detect drift in the prequential errors with river's ADWIN and age the buffers
        out on a change to more errors (:class:`~stratify.stream.drift.DriftAging`); on
        Phishing, Bananas, ImageSegments and digits it changes no prediction
        (docs/streaming.md, "river"). Each ``learn_one`` then predicts its sample first.
    **options
        Any other :class:`~stratify.stream.config.StreamConfig` field (``secure``,
        ``seed``, ``lr``, ``steps_per_event``, ``capacity``…), with its default.

    Examples
    --------
    >>> from river import evaluate, metrics
    >>> from river.datasets import synth
    >>> model = StreamClassifier(secure=False)
    >>> evaluate.progressive_val_score(synth.SEA(seed=0).take(200), model, metrics.Accuracy())
    Accuracy: ...
    """

    _multiclass = True

    def __init__(
        self,
        client: Identifier = 0,
        strict: bool = False,
        max_clients: int | None = None,
        drift: bool = True,
        **options: Any,
    ) -> None:
        for name in ("missing", "max_clients"):
            if name in options:
                raise ConfigError(f"StreamClassifier sets {name} itself; see strict, max_clients")
        self.client = client
        self.strict = strict
        self.max_clients = max_clients
        self.drift = drift
        self.options = options
        config = StreamConfig(
            missing="error" if strict else "zero",
            drift="adwin" if drift else "off",
            max_clients=UNCAPPED_CLIENTS if max_clients is None else max_clients,
            **options,
        )
        #: the learner everything is delegated to
        self.learner = StreamLearner(config)

    def learn_one(self, x: dict[Any, Any], y: Any, client: Identifier | None = None) -> None:
        """Learn one sample (the learner's :meth:`~StreamLearner.learn_one`).

        Parameters
        ----------
        x : dict
            Its features by name.
        y : int, str or bool
            Its label.
        client : int or str, optional
            The client it arrived at (default: ``self.client``).
        """
        self.learner.learn_one(x, y, client=self.client if client is None else client)

    def predict_one(self, x: dict[Any, Any], **kwargs: Any) -> Identifier | None:
        """The predicted label (``None`` before the first sample).

        Parameters
        ----------
        x : dict
            The features by name.
        **kwargs
            What river's tooling may pass besides; nothing of it is used.
        """
        return self.learner.predict_one(x)

    def predict_proba_one(self, x: dict[Any, Any], **kwargs: Any) -> dict[Identifier, float]:
        """Every known label's probability (``{}`` before the first sample).

        Parameters
        ----------
        x : dict
            The features by name.
        **kwargs
            What river's tooling may pass besides; nothing of it is used.
        """
        probabilities = self.learner.predict_proba_one(x)
        # the model's float32 softmax sums to 1 within 1e-7; river's contract (and its
        # checks) want a distribution that sums to 1 in double precision
        total = sum(probabilities.values())
        return {label: probability / total for label, probability in probabilities.items()}

    def __getstate__(self) -> dict[str, Any]:
        # the learner's checkpoint state (docs/streaming.md, "river"): no encryption key
        return {
            "params": self._get_params(),
            "state": self.learner.state_dict(),
            "drift": self.learner.drift,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        StreamClassifier.__init__(self, **state["params"])
        self.learner.load_state_dict(state["state"])
        self.learner.drift = state["drift"]
