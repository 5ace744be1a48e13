"""Online streaming ingestion: samples arrive at clients over time and are learned as they
come (docs/architecture.md, "Streaming").

* :mod:`.events`: one sample at one client, parsed from JSON Lines, and the one check
  every event's values go through;
* :mod:`.features`: an event's features turned into a raw row once, and the running
  standardisation (:mod:`.scaling`) the model sees them through;
* :mod:`.class_rows`: the clients, the classes, their registrations and keyed rows;
* :mod:`.buffers`: the clients' bounded buffers, the only place a sample is kept;
* :mod:`.schedule`: the server's SLS over the placeholders available now, and routing;
* :mod:`.model`: the :class:`~.model.StreamModel` protocol, implemented in NumPy
  (:mod:`.numpy_model` over :mod:`.mlp`) and torch (:mod:`.torch_model` over
  :mod:`.classifier`), stepped by :mod:`.step`; :mod:`.build` chooses one;
* :mod:`.prequential`: test-then-train metrics (accuracy, macro-F1, log-loss, per-class
  recall, the majority-class baseline);
* :mod:`.policies`: how the learner trains (Stratify single-sample updates, or the
  periodic FedAvg baseline);
* :mod:`.learner`: :class:`StreamLearner`, one event at a time (its counters and
  checkpoint state: :mod:`.learner_state`, :mod:`.stats`);
* :mod:`.outputs`: the files a stream appends to (metrics, predictions);
* :mod:`.run`: :class:`StreamRun`, a source of events into a run folder, with checkpoints.
"""

from stratify.stream.config import StreamConfig
from stratify.stream.events import Event, EventError
from stratify.stream.learner import DivergenceError, StreamLearner
from stratify.stream.policies import (
    PeriodicFedAvg,
    SingleSampleUpdates,
    StreamContext,
    StreamPolicy,
    Training,
)

__all__ = [
    "DivergenceError",
    "Event",
    "EventError",
    "PeriodicFedAvg",
    "SingleSampleUpdates",
    "StreamConfig",
    "StreamContext",
    "StreamLearner",
    "StreamPolicy",
    "Training",
]
