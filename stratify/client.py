"""The client side: local training of a copy of the global model on a client's samples.

Every method whose clients train their own copy one client at a time (the averaging
baselines, SFL's sequential passes) uses :class:`LocalTrainer`; what differs between them
enters through a gradient hook (FedProx's proximal gradient, SCAFFOLD's correction) or a
loss function (LfD, FedBR). The one exception is FedTAN's first local step, where the
clients step together and exchange BatchNorm statistics: it runs its own lockstep loop
(docs/architecture.md, "Client side").

Single-sample local training (batches of one, cross-entropy, a hook that is a
:class:`GradientTerm`) can also be described as data, a :class:`LocalJob`, and run as the
compiled step Stratify's hops use (:mod:`stratify.compiled`), alone or vectorised with
other runs' jobs (:mod:`stratify.vectorize`).
"""

from __future__ import annotations

import copy
import secrets
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from stratify.compiled import (
    STEPS_PER_CALL,
    CompiledCallFailed,
    CompileSwitch,
    StepTerms,
    compiled_steps,
    run_compiled_steps,
)
from stratify.nn.norm import client_split, has_batch_norm

#: devices where ``torch.optim.SGD(fused=True)`` runs
FUSED_DEVICES = ("cpu", "cuda")

#: ``hook(model)`` runs after ``backward`` and before the step: it may change ``.grad``.
GradientHook = Callable[[nn.Module], None]

#: ``loss(model, x, y)``: the mean training loss of a mini-batch (default: cross-entropy of
#: ``model(x)``); a method with its own local objective (LfD's drift regulariser) passes one.
LossFunction = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The default local objective: mean cross-entropy of ``model(x)`` against ``y``."""
    return F.cross_entropy(model(x), y)


class GradientTerm:
    """A gradient hook that is also data: what it adds to ``.grad`` can be part of the
    compiled step (:class:`~stratify.compiled.StepTerms`). Subclasses are called like any
    :data:`GradientHook` by the eager loop."""

    def step_terms(self) -> StepTerms:
        raise NotImplementedError

    def __call__(self, model: nn.Module) -> None:
        raise NotImplementedError


@torch.no_grad()
def add_proximal_gradient(
    parameters: Sequence[torch.Tensor], anchor: Sequence[torch.Tensor], mu: float
) -> None:
    """Add ``μ (w − w_g)``, the gradient of ``(μ/2)‖w − w_g‖²``, to every ``w.grad``."""
    for parameter, reference in zip(parameters, anchor):
        assert parameter.grad is not None  # the hook runs right after backward
        parameter.grad.add_(parameter - reference, alpha=mu)


class ProximalGradient(GradientTerm):
    """Adds ``μ (w − w_g)`` to every ``w.grad``: the gradient of FedProx's
    ``(μ/2)‖w − w_g‖²``, the anchor ``w_g`` held fixed.

    Parameters
    ----------
    anchor : list of torch.Tensor
        ``w_g``, one tensor per parameter, in the model's order (no gradient).
    mu : float
        ``μ ≥ 0``.
    """

    def __init__(self, anchor: list[torch.Tensor], mu: float) -> None:
        self.anchor = anchor
        self.mu = mu

    def step_terms(self) -> StepTerms:
        return StepTerms(proximal=True)

    def __call__(self, model: nn.Module) -> None:
        add_proximal_gradient(list(model.parameters()), self.anchor, self.mu)


class GradientOffset(GradientTerm):
    """Adds a fixed tensor to every ``w.grad``: SCAFFOLD's correction ``c − c_i``.

    Parameters
    ----------
    offset : list of torch.Tensor
        One tensor per parameter, in the model's order.
    """

    def __init__(self, offset: list[torch.Tensor]) -> None:
        self.offset = offset

    def step_terms(self) -> StepTerms:
        return StepTerms(offset=True)

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> None:
        gradients = []
        for parameter in model.parameters():
            assert parameter.grad is not None  # the hook runs right after backward
            gradients.append(parameter.grad)
        torch._foreach_add_(gradients, self.offset)


@dataclass
class LocalJob:
    """A stretch of single-sample SGD on one model, as data: one step per entry of
    ``order`` (batch of one, cross-entropy), the model trained in place.

    Parameters
    ----------
    model : torch.nn.Module
        Trained in place: a client's copy of the global model, or the travelling model.
    order : numpy.ndarray
        Sample rows, one step each, in order (every local epoch's permutation in turn).
    lr, momentum, weight_decay : float
        Of the SGD update (momentum as ``torch.optim.SGD`` without dampening).
    term : GradientTerm, optional
        What the method adds to the gradient (FedProx, SCAFFOLD).
    velocities : list of torch.Tensor, optional
        Momentum buffers updated in place (Stratify's optimizer keeps them across
        epochs); ``None``: zeros, a fresh optimizer's.
    """

    model: nn.Module
    order: np.ndarray
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    term: GradientTerm | None = None
    velocities: list[torch.Tensor] | None = None
    #: filled by the runner: the loss of every step, on the device
    losses: torch.Tensor | None = field(default=None, repr=False)

    def step_terms(self) -> StepTerms:
        terms = StepTerms(momentum=self.momentum > 0, weight_decay=self.weight_decay > 0)
        return terms if self.term is None else terms.union(self.term.step_terms())

    def result(self) -> LocalResult:
        """Its counters once it has run: one step per entry, the summed loss."""
        assert self.losses is not None, "the job has not run"
        steps = len(self.order)
        return LocalResult(steps, float(self.losses.sum()), steps)


def batch_bounds(num_samples: int, batch_size: int, merge_singleton: bool) -> list[tuple[int, int]]:
    """``[start, stop)`` of each mini-batch of one pass over ``num_samples`` samples.

    With ``merge_singleton`` a last batch of a single sample joins the one before it
    (``batch_size + 1`` samples): batch-statistics norms cannot normalise one sample, and
    merging keeps the sample where dropping it would never train on it.
    """
    bounds = [
        (start, min(start + batch_size, num_samples)) for start in range(0, num_samples, batch_size)
    ]
    if merge_singleton and len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], num_samples)]
    return bounds


def local_optimizer(
    model: nn.Module, lr: float, momentum: float = 0.0, weight_decay: float = 0.0
) -> torch.optim.SGD:
    """A client's SGD, with torch's fused update where it has one for the parameters.

    The fused step updates every parameter (momentum and weight decay included) in one
    kernel instead of a few per tensor: the same arithmetic, rounded once where the
    per-tensor loop rounds twice (docs/architecture.md, "Performance").

    Parameters
    ----------
    model : torch.nn.Module
        The client's model.
    lr, momentum, weight_decay : float
        Of the SGD update.
    """
    parameters = list(model.parameters())
    fused = all(p.is_floating_point() and p.device.type in FUSED_DEVICES for p in parameters)
    return torch.optim.SGD(
        parameters, lr=lr, momentum=momentum, weight_decay=weight_decay, fused=fused or None
    )


class LocalResult:
    """Counters of one client's local training.

    Parameters
    ----------
    steps : int
        Local optimizer steps.
    loss_sum : float
        Sum over the trained samples of their local loss (before the step).
    samples : int
        Samples trained on, passes counted (``epochs × n_k`` when every epoch trains on
        all ``n_k``).
    """

    __slots__ = ("steps", "loss_sum", "samples")

    def __init__(self, steps: int, loss_sum: float, samples: int) -> None:
        self.steps = steps
        self.loss_sum = loss_sum
        self.samples = samples


def why_not_compiled(
    model: nn.Module, batch_size: int, before_step: GradientHook | None, loss_fn: LossFunction
) -> str | None:
    """Why local training with these settings cannot run as the compiled step, or ``None``."""
    if batch_size != 1:
        return f"local batches of {batch_size} (the compiled step trains on one sample)"
    if loss_fn is not cross_entropy_loss:
        return "its local objective is not the plain cross-entropy"
    if before_step is not None and not isinstance(before_step, GradientTerm):
        return "its gradient hook is not one the compiled step knows"
    if any(True for _ in model.buffers()) or not all(p.requires_grad for p in model.parameters()):
        return "the model has buffers or frozen parameters"
    return None


def accumulate_batch_gradient(
    model: nn.Module,
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    samples: np.ndarray,
    clients: np.ndarray,
    fused: bool = True,
    divisor: int | None = None,
) -> float:
    """Add ``(1/B) Σ_clients ∇ Σ_{i ∈ client} loss_i`` to the parameters' ``.grad``.

    ``samples`` are grouped by client in contiguous segments. The fused path runs the
    global batch as one tensor; the explicit path runs each client separately and sums
    the client gradients. Both give the same gradient, because the gradient of a sum is
    the sum of gradients. Batch-statistics norms couple the clients through their
    per-client partial sums, so a model with them always runs the segmented union (one
    forward, the clients' segments marked by :func:`~stratify.nn.norm.client_split`).
    ``divisor`` replaces ``B`` (the batch's size by default): a Flower node computes
    the plain sum over its share (``divisor=1``) and the server divides the clients' sum
    by ``B`` (docs/flower.md).

    Returns
    -------
    float
        The summed loss of the batch.
    """
    batch_size = len(samples) if divisor is None else divisor
    boundaries = np.flatnonzero(np.diff(clients)) + 1
    segments = np.split(np.arange(len(samples)), boundaries)
    client_sizes = [len(segment) for segment in segments]
    index = torch.as_tensor(samples, device=x_train.device)
    if fused or has_batch_norm(model):
        with client_split(model, client_sizes):
            logits = model(x_train[index])
            loss = F.cross_entropy(logits, y_train[index], reduction="sum")
        (loss / batch_size).backward()
        return float(loss.detach())
    total = 0.0
    for segment in segments:
        client_index = index[segment[0] : segment[-1] + 1]
        loss = F.cross_entropy(model(x_train[client_index]), y_train[client_index], reduction="sum")
        (loss / batch_size).backward()
        total += float(loss.detach())
    return total


def single_sample_sgd(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    indices: list[int],
    lr: float,
) -> list[torch.Tensor]:
    """One SGD step per index, batch of one: the latency-bound hot loop.

    Inputs are sliced from device-resident tensors by precomputed indices. Without
    momentum the step is ``torch.autograd.grad`` plus one fused ``_foreach_add_`` (no
    ``.grad`` zeroing, no optimizer bookkeeping: measured ~20% more steps/s on CPU than
    ``zero_grad``/``backward``/``step``); with momentum ``optimizer`` steps (its rate must
    already be ``lr``). Losses stay on the device.

    Parameters
    ----------
    model : torch.nn.Module
        Trained in place.
    optimizer : torch.optim.Optimizer
        SGD over all of ``model``'s parameters (the ones stepped); its momentum decides
        the path.
    x, y : torch.Tensor
        Inputs and class targets on the model's device.
    indices : list of int
        Rows of ``x``/``y``, one step each, in order.
    lr : float
        Learning rate of the plain-SGD path.

    Returns
    -------
    list of torch.Tensor
        The detached loss of every step.
    """
    # the optimizer's own list: walking the model's modules for it costs as much as a step
    parameters: list[torch.Tensor] = [
        p for group in optimizer.param_groups for p in group["params"] if p.requires_grad
    ]
    plain_sgd = all(group.get("momentum", 0) == 0 for group in optimizer.param_groups)
    losses: list[torch.Tensor] = []
    for index in indices:
        loss = F.cross_entropy(model(x[index : index + 1]), y[index : index + 1])
        gradients = torch.autograd.grad(loss, parameters)
        if plain_sgd:
            with torch.no_grad():
                torch._foreach_add_(parameters, gradients, alpha=-lr)
        else:
            for parameter, gradient in zip(parameters, gradients):
                parameter.grad = gradient
            optimizer.step()
        losses.append(loss.detach())
    return losses


class LocalTrainer:
    """Mini-batch SGD of a client on its own samples.

    Parameters
    ----------
    x_train, y_train : torch.Tensor
        Training tensors on the device; a client reads only its own indices.
    """

    #: single-sample steps per compiled call (K)
    steps_per_call = STEPS_PER_CALL
    #: whether :attr:`x_train` holds the samples, so that a compiled or vectorised step
    #: may read them itself (a trainer that sends the work to the clients' nodes: no)
    holds_samples = True

    def __init__(self, x_train: torch.Tensor, y_train: torch.Tensor) -> None:
        self.x_train = x_train
        self.y_train = y_train
        #: reasons already warned about, so a fallback to the eager loop is said once
        self.warned: set[str] = set()

    @staticmethod
    def receive(global_model: nn.Module) -> nn.Module:
        """A fresh copy of the global model, as a client receives it."""
        return copy.deepcopy(global_model)

    def single_sample_steps(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, indices: list[int], lr: float
    ) -> list[torch.Tensor]:
        """One SGD step per sample of ``indices``, batch of one, on the travelling model
        (Stratify's single-sample hops, :func:`single_sample_sgd`); returns every step's
        detached loss.

        Parameters
        ----------
        model : torch.nn.Module
            Trained in place.
        optimizer : torch.optim.Optimizer
            The global SGD optimizer (its momentum decides the path).
        indices : list of int
            The samples, one step each, in order.
        lr : float
            Learning rate of the plain-SGD path.
        """
        return single_sample_sgd(model, optimizer, self.x_train, self.y_train, indices, lr)

    def batch_gradient(
        self,
        model: nn.Module,
        samples: np.ndarray,
        clients: np.ndarray,
        fused: bool = True,
        divisor: int | None = None,
    ) -> float:
        """Add one global batch's gradient to ``model``'s ``.grad``: each client's summed
        loss gradient over its share, divided by the batch size (Stratify's batch mode,
        :func:`accumulate_batch_gradient`). Returns the batch's summed loss.

        Parameters
        ----------
        model : torch.nn.Module
            The travelling global model.
        samples, clients : numpy.ndarray
            The batch's sample indices and the client holding each, in contiguous
            per-client segments.
        fused : bool
            One forward pass for the whole batch, or one per client (same gradient).
        divisor : int, optional
            What the summed losses are divided by (default: the batch's size).
        """
        return accumulate_batch_gradient(
            model, self.x_train, self.y_train, samples, clients, fused, divisor
        )

    def trained_samples(self, clients: np.ndarray) -> int:
        """How many of a global batch's samples, held by ``clients`` (one entry a sample),
        :meth:`batch_gradient` trained on: all of them here; a remote trainer leaves out
        those of clients it dropped."""
        return len(clients)

    def epoch_orders(
        self, indices: np.ndarray | Sequence[np.ndarray], epochs: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Every local epoch's shuffled samples, drawn from ``rng`` epoch by epoch."""
        per_epoch = [indices] * epochs if isinstance(indices, np.ndarray) else list(indices)
        if len(per_epoch) != epochs:
            raise ValueError(f"{len(per_epoch)} arrays of indices for {epochs} local epochs")
        return [rng.permutation(epoch_indices) for epoch_indices in per_epoch]

    def job(
        self,
        model: nn.Module,
        indices: np.ndarray | Sequence[np.ndarray],
        *,
        epochs: int,
        lr: float,
        rng: np.random.Generator,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        before_step: GradientHook | None = None,
    ) -> LocalJob:
        """Single-sample local training as a :class:`LocalJob`, its samples shuffled from
        ``rng`` exactly as :meth:`train` shuffles them (``before_step`` must be a
        :class:`GradientTerm` or ``None``)."""
        if before_step is not None and not isinstance(before_step, GradientTerm):
            raise TypeError("a job's gradient hook must be a GradientTerm")
        orders = self.epoch_orders(indices, epochs, rng)
        order = np.concatenate(orders) if orders else np.zeros(0, dtype=np.int64)
        return LocalJob(model, order, lr, momentum, weight_decay, before_step)

    def train(
        self,
        model: nn.Module,
        indices: np.ndarray | Sequence[np.ndarray],
        *,
        epochs: int,
        batch_size: int,
        lr: float,
        rng: np.random.Generator,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        before_step: GradientHook | None = None,
        loss_fn: LossFunction = cross_entropy_loss,
        compile: CompileSwitch | None = None,
    ) -> LocalResult:
        """Train ``model`` in place on the samples ``indices``.

        Parameters
        ----------
        model : torch.nn.Module
            The client's model (its copy of the global one, or the travelling model).
        indices : numpy.ndarray or sequence of numpy.ndarray
            The client's training-sample indices, the same in every local epoch; or one
            array per local epoch (``epochs`` of them) for a method whose samples change
            from epoch to epoch (FedBSS's paced subsets).
        epochs, batch_size : int
            Local epochs and mini-batch size (1 in the single-sample setting).
        lr : float
            Local learning rate.
        rng : numpy.random.Generator
            Shuffles the client's samples every local epoch.
        momentum, weight_decay : float
            Of the local SGD optimizer, made afresh for every call: clients keep no
            optimizer state between rounds.
        before_step : callable, optional
            Gradient hook called after ``backward`` and before the step.
        loss_fn : callable
            ``loss_fn(model, x, y)``: the mini-batch's mean loss (default cross-entropy);
            the reported ``loss_sum`` adds up what it returns.
        compile : CompileSwitch, optional
            The run's ``--compile``: where it is active, single-sample training runs as
            the compiled step (:meth:`run_compiled`); settings the compiled step cannot
            express (a batch above one, another objective or hook) run eagerly, with a
            warning the first time.
        """
        orders = self.epoch_orders(indices, epochs, rng)
        if compile is not None and compile.active():
            reason = why_not_compiled(model, batch_size, before_step, loss_fn)
            if reason is None:
                assert before_step is None or isinstance(before_step, GradientTerm)
                job = LocalJob(
                    model, np.concatenate(orders), lr, momentum, weight_decay, before_step
                )
                return self.run_compiled(job, compile)
            if reason not in self.warned:
                self.warned.add(reason)
                warnings.warn(
                    f"--compile {compile.mode}: local training runs eagerly: {reason}",
                    stacklevel=2,
                )
        return self.train_eager(
            model, orders, batch_size, lr, momentum, weight_decay, before_step, loss_fn
        )

    def train_eager(
        self,
        model: nn.Module,
        orders: list[np.ndarray],
        batch_size: int,
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        before_step: GradientHook | None = None,
        loss_fn: LossFunction = cross_entropy_loss,
        initial_velocities: Sequence[torch.Tensor] | None = None,
    ) -> LocalResult:
        """The eager loop, the reference: mini-batches of each epoch's shuffled samples
        (``initial_velocities``: momentum buffers to continue from)."""
        optimizer = local_optimizer(model, lr, momentum, weight_decay)
        if initial_velocities is not None and momentum > 0:
            for parameter, velocity in zip(model.parameters(), initial_velocities):
                optimizer.state[parameter]["momentum_buffer"] = velocity.clone()
        x_train, y_train = self.x_train, self.y_train
        model.train()
        steps = 0
        losses = torch.zeros((), device=x_train.device)
        merge_singleton = has_batch_norm(model)
        for epoch_order in orders:
            order = torch.as_tensor(epoch_order, device=x_train.device)
            for start, stop in batch_bounds(len(epoch_order), batch_size, merge_singleton):
                batch = order[start:stop]
                loss = loss_fn(model, x_train[batch], y_train[batch])
                losses += loss.detach() * len(batch)
                optimizer.zero_grad(set_to_none=False)
                loss.backward()
                if before_step is not None:
                    before_step(model)
                optimizer.step()
                steps += 1
        return LocalResult(steps, float(losses), sum(len(order) for order in orders))

    def run_compiled(self, job: LocalJob, switch: CompileSwitch) -> LocalResult:
        """``job`` as the compiled single-sample step (:mod:`stratify.compiled`).

        If a call fails to compile, ``--compile on`` stops with one line and ``auto``
        trains the rest of the job eagerly (the failed call touched nothing).
        """
        model, term = job.model, job.term
        model.train()
        steps = compiled_steps(model, self.steps_per_call, job.step_terms())
        parameters = [parameter.detach() for parameter in model.parameters()]
        velocities = job.velocities
        if velocities is None and job.momentum > 0:
            velocities = [torch.zeros_like(parameter) for parameter in parameters]
        try:
            job.losses = run_compiled_steps(
                steps,
                parameters,
                [],
                self.x_train,
                self.y_train,
                job.order,
                job.lr,
                velocities=velocities or (),
                momentum=job.momentum,
                weight_decay=job.weight_decay,
                anchors=term.anchor if isinstance(term, ProximalGradient) else (),
                mu=term.mu if isinstance(term, ProximalGradient) else 0.0,
                offsets=term.offset if isinstance(term, GradientOffset) else (),
            )
        except CompiledCallFailed as failure:
            switch.give_up(failure.error)
            # the rest eagerly, its momentum continuing from the compiled steps'
            rest = self.train_eager(
                model,
                [job.order[failure.done :]],
                1,
                job.lr,
                job.momentum,
                job.weight_decay,
                term,
                initial_velocities=velocities,
            )
            return LocalResult(
                failure.done + rest.steps,
                float(failure.losses.sum()) + rest.loss_sum,
                failure.done + rest.samples,
            )
        return job.result()


def per_sample_gradients(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each sample's cross-entropy gradient, one tensor per trainable parameter of shape
    ``(samples, *parameter.shape)``, and each sample's loss (``torch.func``: ``vmap`` of
    ``grad`` over a functional call; the model must not couple samples through batch
    statistics).

    Parameters
    ----------
    model : torch.nn.Module
        Read, not changed.
    x, y : torch.Tensor
        The samples and their class targets.
    """
    from torch.func import functional_call, grad_and_value, vmap

    trainable = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    fixed = {name: p.detach() for name, p in model.named_parameters() if not p.requires_grad}
    fixed.update({name: b.detach() for name, b in model.named_buffers()})

    def loss_of(
        parameters: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor
    ) -> torch.Tensor:
        logits = functional_call(model, (parameters, fixed), (xi.unsqueeze(0),))
        return F.cross_entropy(logits, yi.unsqueeze(0))

    gradients, losses = vmap(grad_and_value(loss_of), in_dims=(None, 0, 0))(trainable, x, y)
    return [gradients[name] for name in trainable], losses


class PrivateTrainer(LocalTrainer):
    """A :class:`LocalTrainer` whose clients send only differentially private updates:
    every per-sample gradient is clipped to norm ``C`` and Gaussian noise ``N(0, σ²C²)``
    is added on the client, before anything leaves it (docs/architecture.md,
    "Differential privacy").

    - single-sample steps (Stratify's hops): each one-sample step's gradient is clipped
      and noised, then the SGD step is taken;
    - a global batch's share (Stratify's batch mode): the share's per-sample gradients
      are clipped and summed, the noise is added to the share's sum, and only then is it
      divided by the batch size and added to ``.grad``;
    - the baselines' local mini-batch steps: the same per step, divided by the
      mini-batch's size.

    A wrapper around this trainer (one that records what leaves a client) sees the
    noised values. Every use of a sample is counted in :attr:`uses`. The compiled and
    vectorised steps, which read the samples themselves, are never used:
    :attr:`holds_samples` is ``False`` for them (the settings are checked by
    :func:`stratify.experiment.check_private`).

    Parameters
    ----------
    x_train, y_train : torch.Tensor
        Training tensors on the device.
    clip : float
        Per-sample clipping norm ``C``.
    noise_multiplier : float
        ``σ``; 0 clips without noise (tests only).
    seed : int, optional
        Seeds the noise generator (on the samples' device). ``None`` (the default): a
        seed drawn from the operating system's entropy, known to no one: a seed that the
        server knows (the run's ``--seed`` is in ``config.json``) would let it subtract
        the noise.
    chunk : int
        Per-sample gradients computed this many at a time (memory).
    owners : numpy.ndarray, optional
        The client of every training sample. Given, each client draws its noise from a
        generator of its own, seeded by ``(seed, epoch, client)``, as each client's node
        does over Flower (docs/flower.md, "Differential privacy"), so that a simulation
        with ``--dp-seed`` draws the same noise in-process and on the nodes; ``None``:
        one generator for all.
    """

    holds_samples = False

    def __init__(
        self,
        x_train: torch.Tensor,
        y_train: torch.Tensor,
        clip: float = 1.0,
        noise_multiplier: float = 1.0,
        seed: int | None = None,
        chunk: int = 256,
        owners: np.ndarray | None = None,
    ) -> None:
        super().__init__(x_train, y_train)
        self.clip = clip
        self.noise_multiplier = noise_multiplier
        self.chunk = chunk
        self.seed = secrets.randbits(62) if seed is None else int(seed)
        self.generator = torch.Generator(device=x_train.device)
        self.generator.manual_seed(self.seed)
        self.owners = None if owners is None else np.asarray(owners, dtype=np.int64)
        self.epoch = 0
        #: with ``owners``: how many noise draws (a share's sum, a step's gradient) each
        #: client has made in the current epoch; a draw's noise is keyed by
        #: ``(seed, epoch, client, draw)``, so a node that is told where its message's
        #: draws start draws the same noise wherever it runs
        self.draws: dict[int, int] = {}
        #: how many noised steps each training sample has been in (this process)
        self.uses = np.zeros(len(y_train), dtype=np.int64)
        #: the run's settings and the most uses of a sample per epoch, set by
        #: :func:`stratify.experiment.build_experiment` for the accounting
        self.privacy: object | None = None
        self.uses_per_epoch = 0

    def start_epoch(self, epoch: int) -> None:
        """Reseed the noise for ``epoch`` from the trainer's seed: with a given seed
        (``--dp-seed``) a resumed run draws the same noise as one that never stopped; with
        an entropy seed a resumed run draws fresh noise (never noise already used, which
        would let two messages' difference cancel it)."""
        self.generator.manual_seed((self.seed * 1_000_003 + int(epoch)) % 2**63)
        self.epoch = int(epoch)
        self.draws = {}

    def noise_generator(self, sample: int) -> torch.Generator:
        """The generator one noise draw for a message holding ``sample`` comes from: with
        :attr:`owners`, one seeded by ``(seed, epoch, client, draw)`` for the client's
        next draw; else the trainer's one."""
        if self.owners is None:
            return self.generator
        client = int(self.owners[sample])
        draw = self.draws.get(client, 0)
        self.draws[client] = draw + 1
        words = np.random.SeedSequence([self.seed, self.epoch, client, draw]).generate_state(2)
        generator = torch.Generator(device=self.x_train.device)
        generator.manual_seed(int(words[0]) << 31 ^ int(words[1]))
        return generator

    # the noise ------------------------------------------------------------------------

    def private_sum(
        self, model: nn.Module, index: torch.Tensor
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """``Σ_i clip(g_i) + N(0, σ²C²)`` over the samples ``index`` and their summed
        loss: what one client sends for them."""
        sums, loss_sum = self.private_share_sums(model, index, [len(index)])
        return [share[0] for share in sums], loss_sum

    def private_share_sums(
        self, model: nn.Module, index: torch.Tensor, sizes: Sequence[int]
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Each share's ``Σ_i clip(g_i) + N(0, σ²C²)``, one independent noise draw per
        share, and the summed loss of all: ``index`` holds the shares' samples in
        consecutive runs of ``sizes``. The per-sample gradients of all shares are
        computed together (one ``vmap`` per :attr:`chunk` samples), each share's are
        summed apart.

        Returns
        -------
        list of torch.Tensor
            Per parameter, the shares' noised sums, shape ``(len(sizes), *shape)``.
        torch.Tensor
            The summed loss.
        """
        from stratify.privacy.dp import add_noise, clip_factor

        parameters = [p for p in model.parameters() if p.requires_grad]
        device = self.x_train.device
        share_of = torch.as_tensor(np.repeat(np.arange(len(sizes)), sizes), device=device)
        sums = [
            torch.zeros((len(sizes), *p.shape), device=device, dtype=p.dtype) for p in parameters
        ]
        loss_sum = torch.zeros((), device=device)
        for start in range(0, len(index), self.chunk):
            part = index[start : start + self.chunk]
            if len(part) == 1:  # one sample: plain autograd, without vmap's overhead
                loss = F.cross_entropy(model(self.x_train[part]), self.y_train[part])
                gradients = [g.unsqueeze(0) for g in torch.autograd.grad(loss, parameters)]
                losses = loss.detach().reshape(1)
            else:
                gradients, losses = per_sample_gradients(
                    model, self.x_train[part], self.y_train[part]
                )
            norms = torch.stack([g.reshape(len(part), -1).norm(dim=1) for g in gradients], 1)
            factors = clip_factor(norms.norm(dim=1), self.clip)
            owners = share_of[start : start + len(part)]
            for total, gradient in zip(sums, gradients):
                scaled = gradient * factors.reshape(-1, *([1] * (gradient.dim() - 1)))
                total.index_add_(0, owners, scaled.to(total.dtype))
            loss_sum = loss_sum + losses.sum()
        positions = index.cpu().numpy()
        np.add.at(self.uses, positions, 1)
        if self.owners is None:
            # one independent draw per share and coordinate
            noised = add_noise(sums, self.noise_multiplier, self.clip, self.generator)
            return noised, loss_sum
        # each share's noise from its client's generator, as its node draws it
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        shares = [
            add_noise(
                [total[share] for total in sums],
                self.noise_multiplier,
                self.clip,
                self.noise_generator(int(positions[start])),
            )
            for share, start in enumerate(starts)
        ]
        return [torch.stack(parts) for parts in zip(*shares)], loss_sum

    # the trainer's methods ----------------------------------------------------------

    def single_sample_steps(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, indices: list[int], lr: float
    ) -> list[torch.Tensor]:
        """As :meth:`LocalTrainer.single_sample_steps`, each step's gradient clipped to
        ``C`` and noised before the step."""
        from stratify.privacy.dp import add_noise, clip_gradient

        parameters: list[torch.Tensor] = [
            p for group in optimizer.param_groups for p in group["params"] if p.requires_grad
        ]
        plain_sgd = all(group.get("momentum", 0) == 0 for group in optimizer.param_groups)
        losses: list[torch.Tensor] = []
        x, y = self.x_train, self.y_train
        for index in indices:
            loss = F.cross_entropy(model(x[index : index + 1]), y[index : index + 1])
            gradients = clip_gradient(torch.autograd.grad(loss, parameters), self.clip)
            gradients = add_noise(
                gradients, self.noise_multiplier, self.clip, self.noise_generator(index)
            )
            self.uses[index] += 1
            if plain_sgd:
                with torch.no_grad():
                    torch._foreach_add_(parameters, gradients, alpha=-lr)
            else:
                for parameter, gradient in zip(parameters, gradients):
                    parameter.grad = gradient
                optimizer.step()
            losses.append(loss.detach())
        return losses

    def batch_gradient(
        self,
        model: nn.Module,
        samples: np.ndarray,
        clients: np.ndarray,
        fused: bool = True,
        divisor: int | None = None,
    ) -> float:
        """As :meth:`LocalTrainer.batch_gradient`, each client's share a noised sum of
        clipped per-sample gradients (``fused`` makes no difference: every share is its
        own computation)."""
        batch_size = len(samples) if divisor is None else divisor
        boundaries = np.flatnonzero(np.diff(clients)) + 1
        sizes = np.diff(np.concatenate([[0], boundaries, [len(samples)]])).tolist()
        index = torch.as_tensor(samples, device=self.x_train.device)
        parameters = [p for p in model.parameters() if p.requires_grad]
        shares, loss_sum = self.private_share_sums(model, index, sizes)
        with torch.no_grad():
            for parameter, share in zip(parameters, shares):
                # the clients' noised sums, added up by the server
                gradient = share.sum(0) / batch_size
                if parameter.grad is None:
                    parameter.grad = gradient
                else:
                    parameter.grad.add_(gradient)
        return float(loss_sum)

    def job(self, *args: object, **kwargs: object) -> LocalJob:
        """Refused: a job runs as the compiled or vectorised step, which does not clip."""
        raise TypeError("a private trainer's local training runs eagerly, not as a job")

    def train(
        self,
        model: nn.Module,
        indices: np.ndarray | Sequence[np.ndarray],
        *,
        epochs: int,
        batch_size: int,
        lr: float,
        rng: np.random.Generator,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        before_step: GradientHook | None = None,
        loss_fn: LossFunction = cross_entropy_loss,
        compile: CompileSwitch | None = None,
    ) -> LocalResult:
        """As :meth:`LocalTrainer.train`, always eagerly (``compile`` is ignored: the
        compiled step does not clip)."""
        orders = self.epoch_orders(indices, epochs, rng)
        return self.train_eager(
            model, orders, batch_size, lr, momentum, weight_decay, before_step, loss_fn
        )

    def train_eager(
        self,
        model: nn.Module,
        orders: list[np.ndarray],
        batch_size: int,
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        before_step: GradientHook | None = None,
        loss_fn: LossFunction = cross_entropy_loss,
        initial_velocities: Sequence[torch.Tensor] | None = None,
    ) -> LocalResult:
        """As :meth:`LocalTrainer.train_eager`, each mini-batch's gradient the noised
        sum of its clipped per-sample gradients over the mini-batch's size; the gradient
        hook (FedProx, SCAFFOLD) then adds its data-free term."""
        if loss_fn is not cross_entropy_loss:
            raise TypeError("a private trainer clips per-sample cross-entropy gradients only")
        optimizer = local_optimizer(model, lr, momentum, weight_decay)
        if initial_velocities is not None and momentum > 0:
            for parameter, velocity in zip(model.parameters(), initial_velocities):
                optimizer.state[parameter]["momentum_buffer"] = velocity.clone()
        model.train()
        parameters = [p for p in model.parameters() if p.requires_grad]
        steps = 0
        losses = torch.zeros((), device=self.x_train.device)
        for epoch_order in orders:
            order = torch.as_tensor(epoch_order, device=self.x_train.device)
            for start, stop in batch_bounds(len(epoch_order), batch_size, False):
                batch = order[start:stop]
                noised, loss_sum = self.private_sum(model, batch)
                losses += loss_sum.detach()
                with torch.no_grad():
                    for parameter, gradient in zip(parameters, noised):
                        parameter.grad = gradient / len(batch)
                if before_step is not None:
                    before_step(model)
                optimizer.step()
                steps += 1
        return LocalResult(steps, float(losses), sum(len(order) for order in orders))


def private_trainer(trainer: LocalTrainer | None) -> PrivateTrainer | None:
    """``trainer`` if it is a :class:`PrivateTrainer`, else the private trainer it wraps
    (a recorder's ``inner``), else ``None``."""
    if isinstance(trainer, PrivateTrainer):
        return trainer
    inner = getattr(trainer, "inner", None)
    return inner if isinstance(inner, PrivateTrainer) else None
