"""A model that grows: a wider ``model.head`` for a class seen for the first time, and a
wider first layer of an MLP for a named feature seen for the first time (:func:`widen_input`).

Every model is ``head(embed(x))`` with ``head`` a ``nn.Linear`` (:mod:`stratify.nn.models`).
Growing replaces the head with one of more rows that keeps the old rows exactly, so the
logits of the known classes do not change; the new rows are initialised as ``nn.Linear``
initialises its own, from a generator seeded by the run's seed and the row; the step
carries its momentum over to the new parameters (zero for the new rows). A class's row is
then *imprinted* from the first sample of the class (:func:`imprint_row`;
``--new-class``, by default for an MLP: docs/architecture.md "Streaming"), so the class
is predicted from its second example on instead of after dozens of steps.

These functions work on torch models; the stream's NumPy MLP does the same with its own
methods (:class:`~stratify.stream.mlp.NumpyMLP`). torch is imported by the functions, so
that importing this module does not load it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from stratify.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from stratify.nn.models import MLP

#: how a class new to the stream gets its classifier row (``--new-class``): ``auto``
#: imprints an MLP's rows and draws other models' at random (docs/architecture.md,
#: "Streaming", has the measurements behind it)
NEW_CLASS_ROWS = ("auto", "imprint", "random")


def classifier_head(model: nn.Module) -> nn.Linear:
    """``model.head``, which must be the final ``nn.Linear``."""
    from torch import nn

    head = getattr(model, "head", None)
    if not isinstance(head, nn.Linear):
        raise ConfigError(
            f"{type(model).__name__} has no linear classifier `head`, so it cannot grow "
            "new classes; give --num-classes, or use a model of stratify.nn.models"
        )
    return head


def row_generator(seed: int, row: int) -> torch.Generator:
    """The generator that initialises classifier row ``row`` of a run seeded ``seed``."""
    import torch

    entropy = np.random.SeedSequence([seed, row, 0x6E6577]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(entropy))


def widen_head(head: nn.Linear, rows: int, seed: int) -> nn.Linear:
    """A copy of ``head`` with ``rows`` output rows: the old ones kept, new ones drawn.

    Parameters
    ----------
    head : torch.nn.Linear
        The current classifier.
    rows : int
        Rows of the new classifier, at least ``head.out_features``.
    seed : int
        Run seed; row ``r`` is drawn from :func:`row_generator` ``(seed, r)`` with
        ``nn.Linear``'s bound ``1/sqrt(in_features)`` for weights and bias alike.
    """
    import torch
    from torch import nn

    old_rows, width = head.out_features, head.in_features
    if rows < old_rows:
        raise ValueError(f"a classifier of {old_rows} rows cannot shrink to {rows}")
    wider = nn.Linear(width, rows, bias=head.bias is not None)
    wider = wider.to(device=head.weight.device, dtype=head.weight.dtype)
    bound = 1.0 / math.sqrt(width)
    with torch.no_grad():
        wider.weight[:old_rows] = head.weight
        if head.bias is not None:
            wider.bias[:old_rows] = head.bias
        for row in range(old_rows, rows):
            values = torch.empty(width + 1).uniform_(
                -bound, bound, generator=row_generator(seed, row)
            )
            wider.weight[row] = values[:width].to(wider.weight)
            if head.bias is not None:
                wider.bias[row] = values[width].to(wider.bias)
    return wider


def widen_classifier(model: nn.Module, rows: int, seed: int) -> dict[int, torch.Tensor]:
    """Widen ``model.head`` to ``rows`` rows in place (:func:`widen_head`).

    Returns
    -------
    dict
        ``id`` of each replaced parameter -> the parameter that replaces it, for whoever
        keeps state over the old ones (the step's velocity:
        :meth:`~stratify.stream.step.SingleSampleStep.follow`).
    """
    head = classifier_head(model)
    wider = widen_head(head, rows, seed)
    replaced = {id(head.weight): wider.weight}
    if head.bias is not None:
        replaced[id(head.bias)] = wider.bias
    model.head = wider
    return replaced


def widen_input(model: MLP, features: int) -> dict[int, torch.Tensor]:
    """Widen the first ``nn.Linear`` of ``model.layers`` (an MLP's) to ``features`` inputs
    in place, the new columns zero, so every output stays as it was for inputs whose new
    features are 0.

    Returns
    -------
    dict
        ``id`` of each replaced parameter -> the parameter that replaces it, as
        :func:`widen_classifier` returns.
    """
    import torch
    from torch import nn

    layers = model.layers
    position = next(i for i, layer in enumerate(layers) if isinstance(layer, nn.Linear))
    first = layers[position]
    assert isinstance(first, nn.Linear)
    if features < first.in_features:
        raise ValueError(f"an input of {first.in_features} features cannot shrink to {features}")
    wider = nn.Linear(features, first.out_features, bias=first.bias is not None)
    wider = wider.to(device=first.weight.device, dtype=first.weight.dtype)
    with torch.no_grad():
        wider.weight.zero_()
        wider.weight[:, : first.in_features] = first.weight
        if first.bias is not None:
            wider.bias.copy_(first.bias)
    replaced = {id(first.weight): wider.weight}
    if first.bias is not None:
        replaced[id(first.bias)] = wider.bias
    layers[position] = wider
    return replaced


def head_input(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What ``model.head`` receives for the batch ``x`` (the features the classifier
    reads: an MLP's last hidden layer), in eval mode."""
    import torch

    seen: list[torch.Tensor] = []
    head = classifier_head(model)
    hook = head.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0]))
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(x)
    finally:
        hook.remove()
        model.train(training)
    return seen[0]


def imprint_row(
    head: nn.Linear, row: int, embedding: torch.Tensor, known: Sequence[int] | None = None
) -> bool:
    """Set classifier row ``row`` from one sample of its class (weight imprinting: Qi,
    Brown and Lowe, "Low-Shot Learning with Imprinted Weights", CVPR 2018).

    The row's weights become ``embedding`` (what the head receives for the sample)
    rescaled to the mean norm of rows ``0 … row − 1`` (the classes known before it), and
    its bias their mean bias: on that sample the new logit is at least as large as a
    known class's of the same norm and bias, and it stays ahead on samples whose
    embedding points the same way. Nothing changes for the first class, or an embedding
    that is zero or not finite (a random row stays).

    Parameters
    ----------
    head : torch.nn.Linear
        The classifier, changed in place.
    row : int
        The new class's row; the rows before it are the known classes'.
    embedding : torch.Tensor
        One sample's input to ``head``, of ``head.in_features`` values.
    known : sequence of int, optional
        The known classes' rows, when they are not ``0 … row − 1`` (a stream's keyed
        rows: docs/streaming.md, "Placeholders").

    Returns
    -------
    bool
        Whether the row was imprinted.
    """
    import torch

    norm = float(embedding.norm())
    rows = list(range(row)) if known is None else list(known)
    if not rows or norm == 0 or not math.isfinite(norm):
        return False
    with torch.no_grad():
        weights = head.weight[rows]
        head.weight[row] = embedding.to(weights) * (float(weights.norm(dim=1).mean()) / norm)
        if head.bias is not None:
            head.bias[row] = head.bias[rows].mean()
    return True
