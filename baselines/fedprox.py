"""FedProx (Li et al. 2020): FedAvg with a proximal term in the local objective."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from baselines.fedavg import FedAvg
from stratify.errors import ConfigError
from stratify.router import Router


def proximal_term(
    parameters: Sequence[torch.Tensor], anchor: Sequence[torch.Tensor], mu: float
) -> torch.Tensor:
    """``(μ/2) Σ ‖w − w_g‖²`` over the parameter tensors; its gradient is ``μ (w − w_g)``.

    Parameters
    ----------
    parameters : sequence of torch.Tensor
        The client's parameters ``w``.
    anchor : sequence of torch.Tensor
        The global parameters ``w_g`` the round started from (no gradient).
    mu : float
        Proximal weight ``μ ≥ 0``.
    """
    total = torch.zeros((), dtype=parameters[0].dtype, device=parameters[0].device)
    for parameter, reference in zip(parameters, anchor):
        total = total + (parameter - reference).square().sum()
    return 0.5 * mu * total


class FedProx(FedAvg):
    """FedAvg whose local loss adds ``(μ/2)‖w − w_g‖²`` to every mini-batch.

    Parameters
    ----------
    local_epochs, local_batch_size, client_fraction, bn_buffers
        As :class:`~baselines.fedavg.FedAvg`.
    mu : float
        Proximal weight ``μ ≥ 0``; ``μ = 0`` gives FedAvg bit for bit (the term is still
        computed, and adds exactly zero to every gradient).

    Notes
    -----
    Only the local objective differs from FedAvg: the anchor ``w_g`` is the global model
    as the client received it, held fixed during the round.
    """

    name = "fedprox"
    description = "FedAvg + proximal term (μ/2)‖w − w_global‖² in the local loss"

    def __init__(
        self,
        local_epochs: int = 1,
        local_batch_size: int | None = None,
        client_fraction: float = 1.0,
        mu: float = 0.01,
        bn_buffers: str = "average",
    ) -> None:
        super().__init__(local_epochs, local_batch_size, client_fraction, bn_buffers)
        try:
            mu = float(mu)
        except (TypeError, ValueError):
            raise ConfigError(f"--mu must be a non-negative number, got {mu!r}") from None
        if not (math.isfinite(mu) and mu >= 0):
            raise ConfigError(f"--mu must be a non-negative number, got {mu!r}")
        self.mu = mu

    def penalty(
        self, router: Router, client: int, model: nn.Module
    ) -> Callable[[nn.Module], torch.Tensor]:
        # the global model is not touched until aggregation, so detached views suffice
        anchor = [parameter.detach() for parameter in router.model.parameters()]
        mu = self.mu

        def proximal(local: nn.Module) -> torch.Tensor:
            return proximal_term(list(local.parameters()), anchor, mu)

        return proximal
