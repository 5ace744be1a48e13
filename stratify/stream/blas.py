"""One BLAS thread for the learner's own work, and the process's setting back after it.

A single sample's products are too small to split: on two busy cores a threaded rank-1
update of a 200×200 layer took 92 µs against 7 µs on one thread (docs/architecture.md,
"Streaming"). The learner used to set one thread for the whole process when it was
created, which changed the BLAS of everything else the process ran (docs/streaming.md,
"river"); :class:`SingleThreadBlas` sets it around the learner's work only.
:class:`RankOne` makes a step's two in-place BLAS updates through NumPy's own library.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from types import TracebackType
from typing import Any

import numpy as np


class SingleThreadBlas:
    """A re-entrant context: one BLAS thread inside it, each library's own count after it.

    The libraries are found once, when the context is first entered (NumPy's OpenBLAS is
    loaded by then); entering costs two calls into each library (an OpenBLAS is called
    straight through ``ctypes``, :func:`thread_calls`), a nested entry nothing (a stream
    run enters once for all its events).

    Parameters
    ----------
    enabled : bool, default True
        Whether to set the threads at all: a model on a GPU leaves them alone.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        #: per library, its (get, set) of the thread count
        self._libraries: list[tuple[Callable[[], int], Callable[[int], Any]]] | None = None
        self._saved: list[int] = []
        self._depth = 0

    def __enter__(self) -> SingleThreadBlas:
        self._depth += 1
        if self._depth == 1 and self.enabled:
            if self._libraries is None:
                from threadpoolctl import ThreadpoolController

                controller = ThreadpoolController().select(user_api="blas")
                self._libraries = [thread_calls(lib) for lib in controller.lib_controllers]
            self._saved = [get() for get, _ in self._libraries]
            for (_, set_threads), threads in zip(self._libraries, self._saved):
                if threads != 1:
                    set_threads(1)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._depth -= 1
        if self._depth == 0 and self._libraries is not None:
            for (_, set_threads), threads in zip(self._libraries, self._saved):
                if threads != 1:
                    set_threads(threads)

    def __getstate__(self) -> dict[str, Any]:
        # the libraries are this process's: an unpickled learner finds its own
        return {"enabled": self.enabled}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.enabled = state["enabled"]
        self._libraries = None
        self._saved = []
        self._depth = 0


def openblas_symbols(library: Any, *names: str) -> tuple[Any, ...] | None:
    """The C functions ``names`` of a ``threadpoolctl`` OpenBLAS controller's library, with
    the build's symbol prefix and suffix (``scipy_``, ``64_``), or ``None`` where one is
    missing."""
    prefix = getattr(library, "_symbol_prefix", "")
    suffix = getattr(library, "_symbol_suffix", "")
    try:
        return tuple(getattr(library.dynlib, f"{prefix}{name}{suffix}") for name in names)
    except AttributeError:
        return None


def thread_calls(library: Any) -> tuple[Callable[[], int], Callable[[int], Any]]:
    """The get and set of a ``threadpoolctl`` library controller's thread count: an
    OpenBLAS's own C functions (``threadpoolctl``'s methods look their symbols up on
    every call, about 4 µs each, twice per event of river's per-sample API), else the
    controller's methods."""
    if getattr(library, "internal_api", None) == "openblas":
        found = openblas_symbols(library, "openblas_get_num_threads", "openblas_set_num_threads")
        if found is not None:
            get, set_threads = found
            get.restype = ctypes.c_int
            get.argtypes = []
            set_threads.restype = None
            set_threads.argtypes = [ctypes.c_int]
            return get, set_threads
    return library.get_num_threads, library.set_num_threads


class RankOne:
    """The two in-place updates of a single-sample step, ``A += α·δ·xᵀ`` (BLAS ``ger``) and
    ``y += α·x`` (BLAS ``axpy``), through NumPy's own OpenBLAS, without importing SciPy.

    ``scipy.linalg.blas`` costs about 190 ms of import for these two calls; NumPy has no
    rank-1 update of its own, and writing one with ``np.outer`` and an in-place add costs
    2–4× the BLAS call on a 200×200 layer (three passes over the weights instead of one;
    docs/streaming.md, "Speed"). The library NumPy loaded is found by ``threadpoolctl``
    (as :class:`SingleThreadBlas` finds it) and its CBLAS symbols are called through
    ``ctypes``; where NumPy's BLAS is not an OpenBLAS with CBLAS symbols (an MKL or
    Accelerate build), the same updates are written in NumPy.

    Parameters
    ----------
    native : bool, default True
        Whether to look for the BLAS at all (``False``: the NumPy updates, for tests).
    """

    def __init__(self, native: bool = True) -> None:
        self._ger: Any = None
        self._axpy: Any = None
        #: the addresses of the arrays updated in place (a model's weights and velocity
        #: live as long as it does): ``array.ctypes.data`` costs about 3 µs a call
        self._addresses: dict[int, tuple[np.ndarray, int]] = {}
        #: the vectors of an update copied into memory of a known address
        self._vectors: dict[tuple[int, int], tuple[np.ndarray, int]] = {}
        if native:
            self._find()

    def _find(self) -> None:
        """Bind ``cblas_sger`` and ``cblas_saxpy`` of NumPy's OpenBLAS, if it has them."""
        from threadpoolctl import ThreadpoolController

        for library in ThreadpoolController().select(internal_api="openblas").lib_controllers:
            if "numpy" not in str(library.filepath):
                continue
            found = openblas_symbols(library, "cblas_sger", "cblas_saxpy")
            if found is None:
                return
            ger, axpy = found
            # an ILP64 build (suffix "64_") takes 64-bit integers
            ilp64 = getattr(library, "_symbol_suffix", "").startswith("64")
            integer = ctypes.c_int64 if ilp64 else ctypes.c_int32
            pointer, single = ctypes.c_void_p, ctypes.c_float
            ger.argtypes = [ctypes.c_int, integer, integer, single, pointer, integer]
            ger.argtypes += [pointer, integer, pointer, integer]
            ger.restype = None
            axpy.argtypes = [integer, single, pointer, integer, pointer, integer]
            axpy.restype = None
            self._ger, self._axpy = ger, axpy
            return

    @property
    def native(self) -> bool:
        """Whether the updates call the BLAS (else NumPy's in-place operations)."""
        return self._ger is not None

    def add_outer(
        self, matrix: np.ndarray, alpha: float, left: np.ndarray, right: np.ndarray
    ) -> None:
        """``matrix += alpha · outer(left, right)`` in place; ``matrix`` C-contiguous
        float32 of shape ``(len(left), len(right))``."""
        if self._ger is None:
            matrix += np.outer(np.float32(alpha) * left, right)
            return
        rows, columns = matrix.shape
        if left.shape != (rows,) or right.shape != (columns,):
            # BLAS would read and write past the arrays' memory
            raise ValueError(f"an outer product of {left.shape}, {right.shape} into {matrix.shape}")
        # CblasRowMajor (101): OpenBLAS runs the column-major ger on the transpose, as
        # scipy.linalg.blas.sger on matrix.T did
        self._ger(
            101,
            rows,
            columns,
            alpha,
            self._vector(0, left),
            1,
            self._vector(1, right),
            1,
            self._address(matrix),
            columns,
        )

    def add_scaled(self, target: np.ndarray, alpha: float, source: np.ndarray) -> None:
        """``target += alpha · source`` in place; both C-contiguous float32 of one size."""
        if self._axpy is None:
            target += np.float32(alpha) * source
            return
        if source.size != target.size:
            raise ValueError(f"adding {source.size} values to {target.size}")
        self._axpy(target.size, alpha, self._address(source), 1, self._address(target), 1)

    def _address(self, array: np.ndarray) -> int:
        """The address of a long-lived array (kept with it, so that its ``id`` is not
        reused while cached; a model that grew leaves a few stale entries behind)."""
        entry = self._addresses.get(id(array))
        if entry is None or entry[0] is not array:
            if len(self._addresses) > 256:  # replaced arrays of a grown model: forget them
                self._addresses.clear()
            if array.dtype != np.float32 or not array.flags.c_contiguous:
                raise ValueError("the BLAS updates take C-contiguous float32 arrays")
            entry = (array, array.ctypes.data)
            self._addresses[id(array)] = entry
        return entry[1]

    def _vector(self, which: int, values: np.ndarray) -> int:
        """The address of a copy of ``values`` (a fresh vector of one update) as float32,
        in memory kept per operand and size."""
        key = (which, values.shape[0])
        entry = self._vectors.get(key)
        if entry is None:
            vector = np.empty(values.shape[0], dtype=np.float32)
            entry = self._vectors[key] = (vector, vector.ctypes.data)
        np.copyto(entry[0], values)
        return entry[1]
