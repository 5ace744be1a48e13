"""SCAFFOLD (Karimireddy et al. 2020): control variates correct the clients' drift.

Option II of the paper: after ``K`` local steps of size ``η_l`` a client sets
``c_i⁺ = c_i − c + (x − y_i) / (K η_l)``; the server moves ``x ← x + η_g · mean Δy`` and
``c ← c + (|S|/N) · mean Δc``. Every local step follows the corrected gradient
``g − c_i + c``. The variates start at zero. ``--weighting samples`` selects NIID-Bench's
server step instead: ``x ← x + η_g · Σ n_k Δy_k / Σ n_k`` (with ``η_g = 1``, the
sample-weighted average of the clients' models; ``c`` moves as in the paper).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from stratify.baselines.common import ClientSamplingOptions, mean_state, weighted_average
from stratify.baselines.fedavg import FedAvg, FedAvgOptions
from stratify.card import Bench, Comparison, Identity, MethodCard, Rates
from stratify.client import GradientOffset, LocalResult
from stratify.compiled import StepTerms
from stratify.method import ClientUpdate, Context
from stratify.options import Probe, inherit, option, option_of
from stratify.state import State, clone_state
from stratify.validation import check_positive


@dataclass
class ScaffoldOptions(FedAvgOptions):
    """FedAvg's options and the server learning rate ``η_g``; ``weighting`` selects the
    server step (docs/architecture.md, "SCAFFOLD's server step")."""

    # Option II estimates c_i from (x − y_i) / (K η_l), which assumes plain SGD steps; with
    # momentum β the displacement is up to 1/(1 − β) times larger and the correction
    # overshoots (measured: NIID-Bench's momentum 0.9 diverges by round 3-4 on mnist-10k
    # classes:1 and dirichlet:0.5). The SCAFFOLD paper's clients use plain SGD.
    local_momentum: float | None = inherit(0.0)
    weighting: str = option_of(
        ClientSamplingOptions,
        "weighting",
        default="equal",
        help="Server step: equal is the paper's x + η_g·mean Δy over the participants; "
        "samples is NIID-Bench's x + η_g·Σ n_k Δy_k / Σ n_k (its sample-weighted model "
        "average at η_g = 1). BatchNorm buffers are averaged with the same weights.",
    )
    server_lr: float = option(
        1.0,
        "Global step size η_g > 0 (1 in the paper).",
        check=check_positive,
        probe=Probe(0.5),
    )


def control_variate_update(
    client_variate: State, server_variate: State, start: State, end: State, steps: int, lr: float
) -> State:
    """Option II: ``c_i⁺ = c_i − c + (x − y_i) / (K · η_l)``.

    Parameters
    ----------
    client_variate, server_variate : dict
        ``c_i`` and ``c`` used during the round.
    start, end : dict
        Global parameters ``x`` the client received and its parameters ``y_i`` after
        ``steps`` local steps.
    steps : int
        Local steps ``K`` taken.
    lr : float
        Local learning rate ``η_l``.
    """
    scale = 1.0 / (steps * lr)
    return {
        key: client_variate[key] - server_variate[key] + (start[key] - end[key]) * scale
        for key in client_variate
    }


def scaffold_server_update(
    x: State,
    server_variate: State,
    delta_y: list[State],
    delta_c: list[State],
    server_lr: float,
    num_clients: int,
    weights: Sequence[float] | None = None,
) -> tuple[State, State]:
    """``x ← x + η_g · Σ_S w_i Δy_i / Σ_S w_i`` and ``c ← c + (|S|/N) · mean_S Δc_i``.

    Parameters
    ----------
    x, server_variate : dict
        Global parameters and server control variate before the round.
    delta_y, delta_c : list of dict
        The participants' ``y_i − x`` and ``c_i⁺ − c_i``.
    server_lr : float
        Global step size ``η_g``.
    num_clients : int
        All clients ``N``.
    weights : sequence of float, optional
        The participants' weights ``w_i`` of ``Δy``: ``None`` (or equal ones) is the
        paper's mean; sample counts give NIID-Bench's step. ``Δc`` is always the plain
        mean, in both.

    Returns
    -------
    tuple of dict
        New global parameters and new server control variate.
    """
    mean_dy = mean_state(delta_y) if weights is None else weighted_average(delta_y, weights)
    mean_dc = mean_state(delta_c)
    share = len(delta_c) / num_clients
    new_x = {key: x[key] + server_lr * mean_dy[key] for key in x}
    new_c = {key: server_variate[key] + share * mean_dc[key] for key in server_variate}
    return new_x, new_c


class Scaffold(FedAvg):
    """SCAFFOLD with option-II control variates and a server learning rate.

    Options: :class:`ScaffoldOptions`.

    Notes
    -----
    Control variates cover the trainable parameters; BN buffers follow ``bn_buffers``
    (averaged with the ``weighting`` weights, as in FedAvg). The server averages ``Δc``
    uniformly over the participants and ``Δy`` by ``weighting``: ``equal`` (the default,
    the paper's step) or ``samples`` (NIID-Bench's). ``K`` is the number of local steps a client
    actually took (``E · ceil(n_k / B)``), not the number of local epochs. Traffic:
    besides the model download and upload, every participant downloads ``c`` and uploads
    ``Δc_i``, two parameter-sized payloads counted in ``bytes_sent``. The checkpoint
    carries ``c`` and every ``c_i``.
    """

    card = MethodCard(
        Identity(
            "scaffold",
            "SCAFFOLD",
            "control variates c, c_i (zero start, option II) correct local drift; server lr",
        ),
        # --weighting acts on Δy (equal: the paper's step; samples: NIID-Bench's), so the
        # comparator copies the option as given (no effective_weighting)
        Comparison("fedavg"),
        # chosen by the `defaults` grids (docs/results/defaults-*.csv)
        rates=Rates(
            tuned={
                ("digits", "batch"): 0.1,
                ("digits", "single-sample"): 0.03,
                ("mnist", "batch"): 0.01,
                ("mnist", "single-sample"): 0.01,
            }
        ),
        bench=Bench(benchmark_local=True, step_size_options=("local_momentum", "server_lr")),
        flower=True,
    )
    options_class = ScaffoldOptions
    options: ScaffoldOptions

    def setup(self, context: Context) -> None:
        super().setup(context)
        state = context.model.state_dict()
        self.server_variate = {key: torch.zeros_like(state[key]) for key in self.parameter_keys}
        self.client_variates: dict[int, State] = {}

    def client_variate(self, client: int) -> State:
        if client not in self.client_variates:
            self.client_variates[client] = {
                key: torch.zeros_like(value) for key, value in self.server_variate.items()
            }
        return self.client_variates[client]

    def hook_terms(self) -> StepTerms:
        return StepTerms(offset=True)

    def gradient_hook(self, context: Context, client: int) -> GradientOffset:
        c_i = self.client_variate(client)
        return GradientOffset([self.server_variate[key] - c_i[key] for key in self.parameter_keys])

    def client_update(
        self, context: Context, client: int, model: nn.Module, result: LocalResult
    ) -> ClientUpdate:
        update = super().client_update(context, client, model, result)
        assert update.state is not None
        global_state = context.model.state_dict()
        start = {key: global_state[key] for key in self.parameter_keys}
        end = {key: update.state[key] for key in self.parameter_keys}
        old = self.client_variate(client)
        new = control_variate_update(old, self.server_variate, start, end, result.steps, context.lr)
        update.extra["delta_y"] = {key: end[key] - start[key] for key in self.parameter_keys}
        update.extra["delta_c"] = {key: new[key] - old[key] for key in self.parameter_keys}
        self.client_variates[client] = new
        # c down and Δc_i up: parameter-sized payloads beside the model's transfers
        update.stats.uploads = 2
        return update

    def aggregate_parameters(self, context: Context, updates: list[ClientUpdate]) -> State:
        global_state = context.model.state_dict()
        x = {key: global_state[key] for key in self.parameter_keys}
        new_x, self.server_variate = scaffold_server_update(
            x,
            self.server_variate,
            [update.extra["delta_y"] for update in updates],
            [update.extra["delta_c"] for update in updates],
            self.options.server_lr,
            context.federation.num_clients,
            self.weights(updates),
        )
        return new_x

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "server_variate": clone_state(self.server_variate),
            "client_variates": {k: clone_state(v) for k, v in self.client_variates.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "server_variate" in state:
            self.server_variate = clone_state(state["server_variate"], device=self.device)
            self.client_variates = {
                int(k): clone_state(v, device=self.device)
                for k, v in state["client_variates"].items()
            }
