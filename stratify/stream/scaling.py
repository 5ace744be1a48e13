"""Running standardisation of the features: every feature centred and scaled by the mean
and standard deviation of the events learned so far.

Raw features of very different scales (a price in thousands beside a ratio) make
single-sample SGD diverge; a stream cannot compute its statistics beforehand, so it keeps
them as it goes (Welford's algorithm, in float64). A prediction uses the statistics of
the earlier events only, so the prequential test never sees the sample it tests on;
training uses the statistics of every event learned so far, the sample included
(docs/architecture.md, "Streaming").
"""

from __future__ import annotations

from typing import Any

import torch

#: what ``--scale`` may be
SCALES = ("running", "none")
#: standardised values are clipped to ``[-CLIP, CLIP]``: a feature constant so far and then
#: different would otherwise become arbitrarily large
CLIP = 10.0
#: added to the variance, so a feature constant so far is only centred
EPSILON = 1e-8


class RunningScaler:
    """Per-feature running mean and variance, and the standardisation they give.

    Parameters
    ----------
    shape : tuple of int
        Shape of one sample.
    device : torch.device
        Where the statistics live (the model's device).
    """

    def __init__(self, shape: tuple[int, ...], device: torch.device) -> None:
        self.count = 0
        self.mean = torch.zeros(shape, dtype=torch.float64, device=device)
        self.m2 = torch.zeros(shape, dtype=torch.float64, device=device)
        # the standardisation as float32 shift and factor, refreshed by every update, so a
        # transform (two per event: the prediction and the training step) is three
        # element-wise operations
        self.shift = torch.zeros(shape, device=device)
        self.factor = torch.ones(shape, device=device)

    def update(self, x: torch.Tensor) -> None:
        """Add one sample to the statistics."""
        x = x.to(torch.float64)
        self.count += 1
        delta = x - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (x - self.mean)
        self.refresh()

    def refresh(self) -> None:
        """Recompute the float32 shift and factor from the statistics."""
        self.shift = self.mean.to(torch.float32)
        self.factor = (self.m2 / self.count + EPSILON).rsqrt_().to(torch.float32)

    def widen(self, shape: tuple[int]) -> None:
        """Statistics for samples of the flat ``shape``, at least as long as now; the new
        features count as 0 in every sample so far (mean and squared deviations 0)."""
        for name in ("mean", "m2"):
            old = getattr(self, name)
            grown = old.new_zeros(shape)
            grown[: old.numel()] = old.reshape(-1)
            setattr(self, name, grown)
        self.shift = self.mean.new_zeros(shape, dtype=torch.float32)
        self.factor = self.mean.new_ones(shape, dtype=torch.float32)
        if self.count:
            self.refresh()

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (one sample or a batch) standardised, clipped to ``[-10, 10]``, float32.
        Before any update it is returned as it is."""
        if self.count == 0:
            return x
        return ((x - self.shift) * self.factor).clamp_(-CLIP, CLIP)

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean.cpu(), "m2": self.m2.cpu()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mean, m2 = state["mean"], state["m2"]
        if tuple(mean.shape) != tuple(self.mean.shape) or tuple(m2.shape) != tuple(self.m2.shape):
            raise ValueError(f"scaler statistics of shape {tuple(mean.shape)} do not fit")
        self.count = int(state["count"])
        self.mean = mean.to(self.mean.device, torch.float64).clone()
        self.m2 = m2.to(self.m2.device, torch.float64).clone()
        if self.count:
            self.refresh()
