"""The models' and norms' names and the rules between them, without torch.

What a command checks before it builds anything — the model names, the norm names, which
model takes which norm, the MLP's default widths and size — lives here, so that a command
that never builds a torch model (``stratify stream`` with its NumPy MLP) can check its
options without importing torch; :mod:`stratify.nn.models` builds the models these
names stand for (docs/architecture.md, "Options").
"""

from __future__ import annotations

import math

from stratify.errors import ConfigError

MODELS: dict[str, str] = {
    "cnn": "simple CNN of NIID-Bench/Stratify (conv6-conv16-fc120-fc84), images or 1-D tabular",
    "mlp": "multi-layer perceptron F→200→200→classes, tabular (images are flattened)",
    "resnet9": "DAWNBench ResNet-9 (64-128-256-512, two residual blocks), images ≥ 8 px",
    "resnet18": "CIFAR-style ResNet-18 (3×3 stem, BasicBlocks [2,2,2,2]), images ≥ 8 px",
    "resnet20": "CIFAR ResNet-20 of He et al. 2016 (3×3 blocks, 16/32/64), images ≥ 8 px",
}

NORMS: dict[str, str] = {
    "bn": "torch BatchNorm",
    "gn": "GroupNorm with min(32, C) groups (reduced until they divide C)",
    "sumbn": "sum-based BatchNorm: exact BN over a batch made of several clients (Stratify)",
    "sumbn-client-mean": "BatchNorm averaging per-client statistics (FedTAN)",
    "none": "no normalisation",
}

#: Models without norm layers: their only norm is "none".
NORM_FREE_MODELS = ("cnn", "mlp")

#: Norms that normalise with the statistics of the batch, which one sample cannot give.
BATCH_STATISTICS_NORMS = ("bn", "sumbn", "sumbn-client-mean")

#: Hidden-layer widths of ``mlp`` when ``--mlp-hidden`` is not given.
MLP_HIDDEN = (200, 200)


def default_norm(model: str) -> str:
    """The norm a model is built with when none is given: ``bn`` for the ResNets, ``none``
    for the norm-free ``cnn`` and ``mlp``.

    Parameters
    ----------
    model : str
        One of :data:`MODELS`.
    """
    return "none" if model in NORM_FREE_MODELS else "bn"


def check_model_norm(name: str | None, norm: str | None, mode: str | None = None) -> None:
    """Refuse a norm that model ``name`` cannot take, before anything is built or loaded.

    Parameters
    ----------
    name : str or None
        One of :data:`MODELS`; ``None`` stands for the default model (``cnn`` for images,
        ``mlp`` otherwise, whichever the data needs; both are norm-free).
    norm : str or None
        One of :data:`NORMS`; ``None``: the model's own (:func:`default_norm`).
    mode : str, optional
        ``"single-sample"`` also refuses the norms of :data:`BATCH_STATISTICS_NORMS`.

    Raises
    ------
    stratify.errors.ConfigError
        A norm on a norm-free model, or batch statistics in single-sample mode.
    """
    resnets = ", ".join(model for model in MODELS if model not in NORM_FREE_MODELS)
    if norm not in (None, "none") and (name is None or name in NORM_FREE_MODELS):
        which = f"model {name!r}" if name else "the default model (cnn for images, mlp otherwise)"
        raise ConfigError(
            f"{which} has no normalisation layers, so norm {norm!r} cannot apply; "
            f"use a ResNet ({resnets}) or norm 'none'"
        )
    if name is None or mode != "single-sample":
        return
    resolved = default_norm(name) if norm is None else norm
    if resolved in BATCH_STATISTICS_NORMS:
        raise ConfigError(
            f"model {name!r} with norm {resolved!r} normalises with batch statistics, which one "
            "sample cannot give; in --mode single-sample use --norm gn (or none), or use "
            "--mode batch"
        )


def mlp_weight_count(
    input_shape: tuple[int, ...], num_classes: int, hidden: tuple[int, ...] | None = None
) -> int:
    """The number of weights (and biases) of ``mlp`` for these sizes, counted without
    building it.

    Parameters
    ----------
    input_shape : tuple of int
        Shape of one sample; its product is the input width.
    num_classes : int
        Number of outputs.
    hidden : tuple of int, optional
        Hidden-layer widths (default :data:`MLP_HIDDEN`).
    """
    widths = (math.prod(input_shape), *(MLP_HIDDEN if hidden is None else hidden), num_classes)
    return sum((width_in + 1) * width_out for width_in, width_out in zip(widths, widths[1:]))
