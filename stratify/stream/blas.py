"""One BLAS thread for the learner's own work, and the process's setting back after it.

A single sample's products are too small to split: on two busy cores a threaded rank-1
update of a 200×200 layer took 92 µs against 7 µs on one thread (docs/architecture.md,
"Streaming"). The learner used to set one thread for the whole process when it was
created, which changed the BLAS of everything else the process ran (docs/streaming.md,
"river"); :class:`SingleThreadBlas` sets it around the learner's work only.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any


class SingleThreadBlas:
    """A re-entrant context: one BLAS thread inside it, each library's own count after it.

    The libraries are found once, when the context is first entered (NumPy's and SciPy's
    OpenBLAS are loaded by then); entering costs two calls into each library (about 7 µs
    for two OpenBLAS copies here), a nested entry nothing (a stream run enters once for
    all its events).

    Parameters
    ----------
    enabled : bool, default True
        Whether to set the threads at all: a model on a GPU leaves them alone.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._libraries: list[Any] | None = None
        self._saved: list[int] = []
        self._depth = 0

    def __enter__(self) -> SingleThreadBlas:
        self._depth += 1
        if self._depth == 1 and self.enabled:
            if self._libraries is None:
                from threadpoolctl import ThreadpoolController

                controller = ThreadpoolController().select(user_api="blas")
                self._libraries = list(controller.lib_controllers)
            self._saved = [library.get_num_threads() for library in self._libraries]
            for library, threads in zip(self._libraries, self._saved):
                if threads != 1:
                    library.set_num_threads(1)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._depth -= 1
        if self._depth == 0 and self._libraries is not None:
            for library, threads in zip(self._libraries, self._saved):
                if threads != 1:
                    library.set_num_threads(threads)

    def __getstate__(self) -> dict[str, Any]:
        # the libraries are this process's: an unpickled learner finds its own
        return {"enabled": self.enabled}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.enabled = state["enabled"]
        self._libraries = None
        self._saved = []
        self._depth = 0
