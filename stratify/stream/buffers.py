"""The clients' bounded buffers: the only place a streamed sample is kept.

Every client holds at most ``capacity`` samples. A sample arriving at a full buffer
evicts that client's oldest one; with ``max_uses`` set, a sample leaves its buffer right
after its ``max_uses``-th training step. An evicted slot is zeroed, so nothing is kept
past its buffer (docs/architecture.md, "Streaming").

All buffers live in one array (client ``k`` owns slots ``k·capacity … (k+1)·capacity −
1``), so a training step slices its sample out of it like the batch engine slices
``x_train``: a NumPy array on CPU (seen by a torch model as a tensor sharing its memory),
a tensor on a GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from stratify.stream.events import as_numpy

if TYPE_CHECKING:
    import torch

#: counters of :class:`ClientBuffers`, in their state dict
COUNTERS = ("arrivals", "evicted_full", "evicted_used")


class ClientBuffers:
    """Per-client buffers of bounded capacity, with use counts.

    Parameters
    ----------
    capacity : int
        Samples each client may hold.
    sample_shape : tuple of int
        Shape of one sample's features.
    device : str
        Where the samples are stored (the model's device: ``cpu`` or ``cuda``).
    max_uses : int, optional
        Training steps a sample may take part in before it is evicted (default: no
        limit; it stays until newer samples push it out).

    Attributes
    ----------
    x_array, y_array : numpy.ndarray or None
        On CPU, every slot's features and class target (a row of the classifier); the
        per-event work reads and writes them (a NumPy access costs a fraction of a torch
        call). ``None`` on a GPU.
    x, y : torch.Tensor
        The same as tensors (on CPU sharing the arrays' memory), for a torch model.
    occupied : numpy.ndarray
        Whether a slot holds a sample.
    placeholder, uses, arrival, sample_id : numpy.ndarray
        Per slot: the sample's placeholder, its training steps so far, its arrival
        number (the buffers' arrival counter when it came) and its identity (the source
        line).
    counts : numpy.ndarray
        ``(clients, placeholders)``: buffered samples per client and placeholder, what the
        server sees of the buffers.
    arrivals, evicted_full, evicted_used : int
        Samples inserted; samples evicted by a newer one; samples evicted after their
        last allowed use.
    """

    def __init__(
        self,
        capacity: int,
        sample_shape: tuple[int, ...],
        device: str = "cpu",
        max_uses: int | None = None,
    ) -> None:
        self.capacity = capacity
        self.sample_shape = tuple(sample_shape)
        self.device = device
        self.on_cpu = device == "cpu"
        self.max_uses = max_uses
        self.num_clients = 0
        self.x_array: np.ndarray | None = None
        self.y_array: np.ndarray | None = None
        self._x: torch.Tensor | None = None
        self._y: torch.Tensor | None = None
        self.store(np.zeros((0, *self.sample_shape), dtype=np.float32), np.zeros(0, dtype=np.int64))
        self.occupied = np.zeros(0, dtype=bool)
        self.placeholder = np.zeros(0, dtype=np.int64)
        self.uses = np.zeros(0, dtype=np.int64)
        self.arrival = np.zeros(0, dtype=np.int64)
        self.sample_id = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros((0, 0), dtype=np.int64)
        self.arrivals = 0
        self.evicted_full = 0
        self.evicted_used = 0

    def store(self, x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor) -> None:
        """Hold ``x`` and ``y`` (arrays on CPU, tensors on the device) as the storage."""
        if self.on_cpu:
            self.x_array = np.ascontiguousarray(as_numpy(x), dtype=np.float32)
            self.y_array = np.ascontiguousarray(as_numpy(y), dtype=np.int64)
            self._x = self._y = None  # tensor views, made when a torch model asks
            return
        import torch

        self._x = torch.as_tensor(x).to(self.device, torch.float32)
        self._y = torch.as_tensor(y).to(self.device, torch.int64)

    @property
    def x(self) -> torch.Tensor:
        """Every slot's features as a tensor (on CPU: the same memory as :attr:`x_array`)."""
        if self._x is None:
            import torch

            self._x = torch.from_numpy(self.x_array)
        return self._x

    @property
    def y(self) -> torch.Tensor:
        """Every slot's class target as a tensor (on CPU: :attr:`y_array`'s memory)."""
        if self._y is None:
            import torch

            self._y = torch.from_numpy(self.y_array)
        return self._y

    def targets(self) -> np.ndarray:
        """Every slot's class target as a NumPy array (a copy on a GPU)."""
        return self.y_array if self.y_array is not None else self.y.cpu().numpy()

    # -- clients and placeholders ---------------------------------------------------------

    def add_client(self) -> int:
        """Give the next client an empty buffer; returns its index."""
        slots = len(self.occupied)
        needed = (self.num_clients + 1) * self.capacity
        if needed > slots:
            self._allocate(max(needed, 2 * slots))
        self.counts = np.pad(self.counts, ((0, 1), (0, 0)))
        self.num_clients += 1
        return self.num_clients - 1

    def _allocate(self, slots: int) -> None:
        """Grow the storage to ``slots`` slots, keeping every buffered sample."""
        extra = slots - len(self.occupied)
        if self.x_array is not None and self.y_array is not None:
            x: Any = np.zeros((slots, *self.sample_shape), dtype=np.float32)
            y: Any = np.zeros(slots, dtype=np.int64)
            x[: len(self.x_array)], y[: len(self.y_array)] = self.x_array, self.y_array
        else:
            import torch

            x = torch.cat([self.x, self.x.new_zeros((extra, *self.sample_shape))])
            y = torch.cat([self.y, self.y.new_zeros(extra)])
        self.occupied = np.concatenate([self.occupied, np.zeros(extra, dtype=bool)])
        for name in ("placeholder", "uses", "arrival", "sample_id"):
            values = getattr(self, name)
            setattr(self, name, np.concatenate([values, np.zeros(extra, dtype=np.int64)]))
        self.store(x, y)

    def add_placeholder(self, placeholder: int) -> None:
        """Make room in :attr:`counts` for placeholders up to ``placeholder``."""
        missing = placeholder + 1 - self.counts.shape[1]
        if missing > 0:
            self.counts = np.pad(self.counts, ((0, 0), (0, missing)))

    def widen(self, sample_shape: tuple[int]) -> None:
        """Flat samples of ``sample_shape`` from now on (named features: at least as many
        as now); the buffered samples get zeros for the new features."""
        if self.x_array is not None:
            grown: Any = np.zeros((len(self.x_array), *sample_shape), dtype=np.float32)
            grown[:, : self.sample_shape[0]] = self.x_array
        else:
            grown = self.x.new_zeros((len(self.x), *sample_shape))
            grown[:, : self.sample_shape[0]] = self.x
        self.sample_shape = tuple(sample_shape)
        self.store(grown, self.y_array if self.y_array is not None else self.y)

    def region(self, client: int) -> slice:
        """The slots of ``client``'s buffer."""
        return slice(client * self.capacity, (client + 1) * self.capacity)

    # -- samples --------------------------------------------------------------------------

    def insert(
        self,
        client: int,
        x: np.ndarray | torch.Tensor,
        target: int,
        placeholder: int,
        sample_id: int,
    ) -> int:
        """Store a sample in ``client``'s buffer, evicting its oldest sample when full;
        ``placeholder`` ``-1``: its label is not registered yet (:meth:`assign`).

        Returns
        -------
        int
            The slot the sample now occupies.
        """
        region = self.region(client)
        occupied = self.occupied[region]
        if occupied.all():
            oldest = int(np.argmin(self.arrival[region]))
            self.evict(region.start + oldest)
            self.evicted_full += 1
            slot = region.start + oldest
        else:
            slot = region.start + int(np.argmin(occupied))
        if self.x_array is not None and self.y_array is not None:
            self.x_array[slot] = as_numpy(x).reshape(self.sample_shape)
            self.y_array[slot] = target
        else:
            import torch

            self.x[slot].copy_(torch.as_tensor(x).reshape(self.sample_shape))
            self.y[slot] = target
        self.occupied[slot] = True
        self.placeholder[slot] = placeholder
        self.uses[slot] = 0
        self.arrival[slot] = self.arrivals
        self.sample_id[slot] = sample_id
        if placeholder >= 0:
            self.counts[client, placeholder] += 1
        self.arrivals += 1
        return slot

    def assign(self, client: int, target: int, placeholder: int) -> None:
        """Give ``client``'s buffered samples of class ``target`` that wait for their
        label's registration (placeholder ``-1``) their ``placeholder``: the schedule sees
        them from now on."""
        region = self.region(client)
        targets = self.targets()
        waiting = (
            self.occupied[region] & (self.placeholder[region] < 0) & (targets[region] == target)
        )
        self.placeholder[region][waiting] = placeholder
        self.counts[client, placeholder] += int(waiting.sum())

    def pick(self, client: int, placeholder: int) -> int:
        """The slot of ``client``'s sample of ``placeholder`` to train next: the least used,
        the oldest among those (the one closest to eviction). ``client`` must hold one."""
        region = self.region(client)
        candidates = np.flatnonzero(
            self.occupied[region] & (self.placeholder[region] == placeholder)
        )
        slots = region.start + candidates
        # least uses first, then earliest arrival: arrivals are distinct and below
        # ``arrivals``, so one key orders both (an argmin instead of a sort)
        keys = self.uses[slots] * (self.arrivals + 1) + self.arrival[slots]
        return int(slots[np.argmin(keys)])

    def target(self, slot: int) -> int:
        """The class target (classifier row) of the sample in ``slot``."""
        return int(self.y[slot] if self.y_array is None else self.y_array[slot])

    def use(self, slot: int, times: int = 1) -> bool:
        """Count ``times`` training uses of ``slot``; returns whether that evicted it."""
        self.uses[slot] += times
        if self.max_uses is not None and self.uses[slot] >= self.max_uses:
            self.evict(slot)
            self.evicted_used += 1
            return True
        return False

    def evict(self, slot: int) -> None:
        """Remove the sample in ``slot`` and zero its storage."""
        client = slot // self.capacity
        if self.placeholder[slot] >= 0:
            self.counts[client, self.placeholder[slot]] -= 1
        self.occupied[slot] = False
        if self.x_array is not None:
            self.x_array[slot] = 0.0
        else:
            self.x[slot].zero_()

    def age_out(self, before: int) -> int:
        """Evict every sample that arrived before arrival number ``before`` (a detected
        drift, :mod:`.drift`); returns how many. A sample whose label waits for its
        registration stays: its client registers the label from it."""
        old = self.occupied & (self.arrival < before) & (self.placeholder >= 0)
        slots = np.flatnonzero(old)
        for slot in slots:
            self.evict(int(slot))
        return len(slots)

    def client_slots(self, client: int) -> np.ndarray:
        """``client``'s occupied slots, oldest first."""
        region = self.region(client)
        slots = region.start + np.flatnonzero(self.occupied[region])
        return slots[np.argsort(self.arrival[slots], kind="stable")]

    def available(self) -> np.ndarray:
        """Per placeholder: whether some client buffers a sample of it."""
        return self.counts.sum(axis=0) > 0

    @property
    def size(self) -> int:
        """Samples buffered over all clients."""
        return int(self.occupied.sum())

    @property
    def fill(self) -> float:
        """Buffered samples over the clients' total capacity (0 with no client)."""
        total = self.num_clients * self.capacity
        return self.size / total if total else 0.0

    # -- checkpoint -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The buffers' contents (client data) and bookkeeping, as NumPy arrays and numbers."""
        used = self.num_clients * self.capacity
        x = self.x_array if self.x_array is not None else self.x.cpu().numpy()
        return {
            "num_clients": self.num_clients,
            "x": x[:used].copy(),
            "y": self.targets()[:used].copy(),
            **{
                name: getattr(self, name)[:used].copy()
                for name in ("occupied", "placeholder", "uses", "arrival", "sample_id")
            },
            "counts": self.counts.copy(),
            **{name: getattr(self, name) for name in COUNTERS},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into empty buffers of the same capacity and shape."""
        num_clients = int(state["num_clients"])
        x = state["x"]
        if tuple(x.shape) != (num_clients * self.capacity, *self.sample_shape):
            raise ValueError(
                f"buffers of shape {tuple(x.shape)} do not fit {num_clients} clients of "
                f"capacity {self.capacity} and samples of shape {self.sample_shape}"
            )
        self.num_clients = num_clients
        self.store(np.array(x, dtype=np.float32), np.array(state["y"], dtype=np.int64))
        self.occupied = np.array(state["occupied"], dtype=bool)
        for name in ("placeholder", "uses", "arrival", "sample_id"):
            setattr(self, name, np.array(state[name], dtype=np.int64))
        self.counts = np.array(state["counts"], dtype=np.int64)
        for name in COUNTERS:
            setattr(self, name, int(state[name]))
