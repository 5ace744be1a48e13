"""The single-sample hot loop as a compiled functional step (docs/architecture.md, "Performance").

``K`` SGD steps of batch one are unrolled into one function of the parameters, the
momentum buffers, the training tensors, ``K`` sample indices and ``K`` learning rates:
``torch.func.grad_and_value`` of a ``functional_call`` of the model, under
``torch.compile(fullgraph=True)``. What a method adds to the gradient before the step
(weight decay, FedProx's proximal gradient, SCAFFOLD's correction: :class:`StepTerms`) is
part of the function, so local training compiles as Stratify's hops do. A step whose rate
is 0 leaves the weights and the momentum as they are: a stretch of ``n`` steps runs as
``ceil(n / K)`` calls, the last one padded with such masked steps.

A compiled step does not belong to one model: it calls a private copy of the model's
architecture with whatever parameters it is given, and is shared by every model of the
same architecture in the process, so new runs (seeds) do not recompile. Across processes,
inductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``, torch's default folder unless set)
makes a repeated compile take seconds instead of tens of seconds.

:class:`VectorisedSteps` is the same function ``torch.func.vmap``-ped over ``L`` lanes:
``L`` models of one architecture, their weights stacked, each lane with its own sample
indices, rates and terms, stepped by one call (:mod:`stratify.vectorize`).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from stratify.backend import cpu_backend
from stratify.errors import TrainingError

#: ``--compile`` values: compile once the run has proven long (``auto``), always, never.
COMPILE_MODES = ("auto", "on", "off")

#: single-sample steps a run makes in eager mode before ``auto`` compiles. On the simple
#: CNN on one CPU thread a compiled step saved ~0.33 ms (docs/performance.md) and the
#: compile took ~45 s cold and ~6 s from the on-disk cache: break-even after ~140,000 and
#: ~18,000 steps. Compiling once the run has made about that many steps means a run that
#: stops earlier never pays for the compile and a longer one loses at most about what the
#: compile costs (the ski-rental rule).
AUTO_COMPILE_AFTER_STEPS = 100_000

#: steps unrolled into one compiled call: amortises the per-call dispatch of a compiled
#: function; on the simple CNN (mnist-10k, one thread, a shared machine) the medians of
#: three runs were 2,259 / 3,446 / 3,919 / 3,730 steps/s for 1 / 4 / 8 / 16 steps per call
STEPS_PER_CALL = 8

#: torch.compile backend of the step; the tests swap in ``aot_eager`` (same graph capture,
#: no code generation) where the compiled arithmetic is not what they check
BACKEND = "inductor"

#: inductor settings of the vmapped step. By default inductor recomputes small
#: pointwise results (a max-pool window) inside the reductions that read them; vmapped,
#: the linear layers of batch one become such reductions (lanes × outputs × inputs), which
#: then re-read the pool for every output and cannot vectorise. Storing every result of
#: more than two ops instead gave 16,381 against 6,539 model-steps/s (simple CNN,
#: mnist-10k, 16 lanes, one thread, load ~3; one compiled run: 6,093 steps/s).
VECTORISED_INDUCTOR_OPTIONS: dict[str, int] = {"realize_cpu_opcount_threshold": 2}


def known_inductor_options(
    options: Mapping[str, str | int | bool],
) -> dict[str, str | int | bool | Callable[..., Any]]:
    """The entries of ``options`` this torch's inductor knows: torch.compile refuses an
    unknown one, and ``realize_cpu_opcount_threshold`` is newer than torch 2.11 (a run
    there keeps inductor's default, slower on CPU but the same arithmetic)."""
    from torch._inductor import config

    return {name: value for name, value in options.items() if hasattr(config, name)}


StepFunction = Callable[..., Any]


@dataclass(frozen=True)
class StepTerms:
    """What a compiled step adds to the loss gradient ``g`` before it steps, in the eager
    loop's order: ``g + μ(w − w_g)`` (``proximal``, FedProx), ``+ o`` (``offset``,
    SCAFFOLD's ``c − c_i``), ``+ λw`` (``weight_decay``); then ``w −= lr·g`` or, with
    ``momentum``, ``v = β·v + g; w −= lr·v``. Each term is compiled in only where a run
    has it: a term of value 0 would give the same numbers at the cost of its arithmetic.
    """

    momentum: bool = False
    weight_decay: bool = False
    proximal: bool = False
    offset: bool = False

    def union(self, other: StepTerms) -> StepTerms:
        return StepTerms(*(a or b for a, b in zip(self.flags(), other.flags())))

    def flags(self) -> tuple[bool, bool, bool, bool]:
        return (self.momentum, self.weight_decay, self.proximal, self.offset)

    def describe(self) -> str:
        names = ("momentum", "weight decay", "proximal", "offset")
        return ", ".join(name for name, on in zip(names, self.flags()) if on) or "plain SGD"


def architecture_key(model: nn.Module) -> tuple:
    """What a compiled step depends on in a model: its module tree, tensor shapes, dtypes."""
    tensors = tuple(
        (name, tuple(tensor.shape), tensor.dtype, tensor.device.type)
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]
    )
    return (repr(model), tensors, model.training)


def unrolled_sgd_steps(
    template: nn.Module,
    parameter_names: Sequence[str],
    buffer_names: Sequence[str],
    steps_per_call: int,
    terms: StepTerms,
) -> StepFunction:
    """A pure function making ``steps_per_call`` SGD steps of batch one on ``template``'s
    architecture: it returns the new parameters, the new momentum buffers and the losses.

    The function's arguments: ``parameters``, ``buffers``, ``velocities`` (momentum
    buffers; empty without momentum), ``anchors`` (FedProx's ``w_g``; empty without the
    proximal term), ``offsets`` (empty without the offset), ``x_train``, ``y_train``,
    ``indices`` (``K`` sample rows), ``lr`` (``K`` rates; a step of rate 0 changes
    nothing), ``beta``, ``weight_decay``, ``mu`` (scalars).

    Parameters
    ----------
    template : torch.nn.Module
        The architecture; its own tensors are never read (``functional_call`` replaces them).
    parameter_names, buffer_names : sequence of str
        The names the parameter and buffer arguments stand for, in order.
    steps_per_call : int
        Steps ``K`` per call.
    terms : StepTerms
        What is added to the gradient, and whether the step keeps momentum buffers
        (``buf = β·buf + g; w −= lr·buf``, as ``torch.optim.SGD`` without dampening).
    """

    def loss_of(parameters, buffers, x, y):
        state = {**dict(zip(parameter_names, parameters)), **dict(zip(buffer_names, buffers))}
        return F.cross_entropy(torch.func.functional_call(template, state, (x,)), y)

    gradient_and_loss = torch.func.grad_and_value(loss_of)

    def steps(
        parameters,
        buffers,
        velocities,
        anchors,
        offsets,
        x_train,
        y_train,
        indices,
        lr,
        beta,
        weight_decay,
        mu,
    ):
        current = list(parameters)
        velocity = list(velocities)
        losses = []
        for step in range(steps_per_call):
            index = indices[step : step + 1]
            gradients, loss = gradient_and_loss(
                current, buffers, x_train.index_select(0, index), y_train.index_select(0, index)
            )
            if terms.proximal:
                gradients = [g + mu * (w - a) for g, w, a in zip(gradients, current, anchors)]
            if terms.offset:
                gradients = [g + o for g, o in zip(gradients, offsets)]
            if terms.weight_decay:
                gradients = [g + weight_decay * w for g, w in zip(gradients, current)]
            rate = lr[step]
            if terms.momentum:
                # a masked step (rate 0) must leave the momentum as it is too
                active = rate > 0
                velocity = [
                    torch.where(active, beta * v + g, v) for v, g in zip(velocity, gradients)
                ]
                current = [w - rate * v for w, v in zip(current, velocity)]
            else:
                current = [w - rate * g for w, g in zip(current, gradients)]
            losses.append(loss)
        return current, velocity, torch.stack(losses)

    return steps


def names_of(model: nn.Module) -> tuple[list[str], list[str]]:
    return (
        [name for name, _ in model.named_parameters()],
        [name for name, _ in model.named_buffers()],
    )


class CompiledSteps:
    """``K`` compiled single-sample SGD steps per call for one architecture, updating the
    tensors it is given in place.

    Get one with :func:`compiled_steps`, which shares it between models of the same
    architecture.

    Parameters
    ----------
    model : torch.nn.Module
        A model of the architecture (its structure is copied, not its tensors).
    steps_per_call : int
        Steps ``K`` per call.
    terms : StepTerms
        What the step adds to the gradient (see :func:`unrolled_sgd_steps`).
    """

    def __init__(self, model: nn.Module, steps_per_call: int, terms: StepTerms) -> None:
        self.template = copy.deepcopy(model)
        self.steps_per_call = steps_per_call
        self.terms = terms
        pure = unrolled_sgd_steps(self.template, *names_of(model), steps_per_call, terms)

        def in_place(parameters, buffers, velocities, *rest):
            new_parameters, new_velocities, losses = pure(parameters, buffers, velocities, *rest)
            for target, value in zip(parameters, new_parameters):
                target.copy_(value)
            for target, value in zip(velocities, new_velocities):
                target.copy_(value)
            return losses

        self.function = torch.compile(in_place, backend=BACKEND, fullgraph=True, dynamic=False)

    def __call__(self, *arguments: Any) -> torch.Tensor:
        """Make ``K`` steps in place on detached parameters (and velocities); the
        arguments are those of :func:`unrolled_sgd_steps`' function."""
        with torch.no_grad():
            return self.function(*arguments)


_SHARED: dict[tuple, Any] = {}


def compiled_steps(model: nn.Module, steps_per_call: int, terms: StepTerms) -> CompiledSteps:
    """The process's compiled steps for ``model``'s architecture (built on first use)."""
    key = ("single", architecture_key(model), steps_per_call, terms, BACKEND)
    if key not in _SHARED:
        _SHARED[key] = CompiledSteps(model, steps_per_call, terms)
    return _SHARED[key]


class VectorisedSteps:
    """``K`` single-sample SGD steps of ``lanes`` models at once: :func:`unrolled_sgd_steps`
    under ``torch.func.vmap``, compiled or eager, updating stacked tensors in place.

    Every argument but the training tensors has a leading lane dimension: the parameters
    and velocities are stacked ``(lanes, *shape)``, the indices and rates ``(lanes, K)``,
    ``beta``, ``weight_decay`` and ``mu`` ``(lanes,)``. A lane's numbers depend on its own
    inputs only, never on the other lanes' or on its position (measured bit for bit); the
    generated kernels do depend on ``lanes``, so a group keeps its lane count.

    Parameters
    ----------
    model : torch.nn.Module
        A model of the architecture, without buffers (single-sample models have none).
    steps_per_call : int
        Steps ``K`` per call.
    terms : StepTerms
        What the step adds to the gradient.
    lanes : int
        Models per call.
    compile : bool
        Compile with :data:`BACKEND` (else the vmapped function runs eagerly).
    """

    def __init__(
        self, model: nn.Module, steps_per_call: int, terms: StepTerms, lanes: int, compile: bool
    ) -> None:
        parameter_names, buffer_names = names_of(model)
        if buffer_names:
            raise ValueError("vectorised steps need a model without buffers")
        self.template = copy.deepcopy(model)
        self.steps_per_call = steps_per_call
        self.terms = terms
        self.lanes = lanes
        self.compiled = compile
        pure = unrolled_sgd_steps(self.template, parameter_names, [], steps_per_call, terms)

        def per_lane(parameters, velocities, anchors, offsets, *rest):
            return pure(parameters, [], velocities, anchors, offsets, *rest)

        batched = torch.func.vmap(
            per_lane, in_dims=(0, 0, 0, 0, None, None, 0, 0, 0, 0, 0), randomness="error"
        )

        def in_place(parameters, velocities, anchors, offsets, *rest):
            new_parameters, new_velocities, losses = batched(
                parameters, velocities, anchors, offsets, *rest
            )
            for target, value in zip(parameters, new_parameters):
                target.copy_(value)
            for target, value in zip(velocities, new_velocities):
                target.copy_(value)
            return losses

        if not compile:
            self.function = in_place
        elif BACKEND == "inductor":
            self.function = torch.compile(
                in_place,
                fullgraph=True,
                dynamic=False,
                options=known_inductor_options(VECTORISED_INDUCTOR_OPTIONS),
            )
        else:
            self.function = torch.compile(in_place, backend=BACKEND, fullgraph=True, dynamic=False)

    def __call__(self, *arguments: Any) -> torch.Tensor:
        """Make ``K`` steps of every lane in place; returns the ``(lanes, K)`` losses.

        On CPU the call runs with oneDNN on: a convolution vmapped over lanes is a grouped
        convolution, which oneDNN runs faster than torch's own loop over the groups, while
        a single model's batch-of-one convolution is faster without it (measured on the
        simple CNN, 16 lanes: 1.5× the model-steps/s with oneDNN on).
        """
        with torch.no_grad(), cpu_backend(one_dnn=True):
            return self.function(*arguments)


def vectorised_steps(
    model: nn.Module, steps_per_call: int, terms: StepTerms, lanes: int, compile: bool
) -> VectorisedSteps:
    """The process's vectorised steps for ``model``'s architecture and ``lanes``."""
    key = ("vmap", architecture_key(model), steps_per_call, terms, lanes, compile, BACKEND)
    if key not in _SHARED:
        _SHARED[key] = VectorisedSteps(model, steps_per_call, terms, lanes, compile)
    return _SHARED[key]


def padded_blocks(order: np.ndarray, steps_per_call: int) -> tuple[np.ndarray, np.ndarray]:
    """``order`` cut into rows of ``K`` sample indices, the last row padded by repeating
    its last index, and a mask of the real steps."""
    count = len(order)
    calls = -(-count // steps_per_call)
    indices = np.empty(calls * steps_per_call, dtype=np.int64)
    indices[:count] = order
    indices[count:] = order[-1] if count else 0
    mask = np.zeros(calls * steps_per_call, dtype=bool)
    mask[:count] = True
    return indices.reshape(calls, steps_per_call), mask.reshape(calls, steps_per_call)


class CompiledCallFailed(Exception):
    """A compiled call failed (e.g. no C compiler for inductor); the steps before it stand.

    Parameters
    ----------
    error : Exception
        What the call raised.
    done : int
        Real steps made before the failed call (a failed call touches no tensor).
    losses : torch.Tensor
        Their losses.
    """

    def __init__(self, error: Exception, done: int, losses: torch.Tensor) -> None:
        super().__init__(str(error))
        self.error = error
        self.done = done
        self.losses = losses


def run_compiled_steps(
    steps: CompiledSteps,
    parameters: Sequence[torch.Tensor],
    buffers: Sequence[torch.Tensor],
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    order: np.ndarray,
    lr: float,
    *,
    velocities: Sequence[torch.Tensor] = (),
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    anchors: Sequence[torch.Tensor] = (),
    mu: float = 0.0,
    offsets: Sequence[torch.Tensor] = (),
    progress: Callable[[int], None] | None = None,
    progress_every: int = 1000,
) -> torch.Tensor:
    """One SGD step per entry of ``order``, ``K`` per compiled call, in place on the
    (detached) ``parameters`` and ``velocities``.

    Returns the losses of the real steps (the padding of the last call is dropped);
    ``progress`` is called with the real steps made, about every ``progress_every``.
    Raises :class:`CompiledCallFailed` when a call fails.
    """
    K = steps.steps_per_call
    dtype, device = parameters[0].dtype, parameters[0].device
    blocks, mask = padded_blocks(order, K)
    index = torch.as_tensor(blocks, device=device)
    rates = torch.as_tensor(np.where(mask, lr, 0.0), dtype=dtype, device=device)
    beta = torch.tensor(momentum, dtype=dtype, device=device)
    decay = torch.tensor(weight_decay, dtype=dtype, device=device)
    proximal = torch.tensor(mu, dtype=dtype, device=device)
    fixed = (list(parameters), list(buffers), list(velocities), list(anchors), list(offsets))
    losses: list[torch.Tensor] = []
    reported = 0
    for call in range(len(blocks)):
        try:
            losses.append(
                steps(*fixed, x_train, y_train, index[call], rates[call], beta, decay, proximal)
            )
        except Exception as error:  # a failed call has not touched the tensors
            done = call * K
            raise CompiledCallFailed(error, done, joined(losses, done, dtype, device)) from None
        made = min((call + 1) * K, len(order))
        if progress is not None and (made - reported >= progress_every or made == len(order)):
            progress(made - reported)
            reported = made
    return joined(losses, len(order), dtype, device)


def joined(
    losses: list[torch.Tensor], count: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The first ``count`` of the calls' losses, as one tensor."""
    if not losses:
        return torch.zeros(0, dtype=dtype, device=device)
    return torch.cat(losses)[:count]


class CompileSwitch:
    """``--compile auto|on|off`` for one run: whether its next epoch runs compiled.

    ``on`` always, ``off`` never, ``auto`` from the first epoch that starts after
    :data:`AUTO_COMPILE_AFTER_STEPS` single-sample steps of the run. The steps made are
    part of the checkpoint (:meth:`state_dict`), so a resumed run switches at the same
    epoch. A failed compile stops a run under ``on`` with one line and turns ``auto`` to
    eager for the rest of the run.

    Parameters
    ----------
    mode : {"auto", "on", "off"}
        The run's ``--compile``.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.steps_made = 0
        self.failed = False

    def active(self) -> bool:
        """Whether the next epoch runs compiled."""
        if self.mode == "off" or self.failed:
            return False
        return self.mode == "on" or self.steps_made >= AUTO_COMPILE_AFTER_STEPS

    def count(self, steps: int) -> None:
        self.steps_made += steps

    def give_up(self, error: Exception) -> None:
        """``on``: a one-line error; ``auto``: a warning, and eager from now on."""
        reason = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
        if self.mode == "on":
            raise TrainingError(
                f"--compile on: the compiled step failed ({reason}); use --compile off"
            ) from None
        warnings.warn(
            f"--compile auto: the compiled step failed ({reason}); continuing eagerly",
            stacklevel=3,
        )
        self.failed = True

    def state_dict(self) -> dict[str, int]:
        return {"steps_made": self.steps_made}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_made = int(state.get("steps_made", 0))
