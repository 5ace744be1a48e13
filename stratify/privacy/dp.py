"""Differential privacy for the updates: per-sample clipping and Gaussian noise, the pure
functions a private trainer applies on the client before anything leaves it
(docs/architecture.md, "Differential privacy"); the accounting is
:mod:`stratify.privacy.accounting`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def clip_factor(norm: torch.Tensor, clip: float) -> torch.Tensor:
    """``min(1, C / ‖g‖)``: what a gradient of norm ``norm`` is multiplied by to have a
    norm of at most ``C`` (1 for a zero gradient).

    Parameters
    ----------
    norm : torch.Tensor
        ``‖g‖``, one per sample (or a scalar).
    clip : float
        ``C > 0``.
    """
    return torch.clamp(clip / (norm + 1e-12), max=1.0)


def clip_gradient(gradients: Sequence[torch.Tensor], clip: float) -> list[torch.Tensor]:
    """One sample's gradient (a tensor per parameter) scaled to a total L2 norm of at
    most ``clip``; a smaller gradient is returned unchanged.

    Parameters
    ----------
    gradients : sequence of torch.Tensor
        One sample's gradient, a tensor per parameter.
    clip : float
        ``C > 0``.
    """
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in gradients]))
    factor = clip_factor(norm, clip)
    return [g * factor for g in gradients]


def clip_per_sample(gradients: Sequence[torch.Tensor], clip: float) -> list[torch.Tensor]:
    """Per-sample gradients (each tensor's first dimension is the sample) each clipped to
    norm ``clip`` and summed over the samples: ``Σ_i g_i · min(1, C/‖g_i‖)``.

    Parameters
    ----------
    gradients : sequence of torch.Tensor
        One tensor per parameter, of shape ``(samples, *parameter.shape)``.
    clip : float
        ``C > 0``.
    """
    flat = torch.stack([g.reshape(g.shape[0], -1).norm(dim=1) for g in gradients], dim=1)
    factors = clip_factor(flat.norm(dim=1), clip)
    return [torch.einsum("i,i...->...", factors.to(g.dtype), g) for g in gradients]


def add_noise(
    gradients: Sequence[torch.Tensor],
    noise_multiplier: float,
    clip: float,
    generator: torch.Generator,
) -> list[torch.Tensor]:
    """``g + N(0, σ²C²)`` on every coordinate, the noise drawn from ``generator``.

    Parameters
    ----------
    gradients : sequence of torch.Tensor
        A clipped gradient (or a sum of clipped per-sample gradients).
    noise_multiplier : float
        σ ≥ 0.
    clip : float
        ``C``: the sensitivity of the sum under adding or removing one sample.
    generator : torch.Generator
        On the gradients' device; seeded by the run.
    """
    scale = noise_multiplier * clip
    return [
        g + scale * torch.randn(g.shape, generator=generator, device=g.device, dtype=g.dtype)
        for g in gradients
    ]
