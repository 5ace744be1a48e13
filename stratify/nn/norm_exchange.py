"""Sum-based BatchNorm between parties that keep their samples: what they exchange.

In-process, a global batch runs as one tensor and :class:`~stratify.nn.norm.SumBatchNorm`
adds the clients' partial sums inside the forward and backward passes. When every
participant holds its own share (a Flower node), the same batch terms become exchanges
of per-channel vectors; no sample or activation leaves a party
(docs/architecture.md, "Sum-based BatchNorm between parties").

Call ``S_l = (Σx, Σx², n)`` the sums of the input of the ``l``-th BatchNorm layer (in
the order the forward pass calls them) over the whole global batch, and ``c_{k,l}``
party ``k``'s part of them, so ``S_l = Σ_k c_{k,l}``. Party ``k``'s summed loss
``L_k(θ, S)`` and its parts ``c_{k,l}(θ, S_1..S_{l-1})`` depend on the others only
through ``S``. Three phases per global batch:

1. *sums*, layer by layer (``L`` exchanges): each party runs its share up to layer
   ``l`` with ``S_1..S_{l-1}`` and sends ``c_{k,l}``; the server adds them into ``S_l``
   (and folds the layer's mean and variance into its running statistics).
2. *adjoints*, from the last layer back (``L`` exchanges): ``G_l = dL/dS_l`` of the
   federation's loss ``L = Σ_k L_k`` is ``Σ_k ∂/∂S_l [L_k + Σ_{l'>l} G_{l'}·c_{k,l'}]``
   (``S_l`` moves ``L_k`` directly and every later layer's sums): each party sends its
   term, the server adds them.
3. *gradient* (one exchange): each party sends ``∇_θ [L_k + Σ_l G_l·c_{k,l}]`` with
   ``S`` held fixed; their sum is the total derivative ``dL/dθ``, the gradient of
   BatchNorm on the union batch.

Each exchange recomputes the party's forward pass (a Flower node keeps no state between
messages), so a batch costs ``2L + 1`` exchanges and ``O(L²)`` layer evaluations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from stratify.errors import ConfigError
from stratify.nn.norm import SumBatchNorm, is_batch_norm, update_running_stats

#: the dtype sums, statistics and adjoints travel in (as SumBatchNorm combines them)
SUMS_DTYPE = torch.float64


@dataclass(frozen=True)
class LayerSums:
    """One BatchNorm layer's input sums over some samples: per channel ``Σx`` and
    ``Σx²``, and how many values each channel summed.

    Parameters
    ----------
    total, squares : torch.Tensor
        ``(C,)`` float64.
    count : int
        Values per channel (samples × spatial positions).
    """

    total: torch.Tensor
    squares: torch.Tensor
    count: int

    def statistics(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean and the biased variance per channel."""
        mean = self.total / self.count
        return mean, self.squares / self.count - mean.square()


@dataclass(frozen=True)
class LayerAdjoint:
    """``dL/dS_l`` of the federation's loss: per channel, with respect to ``Σx`` and
    ``Σx²`` (``n`` is not a variable).

    Parameters
    ----------
    total, squares : torch.Tensor
        ``(C,)`` float64.
    """

    total: torch.Tensor
    squares: torch.Tensor


def add_sums(parts: Sequence[LayerSums]) -> LayerSums:
    """The sums of the union of the parties' samples."""
    return LayerSums(
        torch.stack([part.total for part in parts]).sum(0),
        torch.stack([part.squares for part in parts]).sum(0),
        sum(part.count for part in parts),
    )


def add_adjoints(parts: Sequence[LayerAdjoint]) -> LayerAdjoint:
    """The adjoint of a layer's sums: the parties' terms added."""
    return LayerAdjoint(
        torch.stack([part.total for part in parts]).sum(0),
        torch.stack([part.squares for part in parts]).sum(0),
    )


def exchanged_layers(model: nn.Module) -> list[SumBatchNorm]:
    """The layers whose sums the parties exchange: every :class:`SumBatchNorm` of
    ``model`` that combines by sum.

    Raises
    ------
    ConfigError
        A batch-statistics layer that is not one (torch's BatchNorm, FedTAN's
        client-mean combination), whose statistics cannot be made of sums.
    """
    layers = []
    for name, module in model.named_modules():
        if isinstance(module, SumBatchNorm) and module.combine == "sum":
            layers.append(module)
        elif is_batch_norm(module):
            raise ConfigError(
                f"layer {name} ({type(module).__name__}) normalises with batch statistics "
                "that are not sums of the parties' parts: use --norm sumbn (or gn, none)"
            )
    return layers


class _Measured(Exception):
    """Raised inside a forward pass once the layer it measures has its sums."""


class _PartyPass:
    """What every :class:`SumBatchNorm` of a model does during one of a party's passes:
    records the party's part of its input sums and normalises with the federation's
    statistics (or, at the layer measured, stops the pass)."""

    def __init__(
        self, layers: Sequence[SumBatchNorm], given: Mapping[int, LayerSums], measure: int | None
    ) -> None:
        self.index = {id(layer): position for position, layer in enumerate(layers)}
        self.given = given
        self.measure = measure
        #: per layer position: the party's (Σx, Σx²) as tensors of this pass's graph
        self.parts: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}

    def __call__(self, layer: SumBatchNorm, x: torch.Tensor) -> torch.Tensor:
        position = self.index[id(layer)]
        # in float64 from the input on: Σx² − n·mean² and its gradient 2x·G − 2·mean·G
        # cancel where |mean| ≫ std, which float32 would not survive (the in-process
        # layer shifts its sums instead; a party has no shift the others share)
        flat = x.reshape(x.shape[0], layer.num_features, -1).to(SUMS_DTYPE)
        count = flat.shape[0] * flat.shape[2]
        total = flat.sum((0, 2))
        squares = flat.square().sum((0, 2))
        self.parts[position] = (total, squares, count)
        if position == self.measure:
            raise _Measured
        mean, var = self.given[position].statistics()
        invstd = torch.rsqrt(var + layer.eps)
        normalized = ((flat - mean[:, None]) * invstd[:, None]).to(x.dtype)
        if layer.weight is not None:
            normalized = normalized * layer.weight[:, None]
        if layer.bias is not None:
            normalized = normalized + layer.bias[:, None]
        return normalized.reshape(x.shape)


@contextmanager
def _party_layers(layers: Sequence[SumBatchNorm], handler: _PartyPass) -> Iterator[None]:
    for layer in layers:
        layer.external = handler
    try:
        yield
    finally:
        for layer in layers:
            layer.external = None


def forward_order(model: nn.Module, example: torch.Tensor) -> list[SumBatchNorm]:
    """``model``'s exchanged layers in the order its forward pass calls them (a pass over
    ``example``, whose values do not matter, with every such layer the identity)."""
    layers = exchanged_layers(model)
    called: list[SumBatchNorm] = []

    def record(layer: SumBatchNorm, x: torch.Tensor) -> torch.Tensor:
        called.append(layer)
        return x

    for layer in layers:
        layer.external = record
    try:
        with torch.no_grad():
            model(example[:1])
    finally:
        for layer in layers:
            layer.external = None
    if len(called) != len(layers) or len({id(layer) for layer in called}) != len(layers):
        raise ConfigError("every BatchNorm layer must run exactly once in a forward pass")
    return called


class Party:
    """One party's side: its share of a global batch and the model it received.

    Parameters
    ----------
    model : torch.nn.Module
        The global model (its parameters are differentiated; its running statistics are
        not touched: the server keeps them).
    x, y : torch.Tensor
        The party's share of the batch: inputs and placeholders.
    """

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model = model
        self.x = x
        self.y = y
        self.layers = forward_order(model, x)

    def sums(self, given: Sequence[LayerSums], layer: int) -> LayerSums:
        """Phase 1: the party's part of layer ``layer``'s sums, ``given`` the sums of
        every layer before it."""
        handler = _PartyPass(self.layers, dict(enumerate(given)), measure=layer)
        with torch.no_grad(), _party_layers(self.layers, handler):
            try:
                self.model(self.x)
            except _Measured:
                total, squares, count = handler.parts[layer]
                return LayerSums(total, squares, count)
        raise AssertionError(f"the forward pass never reached layer {layer}")

    def _surrogate(
        self,
        sums: Sequence[LayerSums],
        adjoints: Mapping[int, LayerAdjoint],
        variables: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """``L_k + Σ_l G_l·c_{k,l}`` over the layers ``adjoints`` holds, with layer
        ``variables``'s sums as leaves to differentiate; also ``L_k``."""
        given = dict(enumerate(sums))
        leaves = None
        if variables is not None:
            held = sums[variables]
            leaves = (
                held.total.detach().clone().requires_grad_(True),
                held.squares.detach().clone().requires_grad_(True),
            )
            given[variables] = LayerSums(leaves[0], leaves[1], held.count)
        handler = _PartyPass(self.layers, given, measure=None)
        with _party_layers(self.layers, handler):
            logits = self.model(self.x)
        loss = F.cross_entropy(logits, self.y, reduction="sum")
        surrogate = loss.to(SUMS_DTYPE)
        for position, adjoint in adjoints.items():
            total, squares, _ = handler.parts[position]
            surrogate = surrogate + adjoint.total @ total + adjoint.squares @ squares
        return surrogate, loss, leaves

    def adjoint(
        self, sums: Sequence[LayerSums], adjoints: Mapping[int, LayerAdjoint], layer: int
    ) -> LayerAdjoint:
        """Phase 2: the party's term of ``G_layer``, given every layer's sums and the
        adjoints of the layers after ``layer``."""
        later = {position: a for position, a in adjoints.items() if position > layer}
        surrogate, _, leaves = self._surrogate(sums, later, variables=layer)
        assert leaves is not None
        d_total, d_squares = torch.autograd.grad(surrogate, leaves, allow_unused=True)
        zeros = torch.zeros_like(leaves[0])
        return LayerAdjoint(
            (d_total if d_total is not None else zeros).detach(),
            (d_squares if d_squares is not None else zeros).detach(),
        )

    def gradient(
        self, sums: Sequence[LayerSums], adjoints: Mapping[int, LayerAdjoint]
    ) -> tuple[dict[str, torch.Tensor], float]:
        """Phase 3: the party's term of the gradient (per parameter name) and its summed
        loss."""
        surrogate, loss, _ = self._surrogate(sums, adjoints)
        parameters = dict(self.model.named_parameters())
        grads = torch.autograd.grad(surrogate, list(parameters.values()), allow_unused=True)
        return {
            name: (grad if grad is not None else torch.zeros_like(parameter)).detach()
            for (name, parameter), grad in zip(parameters.items(), grads)
        }, float(loss.detach())


#: the server's request to every participant of a batch: ("sums", sums, None, layer),
#: ("adjoint", sums, adjoints, layer) or ("gradient", sums, adjoints, None); one answer
#: per participant, in the same order
Ask = Callable[[str, Sequence[LayerSums], Mapping[int, LayerAdjoint] | None, int | None], list]


def exchanged_batch_gradient(
    model: nn.Module, example: torch.Tensor, ask: Ask, divisor: int
) -> float:
    """The server's side of one global batch: runs the three phases through ``ask``,
    folds every layer's statistics into ``model``'s running statistics (as the
    in-process forward pass does), and adds the summed gradient divided by ``divisor``
    to the parameters' ``.grad``. Returns the batch's summed loss.

    Parameters
    ----------
    model : torch.nn.Module
        The global model.
    example : torch.Tensor
        Any input of the model's shape (its values are not read): it gives the order of
        the layers.
    ask : callable
        ``ask(phase, sums, adjoints, layer)``: every participant's answer (a
        :class:`LayerSums`, a :class:`LayerAdjoint`, or ``(gradient, loss)``).
    divisor : int
        What the summed gradient is divided by (the batch's size).
    """
    layers = forward_order(model, example)
    sums: list[LayerSums] = []
    for position in range(len(layers)):
        sums.append(add_sums(ask("sums", sums, None, position)))
    for layer, layer_sums in zip(layers, sums):
        if layer.training and layer.track_running_stats:
            mean, var = layer_sums.statistics()
            update_running_stats(layer, mean, var, layer_sums.count)
    adjoints: dict[int, LayerAdjoint] = {}
    for position in reversed(range(len(layers))):
        adjoints[position] = add_adjoints(ask("adjoint", sums, adjoints, position))
    answers = ask("gradient", sums, adjoints, None)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            total = torch.stack([grads[name] for grads, _ in answers]).sum(0) / divisor
            if parameter.grad is None:
                parameter.grad = total.to(parameter.dtype)
            else:
                parameter.grad += total.to(parameter.dtype)
    return float(sum(loss for _, loss in answers))
