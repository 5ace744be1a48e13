"""FedProx (Li et al. 2020): FedAvg with a proximal term in the local objective.

The term's gradient is added before each local step by
:class:`~stratify.client.ProximalGradient` (``add_proximal_gradient`` is re-exported here),
which the compiled single-sample step also knows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from stratify.baselines.fedavg import FedAvg, FedAvgOptions
from stratify.card import Comparison, Identity, MethodCard, Rates
from stratify.client import ProximalGradient, add_proximal_gradient
from stratify.compiled import StepTerms
from stratify.method import Context
from stratify.options import Probe, option
from stratify.validation import check_nonnegative

__all__ = ["FedProx", "FedProxOptions", "add_proximal_gradient", "proximal_term"]


@dataclass
class FedProxOptions(FedAvgOptions):
    """FedAvg's options and the proximal weight ``mu``."""

    mu: float = option(
        0.01,
        "Proximal weight μ ≥ 0 of (μ/2)‖w − w_global‖².",
        check=check_nonnegative,
        probe=Probe(1.0),
    )


def proximal_term(
    parameters: Sequence[torch.Tensor], anchor: Sequence[torch.Tensor], mu: float
) -> torch.Tensor:
    """``(μ/2) Σ ‖w − w_g‖²`` over the parameter tensors: the term FedProx adds to the loss.

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

    Options: :class:`FedProxOptions`. ``μ = 0`` gives FedAvg bit for bit (the gradient
    term is still added, and is exactly zero).

    Notes
    -----
    Only the local objective differs from FedAvg: the anchor ``w_g`` is the global model
    as the client received it, held fixed during the round. The term's gradient is added
    to the mini-batch gradient before each step (the same update as back-propagating the
    term, without building its graph); the reported training loss is the cross-entropy.
    """

    card = MethodCard(
        Identity(
            "fedprox", "FedProx", "FedAvg + proximal term (μ/2)‖w − w_global‖² in the local loss"
        ),
        Comparison("fedavg"),
        # chosen by the `defaults` grids (docs/results/defaults-*.csv)
        rates=Rates(
            tuned={
                ("digits", "batch"): 0.1,
                ("digits", "single-sample"): 0.03,
                ("mnist", "batch"): 0.03,
                ("mnist", "single-sample"): 0.01,
            }
        ),
        bench=FedAvg.card.bench,
        flower=True,
    )
    options_class = FedProxOptions
    options: FedProxOptions

    def hook_terms(self) -> StepTerms:
        return StepTerms(proximal=True)

    def gradient_hook(self, context: Context, client: int) -> ProximalGradient:
        # the global model is not touched until aggregation, so detached views suffice
        anchor = [parameter.detach() for parameter in context.model.parameters()]
        return ProximalGradient(anchor, self.options.mu)
