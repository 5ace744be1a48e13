"""The options two commands share, each declared once, without torch.

``train`` (:class:`~stratify.config.TrainConfig`, and the Stratify method's
:class:`~stratify.stratify.StratifyOptions`) and ``stream``
(:class:`~stratify.stream.config.StreamConfig`) take the same model, widths, norm,
learning rate, seed, device, registry, chunk size, selection and momentum. Each is
declared here, in :class:`CommonOptions`, and each of those classes copies it with
:func:`~stratify.options.option_of`, changing only a default or a help sentence. Nothing
here imports torch, so ``stratify stream`` checks its options without loading it
(docs/architecture.md, "Options").
"""

from __future__ import annotations

from dataclasses import dataclass

from stratify.nn.catalog import MLP_HIDDEN, MODELS, NORMS
from stratify.options import DEVICES, option
from stratify.registry.base import PROTOCOLS
from stratify.selection import SELECTIONS
from stratify.validation import (
    check_bool,
    check_momentum,
    check_positive,
    check_positive_int,
    check_seed,
    check_widths,
)


@dataclass
class CommonOptions:
    """The declarations of the shared options, never made into an instance: a command's
    class takes field ``name`` as ``option_of(CommonOptions, name, ...)``. Defaults and
    help are ``train``'s, which ``stream`` changes where a stream differs."""

    model: str | None = option(
        None,
        "Model [default: cnn for images, mlp for tabular].",
        choices=tuple(MODELS),
        cli_type=str,
    )
    mlp_hidden: tuple[int, ...] | None = option(
        None,
        "Hidden-layer widths of --model mlp, comma-separated "
        f"[default: {','.join(map(str, MLP_HIDDEN))}].",
        check=check_widths,
        cli_type=str,
    )
    norm: str | None = option(
        None,
        "Norm layers of the ResNets [default: bn; cnn and mlp have no norm layers, so none "
        "is their only norm].",
        choices=tuple(NORMS),
        cli_type=str,
    )
    lr: float | None = option(None, "Learning rate.", check=check_positive, cli_type=float)
    seed: int = option(
        0,
        "Seeds data generation, partition, registry, schedule, selection and model init.",
        check=check_seed,
    )
    device: str = option("auto", "Where tensors live.", choices=DEVICES)
    secure: bool = option(
        True, "Encrypted placeholder registry, or the plain one.", check=check_bool
    )
    protocol: str = option("packed-blind", "Protocol of the secure registry.", choices=PROTOCOLS)
    chunk: int = option(
        5,
        "Chunk size CS: consecutive schedule entries that may stay with one client.",
        check=check_positive_int,
        modes=("single-sample",),
    )
    selection: str = option(
        "uniform", "How a client is chosen among those holding the label.", choices=SELECTIONS
    )
    momentum: float = option(
        0.0, "SGD momentum of the global optimizer, in [0, 1).", check=check_momentum
    )
