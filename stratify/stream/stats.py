"""A stream learner's counters: events, steps, the training loss, undone updates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from stratify.stream.policies import Training

#: step losses kept on the device before they are summed (always after the same number of
#: steps, so a resumed stream sums exactly as an uninterrupted one)
PENDING_LOSSES = 1024


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

    def add(self, done: Training) -> None:
        """Count what a policy did after one arrival (kept, not undone)."""
        self.steps += done.steps
        self.trained_samples += done.trained_samples
        self.add_losses(done.losses)
        self.loss_sum += done.loss_sum
        self.loss_count += done.loss_count

    def add_losses(self, losses: list[torch.Tensor]) -> None:
        """Keep step losses left on the device, summed every :data:`PENDING_LOSSES`."""
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
        """The counters, the pending losses as a float32 vector."""
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
        """Restore :meth:`state_dict`, the pending losses onto ``device``."""
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
