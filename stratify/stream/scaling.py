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

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
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

    The statistics are NumPy arrays whatever the model's device: an update is a few
    element-wise operations on a few dozen numbers, which NumPy does in microseconds and
    a torch call per operation would multiply (docs/architecture.md, "Streaming").

    Parameters
    ----------
    shape : tuple of int
        Shape of one sample.
    device : str
        Where the standardisation of a tensor happens (the model's device).
    """

    def __init__(self, shape: tuple[int, ...], device: str = "cpu") -> None:
        self.device = device
        self.count = 0
        self.mean = np.zeros(shape, dtype=np.float64)
        self.m2 = np.zeros(shape, dtype=np.float64)
        # the standardisation as float32 shift and factor, refreshed by every update, so a
        # transform (two per event: the prediction and the training step) is three
        # element-wise operations
        self.shift = np.zeros(shape, dtype=np.float32)
        self.factor = np.ones(shape, dtype=np.float32)
        #: ``shift`` and ``factor`` as tensors on ``device``, made when first asked for
        self._tensors: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, x: np.ndarray | torch.Tensor) -> None:
        """Add one sample to the statistics."""
        values = x if isinstance(x, np.ndarray) else x.detach().cpu().numpy()
        values = values.astype(np.float64).reshape(self.mean.shape)
        self.count += 1
        delta = values - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (values - self.mean)
        self.refresh()

    def refresh(self) -> None:
        """Recompute the float32 shift and factor from the statistics."""
        self.shift = self.mean.astype(np.float32)
        self.factor = (1.0 / np.sqrt(self.m2 / self.count + EPSILON)).astype(np.float32)
        self._tensors = None

    def widen(self, shape: tuple[int]) -> None:
        """Statistics for samples of the flat ``shape``, at least as long as now; the new
        features count as 0 in every sample so far (mean and squared deviations 0)."""
        for name in ("mean", "m2"):
            old = getattr(self, name)
            grown = np.zeros(shape, dtype=np.float64)
            grown[: old.size] = old.reshape(-1)
            setattr(self, name, grown)
        self.shift = np.zeros(shape, dtype=np.float32)
        self.factor = np.ones(shape, dtype=np.float32)
        self._tensors = None
        if self.count:
            self.refresh()

    def transform_array(self, x: np.ndarray) -> np.ndarray:
        """A NumPy sample (or batch) standardised, clipped to ``[-10, 10]``, float32;
        returned as it is before any update."""
        if self.count == 0:
            return x
        out = (x - self.shift) * self.factor
        # the ufuncs themselves: np.clip's dispatch costs more than clipping a sample
        np.maximum(out, -CLIP, out=out)
        return np.minimum(out, CLIP, out=out)

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (one sample or a batch) standardised, clipped to ``[-10, 10]``, float32.
        Before any update it is returned as it is."""
        if self.count == 0:
            return x
        if self._tensors is None:
            import torch

            self._tensors = (
                torch.from_numpy(self.shift).to(self.device),
                torch.from_numpy(self.factor).to(self.device),
            )
        shift, factor = self._tensors
        return ((x - shift) * factor).clamp_(-CLIP, CLIP)

    def state_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "mean": self.mean.copy(),
            "m2": self.m2.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mean, m2 = state["mean"], state["m2"]
        if tuple(mean.shape) != self.mean.shape or tuple(m2.shape) != self.m2.shape:
            raise ValueError(f"scaler statistics of shape {tuple(mean.shape)} do not fit")
        self.count = int(state["count"])
        self.mean = np.array(mean, dtype=np.float64)
        self.m2 = np.array(m2, dtype=np.float64)
        if self.count:
            self.refresh()
