"""What the sum-based BatchNorm exchange shows the server of a share, and the attacks on it.

With ``--norm sumbn`` between parties that keep their samples, each share of a global
batch sends, layer by layer, its per-channel ``Σx``, ``Σx²`` and count of the layer's
input (docs/architecture.md, "Sum-based BatchNorm between parties"): for ResNet-20, 19
layers, 1,376 numbers a share. For a share of one sample they are that sample's
per-channel activation means and energies: the server, which holds the model, reads the
label off the last layers' means by the nearest class centroid (its centroids from a few
public labelled samples, sent through the same batch's statistics), and can fit an
input to all of them (inversion).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from stratify.nn.norm_exchange import (
    LayerSums,
    Party,
    _party_layers,
    _PartyPass,
    add_sums,
    forward_order,
)


def share_sums(
    model: nn.Module, x: torch.Tensor, shares: Sequence[np.ndarray]
) -> list[list[LayerSums]]:
    """Phase 1 of one global batch: what every share sends, layer by layer.

    Parameters
    ----------
    model : torch.nn.Module
        The global model (sum-combining BatchNorm layers).
    x : torch.Tensor
        The training inputs, indexed by position.
    shares : sequence of numpy.ndarray
        Each share's positions.

    Returns
    -------
    list of list of LayerSums
        ``result[k][l]``: share ``k``'s sums of layer ``l`` (given the batch's sums of the
        layers before ``l``, as the exchange gives them); the last entry is the batch's
        sums (the server's sum of the shares).
    """
    parties = [Party(model, x[torch.as_tensor(share)], torch.zeros(0)) for share in shares]
    sums: list[LayerSums] = []
    parts: list[list[LayerSums]] = [[] for _ in parties]
    for layer in range(len(parties[0].layers)):
        answers = [party.sums(sums, layer) for party in parties]
        for party_parts, answer in zip(parts, answers):
            party_parts.append(answer)
        sums.append(add_sums(answers))
    return [*parts, sums]


def means_of(sums: Sequence[LayerSums], last: int) -> np.ndarray:
    """A share's feature: the per-channel means ``Σx / n`` of the last ``last`` layers,
    each layer's scaled to unit norm (so wide and narrow layers weigh alike).

    Parameters
    ----------
    sums : sequence of LayerSums
        The share's sums, layer by layer.
    last : int
        How many of the last layers to read.
    """
    pieces = []
    for layer in sums[-last:]:
        mean = (layer.total / layer.count).detach().cpu().numpy()
        pieces.append(mean / max(np.linalg.norm(mean), 1e-12))
    return np.concatenate(pieces)


def nearest_centroid(features: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """The index of the closest centroid (Euclidean) of every row of ``features``.

    Parameters
    ----------
    features : numpy.ndarray
        ``(M, D)``.
    centroids : numpy.ndarray
        ``(C, D)``.
    """
    distances = ((features[:, None, :] - centroids[None, :, :]) ** 2).sum(-1)
    return np.argmin(distances, axis=1)


def infer_share_labels(
    model: nn.Module,
    x: torch.Tensor,
    shares: Sequence[np.ndarray],
    reference_x: torch.Tensor,
    reference_y: torch.Tensor,
    last: int = 3,
) -> np.ndarray:
    """The label the server infers for every share of one global batch from the sums
    the share sends: nearest class centroid of the last layers' means, the centroids
    the sums of the public ``reference`` samples of each class under the same batch's
    statistics.

    Parameters
    ----------
    model : torch.nn.Module
        The global model (the server holds it).
    x : torch.Tensor
        The training inputs, indexed by position (only the shares' are read: by their
        owners).
    shares : sequence of numpy.ndarray
        The batch's shares (positions).
    reference_x, reference_y : torch.Tensor
        Public labelled samples (the attacker's), every class present.
    last : int
        How many of the last layers' sums to read.
    """
    *parts, batch = share_sums(model, x, shares)
    classes = torch.unique(reference_y).tolist()
    centroids = []
    for label in classes:
        party = Party(model, reference_x[reference_y == label], torch.zeros(0))
        layers = len(batch)
        own = [party.sums(batch[:layer], layer) for layer in range(layers - last, layers)]
        centroids.append(means_of(own, last))
    features = np.stack([means_of(share, last) for share in parts])
    return np.asarray(classes)[nearest_centroid(features, np.stack(centroids))]


def sums_mismatch(
    model: nn.Module,
    guess: torch.Tensor,
    sums: Sequence[LayerSums],
    batch: Sequence[LayerSums],
) -> torch.Tensor:
    """How far ``guess``'s sums are from a one-sample share's, summed over the layers:
    squared differences of ``Σx`` (and of ``Σx²``) over the share's ``Σ‖x‖²`` (squared);
    differentiable in ``guess``.

    Parameters
    ----------
    model : torch.nn.Module
        The global model.
    guess : torch.Tensor
        ``(1, *shape)``: a candidate input.
    sums, batch : sequence of LayerSums
        What the share sent and the batch's sums, every layer.
    """
    layers = forward_order(model, guess.detach())
    handler = _PartyPass(layers, dict(enumerate(batch)), measure=None)
    with _party_layers(layers, handler):
        model(guess)
    loss = torch.zeros((), dtype=torch.float64)
    for position, target in enumerate(sums):
        total, squares, _ = handler.parts[position]
        scale = target.squares.sum().clamp_min(1e-12)
        loss = loss + ((total - target.total) ** 2).sum() / scale
        loss = loss + ((squares - target.squares) ** 2).sum() / scale**2
    return loss


def invert_one_sample(
    model: nn.Module,
    sums: Sequence[LayerSums],
    batch: Sequence[LayerSums],
    shape: tuple[int, ...],
    steps: int = 300,
    lr: float = 0.05,
    seed: int = 0,
) -> torch.Tensor:
    """An input whose sums match a one-sample share's in every layer: Adam on
    :func:`sums_mismatch` from a small seeded random start.

    Parameters
    ----------
    model : torch.nn.Module
        The global model.
    sums : sequence of LayerSums
        What the share sent, every layer.
    batch : sequence of LayerSums
        The batch's sums (the statistics the share normalised with).
    shape : tuple of int
        One input's shape.
    steps, lr : int, float
        Of the fit.
    seed : int
        Seed of the starting point.
    """
    generator = torch.Generator().manual_seed(seed)
    guess = (torch.randn(1, *shape, generator=generator) * 0.1).requires_grad_(True)
    optimizer = torch.optim.Adam([guess], lr=lr)
    for _ in range(steps):
        loss = sums_mismatch(model, guess, sums, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return guess.detach()[0]
