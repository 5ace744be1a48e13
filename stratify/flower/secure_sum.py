"""A global batch's gradient summed with Flower's own SecAgg+ (docs/flower.md, "Secure
aggregation"): the server app holds the sum over the batch's shares, never one share.

The server side runs :class:`flwr.server.workflow.SecAggPlusWorkflow` once per global batch,
its four stages (setup, share keys, collect masked vectors, unmask) as Flower wrote them;
the node side is :func:`flwr.client.mod.secaggplus_mod` around :func:`share_contribution`
(:mod:`stratify.flower.node`). Nothing here masks: this module only says what each node
contributes and reads the unmasked sum back.

What a node contributes is its share's part of the batch's mean: its summed gradient and
loss divided by the batch size the server sent, each with weight 1, so the workflow's
weighted mean times the number of participants is the batch's mean gradient. SecAgg+
quantizes each contribution into ``[-clipping_range, clipping_range]`` with
``quantization_range`` steps (stochastic rounding), so each entry of the sum carries an
error of at most ``participants * 2 * clipping_range / quantization_range``; a value outside
the range would be clipped silently, so every node also contributes whether it had one, and
the run stops with one line when the sum says some node did (:class:`SecAggClipped`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp import Grid

from stratify.config import TrainConfig
from stratify.errors import ConfigError, TrainingError
from stratify.nn.catalog import BATCH_STATISTICS_NORMS, default_norm

log = logging.getLogger("stratify.flower")

#: SecAgg+'s masks are drawn modulo 2**32 (Flower's default and its largest)
MODULUS_RANGE = 2**32
#: the key of the run's settings in a contribution request's FitIns config
RUN_KEY = "stratify-run"


class SecAggClipped(TrainingError):
    """Some node's contribution to a global batch left SecAgg+'s clipping range: the sum
    would be silently wrong, so the run stops."""


@dataclasses.dataclass(frozen=True)
class SecAggSettings:
    """SecAgg+ parameters of a Flower run (run configuration ``secagg-*``).

    Parameters
    ----------
    num_shares : float
        Shares each node's secrets are split into: a fraction (0, 1] of the batch's
        participants (Flower's float form), 1.0 = every participant.
    reconstruction_threshold : float
        Fraction (0, 1] of the shares needed to rebuild a secret (at least 2).
    clipping_range : float
        Every contributed value must lie in ``[-clipping_range, clipping_range]``.
    quantization_range : int
        Integer steps across the clipping range; ``participants * quantization_range``
        must stay under ``2**32`` (the masks' modulus).
    """

    num_shares: float = 1.0
    reconstruction_threshold: float = 0.67
    clipping_range: float = 8.0
    quantization_range: int = 2**22

    def check(self, clients: int) -> None:
        """Refuse, in one line, parameters Flower's workflow would reject or that overflow
        the masks' modulus with ``clients`` participants."""
        if not 0 < self.num_shares <= 1:
            raise ConfigError(f"secagg-num-shares must be in (0, 1], got {self.num_shares!r}")
        if not 0 < self.reconstruction_threshold <= 1:
            raise ConfigError(
                "secagg-reconstruction-threshold must be in (0, 1], got "
                f"{self.reconstruction_threshold!r}"
            )
        if not math.isfinite(self.clipping_range) or self.clipping_range <= 0:
            raise ConfigError(
                f"secagg-clipping-range must be a positive number, got {self.clipping_range!r}"
            )
        if self.quantization_range < 2:
            raise ConfigError(
                f"secagg-quantization-range must be 2 or more, got {self.quantization_range!r}"
            )
        if clients * self.quantization_range >= MODULUS_RANGE:
            raise ConfigError(
                f"secagg-quantization-range {self.quantization_range} with {clients} clients "
                f"overflows SecAgg+'s modulus 2**32: keep clients x range under {MODULUS_RANGE}"
            )

    def error_bound(self, participants: int) -> float:
        """The largest error quantization adds to one entry of a batch's mean gradient."""
        return participants * 2 * self.clipping_range / self.quantization_range


def check_secagg_config(config: TrainConfig, settings: SecAggSettings) -> None:
    """Refuse, in one line, a run SecAgg+ of batch shares does not cover.

    It covers Stratify's batch mode with a model without batch statistics: a local
    training's model (FedAvg and the others) and a single-sample hop go to one client, so
    there is no sum to hide them in; the sum-based BatchNorm exchanges per-share sums
    before the gradient, which SecAgg+ would have to mask exchange by exchange.
    """
    if config.algorithm != "stratify" or config.mode != "batch":
        raise ConfigError(
            "secagg sums the shares of Stratify's global batches: it needs --algorithm "
            f"stratify --mode batch, not {config.algorithm} in {config.mode} mode (a local "
            "training or a single-sample hop goes to one client, with no sum to hide in)"
        )
    norm = config.norm or (default_norm(config.model) if config.model else "none")
    if norm in BATCH_STATISTICS_NORMS:
        raise ConfigError(
            f"secagg does not cover --norm {norm}: its exchanges of per-share batch "
            "statistics are not masked; use a model without them (cnn, mlp) or --norm gn"
        )
    settings.check(config.clients)


def contribution(
    gradients: Sequence[np.ndarray], loss_sum: float, scale: int, clipping_range: float
) -> list[np.ndarray]:
    """What one node adds to a global batch's secure sum: each summed gradient and the
    summed loss divided by the batch size ``scale``, then whether any of these values lies
    outside ``[-clipping_range, clipping_range]`` (1.0) or not (0.0).

    Parameters
    ----------
    gradients : sequence of numpy.ndarray
        The share's summed gradients, parameter by parameter.
    loss_sum : float
        The share's summed loss.
    scale : int
        The global batch's size.
    clipping_range : float
        SecAgg+'s clipping range.
    """
    parts = [np.asarray(g, dtype=np.float64) / scale for g in gradients]
    parts.append(np.array([loss_sum / scale]))
    outside = any(bool((np.abs(part) > clipping_range).any()) for part in parts)
    return [*parts, np.array([1.0 if outside else 0.0])]


def read_sum(mean: Sequence[np.ndarray], participants: int) -> tuple[list[np.ndarray], float, bool]:
    """The workflow's weighted mean of the contributions (weight 1 each) back as their sum:
    the batch's mean gradients, its mean loss, and whether any node was clipped (the sum
    of the 0/1 indicators, read as at least one above 0.5).

    Parameters
    ----------
    mean : sequence of numpy.ndarray
        The workflow's aggregate, in :func:`contribution`'s order.
    participants : int
        The nodes whose contributions it holds.
    """
    total = [np.asarray(part) * participants for part in mean]
    clipped = float(total[-1].item()) > 0.5
    return total[:-2], float(total[-2].item()), clipped


class _BatchStrategy(Strategy):
    """The legacy strategy the workflow asks: it hands out this batch's requests and keeps
    the aggregate (no other round, no evaluation)."""

    def __init__(self, requests: list[tuple[ClientProxy, FitIns]]) -> None:
        self.requests = requests
        self.results: list[tuple[ClientProxy, FitRes]] = []
        self.aggregate: Parameters | None = None

    def initialize_parameters(self, client_manager):  # type: ignore[no-untyped-def]
        return None

    def configure_fit(self, server_round, parameters, client_manager):  # type: ignore[no-untyped-def]
        return self.requests

    def aggregate_fit(self, server_round, results, failures):  # type: ignore[no-untyped-def]
        self.results = list(results)
        if self.results:
            self.aggregate = self.results[0][1].parameters
        return self.aggregate, {}

    def configure_evaluate(self, server_round, parameters, client_manager):  # type: ignore[no-untyped-def]
        return []

    def aggregate_evaluate(self, server_round, results, failures):  # type: ignore[no-untyped-def]
        return None, {}

    def evaluate(self, server_round, parameters):  # type: ignore[no-untyped-def]
        return None


class SecureBatchSum:
    """The server's end: one SecAgg+ workflow per global batch.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        The run's grid (wrap it to record what the server receives).
    settings : SecAggSettings
        The SecAgg+ parameters.
    run_config : str
        The run's settings (JSON), sent with each request so a node knows its data.
    timeout : float or None
        Seconds each stage waits for its replies.
    """

    def __init__(
        self,
        grid: Grid,
        settings: SecAggSettings,
        run_config: str,
        timeout: float | None = None,
    ) -> None:
        self.grid = grid
        self.settings = settings
        self.run_config = run_config
        self.timeout = timeout
        self.batches = 0

    def workflow(self) -> SecAggPlusWorkflow:
        return SecAggPlusWorkflow(
            self.settings.num_shares,
            self.settings.reconstruction_threshold,
            max_weight=1.0,  # every contribution has weight 1 (module docstring)
            clipping_range=self.settings.clipping_range,
            quantization_range=self.settings.quantization_range,
            modulus_range=MODULUS_RANGE,
            timeout=self.timeout,
        )

    def sum(
        self,
        shares: Sequence[tuple[int, np.ndarray]],
        model: Sequence[np.ndarray],
        scale: int,
        noise: Mapping[str, Any] | None = None,
    ) -> tuple[list[np.ndarray], float]:
        """The batch's mean gradient (parameter by parameter) and its summed loss.

        Parameters
        ----------
        shares : sequence of (node id, positions)
            Every participant's node and its sample positions (two or more participants).
        model : sequence of numpy.ndarray
            The global model's state, in its ``state_dict`` order.
        scale : int
            The batch's size (the divisor of the mean).
        noise : mapping, optional
            With DP, the nodes' noise settings sent with each request: ``noise`` (σ),
            ``epoch`` and ``draws`` (node id -> its first noise draw), docs/flower.md,
            "Differential privacy".
        """
        if len(shares) < 2:
            raise AssertionError("a secure sum needs two participants or more")
        self.batches += 1
        parameters = ndarrays_to_parameters(list(model))
        requests: list[tuple[ClientProxy, FitIns]] = []
        for node, positions in shares:
            config: dict[str, bool | bytes | float | int | str] = {
                RUN_KEY: self.run_config,
                "positions": np.asarray(positions, dtype=np.int64).tobytes(),
                "scale": int(scale),
                "clipping": float(self.settings.clipping_range),
            }
            if noise is not None:
                config["dp-noise"] = float(noise["noise"])
                config["dp-epoch"] = int(noise["epoch"])
                config["dp-draw"] = int(noise["draws"][node])
            requests.append((GridClientProxy(node, self.grid, 0), FitIns(parameters, config)))
        strategy = _BatchStrategy(requests)
        state = RecordDict()
        state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord(
            {WorkflowKey.CURRENT_ROUND: self.batches}
        )
        state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
            parameters, keep_input=True
        )
        context = LegacyContext(Context(0, 0, {}, state, {}), strategy=strategy)
        self.workflow()(self.grid, context)
        answered = {proxy.node_id for proxy, _ in strategy.results}
        if strategy.aggregate is None or len(answered) != len(shares):
            missing = sorted(node for node, _ in shares if node not in answered)
            raise TrainingError(
                f"SecAgg+ of global batch {self.batches} did not complete (nodes {missing} "
                "did not answer every stage)"
            )
        gradients, loss_mean, clipped = read_sum(
            parameters_to_ndarrays(strategy.aggregate), len(shares)
        )
        if clipped:
            raise SecAggClipped(
                f"a share's gradient of global batch {self.batches} left SecAgg+'s clipping "
                f"range ±{self.settings.clipping_range:g}: raise secagg-clipping-range"
            )
        return gradients, loss_mean * scale


def contribution_reply(message: Message, values: list[np.ndarray]) -> Message:
    """A node's reply to the collect stage before ``secaggplus_mod`` masks it: a ``FitRes``
    of ``values`` with weight 1 (the mod reads it and replaces it by the masked vector)."""
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(values), 1, {})
    return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=message)


@dataclasses.dataclass
class ShareRequest:
    """A contribution request as a node reads it (:meth:`SecureBatchSum.sum` wrote it).

    Parameters
    ----------
    run : str
        The run's settings (JSON).
    positions : numpy.ndarray
        The node's sample positions in the share.
    scale : int
        The global batch's size.
    clipping_range : float
        SecAgg+'s clipping range.
    model : list of numpy.ndarray
        The global model's state, in ``state_dict`` order.
    noise : float, optional
        With DP, the noise multiplier σ the node adds to its share's clipped sum.
    epoch : int
        With DP, the epoch (with the draw, it keys the node's noise).
    draw : int
        With DP, the node's noise draws in this epoch before this one.
    """

    run: str
    positions: np.ndarray
    scale: int
    clipping_range: float
    model: list[np.ndarray]
    noise: float | None = None
    epoch: int = 0
    draw: int = 0


def read_request(content: RecordDict) -> ShareRequest:
    """The :class:`ShareRequest` in a collect stage's message."""
    fitins = compat.recorddict_to_fitins(content, keep_input=True)
    config = fitins.config
    return ShareRequest(
        str(config[RUN_KEY]),
        np.frombuffer(config["positions"], dtype=np.int64).copy(),  # type: ignore[arg-type]
        int(config["scale"]),  # type: ignore[arg-type]
        float(config["clipping"]),  # type: ignore[arg-type]
        parameters_to_ndarrays(fitins.parameters),
        None if "dp-noise" not in config else float(config["dp-noise"]),  # type: ignore[arg-type]
        int(config.get("dp-epoch", 0)),  # type: ignore[arg-type]
        int(config.get("dp-draw", 0)),  # type: ignore[arg-type]
    )
