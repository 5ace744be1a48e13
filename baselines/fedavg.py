"""FedAvg (McMahan et al. 2017): broadcast, local SGD, sample-weighted average.

The base class of the averaging baselines. Its hooks, each overridden by one variant:

* :meth:`FedAvg.gradient_hook` — a change of the local gradient before each step
  (FedProx's proximal gradient, SCAFFOLD's drift correction);
* :meth:`FedAvg.local_objective` — the clients' mini-batch loss (LfD's drift regulariser);
* :meth:`FedAvg.client_update` — what a client sends back (SCAFFOLD adds Δc_i);
* :meth:`FedAvg.server_update` — how the averaged parameters become the new global
  parameters (FedAvgM's server momentum);
* :meth:`FedAvg.aggregate_parameters` — the whole parameter aggregation (SCAFFOLD);
* :meth:`FedAvg.local_round` — the clients' local work of a round (FedTAN's lockstep).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from torch import nn

from stratify.baselines.common import (
    BN_BUFFER_MODES,
    ClientSamplingOptions,
    client_weights,
    participant_count,
    participants,
    weighted_average,
)
from stratify.card import Bench, Comparison, Identity, MethodCard, Rates
from stratify.client import (
    GradientHook,
    GradientTerm,
    LocalJob,
    LocalResult,
    LossFunction,
    cross_entropy_loss,
)
from stratify.compiled import CompileSwitch, StepTerms
from stratify.errors import ConfigError
from stratify.method import (
    Budgeted,
    ClientUpdate,
    Context,
    LocalWork,
    Round,
    RoundStats,
    Strategy,
    Vectorizable,
)
from stratify.options import Probe, inherit, option
from stratify.state import State, buffer_names, clone_state, load_into, parameter_names
from stratify.validation import check_positive_int

#: NIID-Bench's local training in batch mode: 10 local epochs, SGD momentum 0.9.
BATCH_LOCAL_EPOCHS = 10
BATCH_LOCAL_MOMENTUM = 0.9

FedAvgOptionsT = TypeVar("FedAvgOptionsT", bound="FedAvgOptions")


@dataclass
class FedAvgOptions(ClientSamplingOptions):
    """Options of :class:`FedAvg` and the methods built on it.

    Defaults in batch mode are NIID-Bench's (Li et al. 2022), which the Stratify paper
    follows for its baselines: E = 10 local epochs, local batch 64, SGD momentum 0.9
    (with lr 0.01 and a constant schedule, the run's defaults for these methods). In
    single-sample mode a client steps on one sample at a time: batch 1, E = 1, no momentum.
    """

    local_epochs: int | None = inherit(per_mode={"batch": BATCH_LOCAL_EPOCHS, "single-sample": 1})
    local_momentum: float | None = inherit(
        per_mode={"batch": BATCH_LOCAL_MOMENTUM, "single-sample": 0.0}
    )

    local_steps: int | None = option(
        None,
        "Local iterations K per round: K mini-batches drawn with replacement from the "
        "client's samples, instead of --local-epochs passes over them.",
        check=check_positive_int,
        cli_type=int,
        probe=Probe(2),
    )
    bn_buffers: str = option(
        "average",
        "BatchNorm running statistics: averaged like the parameters, or kept by each client.",
        choices=tuple(BN_BUFFER_MODES),
        probe=Probe("local"),
    )

    def for_mode(self: FedAvgOptionsT, mode: str) -> FedAvgOptionsT:
        """``--local-steps`` replaces the local epochs: giving both is refused."""
        if self.local_steps is not None and self.local_epochs is not None:
            raise ConfigError(
                "--local-epochs and --local-steps both set how long a client trains; give one"
            )
        options = super().for_mode(mode)
        if options.local_steps is not None:
            return dataclasses.replace(options, local_epochs=None)
        return options


class FedAvg(Strategy, Vectorizable, Budgeted):
    """Federated averaging: every round the sampled clients train a copy of the global model
    locally and the server replaces it by the sample-weighted average.

    Options (:class:`FedAvgOptions`, defaults NIID-Bench's in batch mode): ``local_epochs``
    E (or ``local_steps`` K mini-batches drawn with replacement), ``local_batch_size``,
    ``local_momentum`` and ``local_weight_decay`` of the clients' SGD; ``client_fraction``
    C (``max(1, round(C·K))`` clients drawn without replacement each round);
    ``weighting`` (``samples``: weights ``n_k``; ``equal``: every
    participant alike) and ``bn_buffers``. ``average``: BatchNorm running statistics (all
    non-parameter state) are averaged with the aggregation weights like the parameters
    (``num_batches_tracked`` becomes the rounded weighted mean). ``local``: each client
    keeps its own buffers between rounds (a client taking part for the first time starts
    from the global ones); the global model's buffers, used for evaluation, are the
    weighted average of the latest buffers of every client that has trained so far.

    Notes
    -----
    One epoch of the run is one round. Traffic: each participant downloads and uploads
    the model once per round (2 transfers each).
    """

    card = MethodCard(
        Identity(
            "fedavg",
            "FedAvg",
            "broadcast, E local epochs of SGD per client, weighted model average",
        ),
        Comparison(no_comparator="fedavg is the base the other methods are matched against"),
        # chosen by the `defaults` grids (docs/results/defaults-*.csv)
        rates=Rates(
            tuned={
                ("digits", "batch"): 0.1,
                ("digits", "single-sample"): 0.03,
                ("mnist", "batch"): 0.03,
                ("mnist", "single-sample"): 0.01,
            }
        ),
        bench=Bench(benchmark_local=True, step_size_options=("local_momentum",)),
        flower=True,
    )
    options_class = FedAvgOptions
    options: FedAvgOptions

    # -- set-up ---------------------------------------------------------------------------

    def setup(self, context: Context) -> None:
        super().setup(context)
        self.parameter_keys = parameter_names(context.model)
        self.buffer_keys = buffer_names(context.model)
        if self.bn_buffer_mode == "local" and not self.buffer_keys:
            # nothing to keep per client: the option would be accepted and ignored
            raise ConfigError(
                "--bn-buffers local keeps each client's BatchNorm statistics, and this model "
                "has none (e.g. --model resnet20 --norm bn --mode batch has them)"
            )
        self.device = context.device
        self.client_buffers: dict[int, State] = {}
        #: ``--compile`` of the clients' single-sample training (batch mode: never)
        self.compile_switch = CompileSwitch(
            self.options.compile if context.mode == "single-sample" else "off"
        )

    @property
    def bn_buffer_mode(self) -> str:
        return self.options.bn_buffers

    # -- rounds ---------------------------------------------------------------------------

    def configure_rounds(
        self, context: Context, epoch: int, rng: np.random.Generator
    ) -> Iterable[Round]:
        clients = participants(context.federation.num_clients, self.options.client_fraction, rng)
        return [Round(clients=clients)]

    def fit(self, context: Context, round_: Round, rng: np.random.Generator) -> list[ClientUpdate]:
        assert round_.clients is not None
        updates = self.local_round(context, [int(client) for client in round_.clients], rng)
        self.compile_switch.count(sum(update.stats.steps for update in updates))
        return updates

    def step_terms(self, mode: str) -> StepTerms | None:
        """In single-sample mode, the clients' steps as jobs: the local momentum and
        weight decay, and what :meth:`gradient_hook` adds (none for FedAvg). A variant
        with its own :meth:`local_round`, :meth:`train_client` or
        :meth:`local_objective` has no job form."""
        cls = type(self)
        if mode != "single-sample" or any(
            getattr(cls, name) is not getattr(FedAvg, name)
            for name in ("local_round", "train_client", "local_objective")
        ):
            return None
        options = self.options.for_mode(mode)
        assert options.local_momentum is not None
        return StepTerms(
            momentum=options.local_momentum > 0,
            weight_decay=options.local_weight_decay > 0,
        ).union(self.hook_terms())

    def hook_terms(self) -> StepTerms:
        """What :meth:`gradient_hook` adds to the gradient, as step terms."""
        return StepTerms()

    def local_work(
        self, context: Context, round_: Round, rng: np.random.Generator
    ) -> LocalWork | None:
        """The participants' single-sample training as jobs, one per client in order,
        each on the copy it received (the same draws from ``rng`` as :meth:`local_round`)."""
        if self.step_terms(context.mode) is None or self.buffer_keys:
            return None
        assert round_.clients is not None
        clients = [int(client) for client in round_.clients]
        hooks = [self.gradient_hook(context, client) for client in clients]
        if any(hook is not None and not isinstance(hook, GradientTerm) for hook in hooks):
            return None  # nothing drawn from rng yet: the round runs through fit
        jobs: list[LocalJob] = []
        for client, hook in zip(clients, hooks):
            model = self.receive(context, client)
            indices, passes = self.local_samples(context, client, rng)  # as train_client
            jobs.append(
                context.trainer.job(
                    model,
                    indices,
                    epochs=passes,
                    lr=context.lr,
                    rng=rng,
                    momentum=self.local_momentum,
                    weight_decay=self.options.local_weight_decay,
                    before_step=hook,
                )
            )

        def finish() -> list[ClientUpdate]:
            updates = [
                self.client_update(context, client, job.model, job.result())
                for client, job in zip(clients, jobs)
            ]
            self.compile_switch.count(sum(update.stats.steps for update in updates))
            return updates

        return LocalWork(jobs, finish)

    def local_round(
        self, context: Context, clients: list[int], rng: np.random.Generator
    ) -> list[ClientUpdate]:
        """Every participant trains its own copy of the global model, one after another."""
        updates = []
        for client in clients:
            model = self.receive(context, client)
            result = self.train_client(context, client, model, rng)
            updates.append(self.client_update(context, client, model, result))
        return updates

    def train_client(
        self,
        context: Context,
        client: int,
        model: nn.Module,
        rng: np.random.Generator,
        *,
        indices: np.ndarray | list[np.ndarray] | None = None,
        epochs: int | None = None,
        loss_fn: LossFunction | None = None,
    ) -> LocalResult:
        """The client's local SGD on ``model`` with the method's options.

        By default on :meth:`local_samples` (all its samples for ``local_epochs`` passes,
        or ``local_steps`` mini-batches), with :meth:`gradient_hook` and
        :meth:`local_objective`; a variant may pass other ``indices`` (one array, or one
        per local epoch), ``epochs`` or ``loss_fn``.
        """
        if indices is None:
            indices, passes = self.local_samples(context, client, rng)
            epochs = passes if epochs is None else epochs
        return context.trainer.train(
            model,
            indices,
            epochs=self.local_epochs if epochs is None else epochs,
            batch_size=self.batch_size,
            lr=context.lr,
            rng=rng,
            momentum=self.local_momentum,
            weight_decay=self.options.local_weight_decay,
            before_step=self.gradient_hook(context, client),
            loss_fn=self.local_objective(context, client) if loss_fn is None else loss_fn,
            compile=self.compile_switch,
        )

    def local_samples(
        self, context: Context, client: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, int]:
        """The samples a client trains on this round and how many passes it makes: all its
        samples ``local_epochs`` times, or, with ``local_steps`` K, ``K·B`` draws with
        replacement in one pass (K mini-batches of B)."""
        indices = context.federation.client_indices[client]
        if self.local_steps is None:
            return indices, self.local_epochs
        return rng.choice(indices, size=self.local_steps * self.batch_size), 1

    def planned_sample_gradients(self, client_sizes: list[int]) -> float | None:
        """``max(1, round(C·K))`` participants times a client's local work in expectation:
        ``E · n_k`` (mean over the clients) or ``K_steps · B``."""
        count = participant_count(len(client_sizes), self.options.client_fraction)
        if self.local_steps is not None:
            return float(count * self.local_steps * self.batch_size)
        return count * self.local_epochs * statistics.fmean(client_sizes)

    @property
    def local_steps(self) -> int | None:
        """K local iterations, or ``None`` (local epochs); FedTAN's options, which share
        only the client sampling with FedAvg's, have none."""
        return getattr(self.options, "local_steps", None)

    @property
    def local_epochs(self) -> int:
        assert self.options.local_epochs is not None, "setup() resolves the local epochs"
        return self.options.local_epochs

    @property
    def local_momentum(self) -> float:
        assert self.options.local_momentum is not None, "setup() resolves the momentum"
        return self.options.local_momentum

    @property
    def batch_size(self) -> int:
        """The local mini-batch size, resolved for the mode by :meth:`setup`."""
        assert self.options.local_batch_size is not None, "setup() resolves the batch size"
        return self.options.local_batch_size

    def receive(self, context: Context, client: int) -> nn.Module:
        """The client's copy of the global model (with its own buffers in ``local`` mode)."""
        model = context.trainer.receive(context.model)
        if self.bn_buffer_mode == "local" and client in self.client_buffers:
            load_into(model, self.client_buffers[client])
        return model

    def gradient_hook(self, context: Context, client: int) -> GradientHook | None:
        """A change of the local gradient before each step (none for FedAvg)."""
        return None

    def local_objective(self, context: Context, client: int) -> LossFunction:
        """The client's mini-batch loss (FedAvg: cross-entropy)."""
        return cross_entropy_loss

    def client_update(
        self, context: Context, client: int, model: nn.Module, result: LocalResult
    ) -> ClientUpdate:
        """What the client sends back: its model state and sample count; traffic: the
        model's download and upload."""
        return ClientUpdate(
            client=client,
            num_samples=len(context.federation.client_indices[client]),
            state=model.state_dict(),
            stats=RoundStats(
                steps=result.steps,
                transfers=2,
                loss_sum=result.loss_sum,
                loss_count=result.samples,
                sample_gradients=result.samples,
            ),
        )

    # -- aggregation ----------------------------------------------------------------------

    def aggregate(
        self, context: Context, round_: Round, updates: list[ClientUpdate]
    ) -> State | None:
        if not updates:
            return None
        new_state = self.aggregate_parameters(context, updates)
        new_state.update(self.aggregate_buffers(context, updates))
        return new_state

    def aggregate_parameters(self, context: Context, updates: list[ClientUpdate]) -> State:
        """Sample-weighted average of the parameters, handed to :meth:`server_update`."""
        states = [self.select(update, self.parameter_keys) for update in updates]
        return self.server_update(context, weighted_average(states, self.weights(updates)))

    def server_update(self, context: Context, average: State) -> State:
        """FedAvg: the average becomes the global parameters."""
        return average

    def aggregate_buffers(self, context: Context, updates: list[ClientUpdate]) -> State:
        """BN buffers by ``bn_buffers`` (see the class notes)."""
        if not self.buffer_keys:
            return {}
        if self.bn_buffer_mode == "average":
            states = [self.select(update, self.buffer_keys) for update in updates]
            return weighted_average(states, self.weights(updates))
        for update in updates:
            assert update.state is not None
            self.client_buffers[update.client] = clone_state(update.state, self.buffer_keys)
        clients = sorted(self.client_buffers)
        sizes = context.federation.client_sizes
        return weighted_average(
            [self.client_buffers[client] for client in clients],
            client_weights([int(sizes[client]) for client in clients], self.options.weighting),
        )

    def weights(self, updates: list[ClientUpdate]) -> list[float]:
        """Aggregation weights of the updates, by ``weighting``."""
        return client_weights([update.num_samples for update in updates], self.options.weighting)

    @staticmethod
    def select(update: ClientUpdate, keys: list[str]) -> State:
        assert update.state is not None, "averaging needs the clients' states"
        return {key: update.state[key] for key in keys}

    # -- checkpoint -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "client_buffers": {k: clone_state(v) for k, v in self.client_buffers.items()},
            **self.compile_switch.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.compile_switch.load_state_dict(state)
        self.client_buffers = {
            int(client): clone_state(buffers, device=self.device)
            for client, buffers in state.get("client_buffers", {}).items()
        }
