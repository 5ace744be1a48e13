"""The single-sample hot loop as a compiled functional step (docs/architecture.md, "Performance").

``K`` SGD steps of batch one are unrolled into one function of the parameters, the
momentum buffers, the training tensors, ``K`` sample indices and the learning rate:
``torch.func.grad_and_value`` of a ``functional_call`` of the model, under
``torch.compile(fullgraph=True)``. The parameters and buffers are updated in place, so the
model and its optimizer state stay the ones the eager loop uses; the eager loop remains the
reference and the fallback.

A compiled step does not belong to one model: it calls a private copy of the model's
architecture with whatever parameters it is given, and is shared by every model of the
same architecture in the process, so new runs (seeds) do not recompile. Across processes,
inductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``, torch's default folder unless set)
makes a repeated compile take seconds instead of tens of seconds.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

#: ``--compile`` values: compile once the run has proven long (``auto``), always, never.
COMPILE_MODES = ("auto", "on", "off")

#: single-sample steps a run makes in eager mode before ``auto`` compiles. On the simple
#: CNN on one CPU thread a compiled step saved ~0.33 ms (README "Performance") and the
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

StepFunction = Callable[..., torch.Tensor]


def architecture_key(model: nn.Module, steps_per_call: int, momentum: bool) -> tuple:
    """What a compiled step depends on: the module tree, tensor shapes and dtypes, ``K``."""
    tensors = tuple(
        (name, tuple(tensor.shape), tensor.dtype, tensor.device.type)
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]
    )
    return (repr(model), tensors, model.training, steps_per_call, momentum, BACKEND)


def unrolled_sgd_steps(
    template: nn.Module,
    parameter_names: Sequence[str],
    buffer_names: Sequence[str],
    steps_per_call: int,
    momentum: bool,
) -> StepFunction:
    """A function making ``steps_per_call`` SGD steps of batch one on ``template``'s
    architecture, updating its tensor arguments in place and returning the losses.

    Parameters
    ----------
    template : torch.nn.Module
        The architecture; its own tensors are never read (``functional_call`` replaces them).
    parameter_names, buffer_names : sequence of str
        The names the parameter and buffer arguments stand for, in order.
    steps_per_call : int
        Steps ``K`` per call: the function reads ``K`` sample indices.
    momentum : bool
        Whether the step keeps momentum buffers (``buf = m·buf + g; w -= lr·buf``, as
        ``torch.optim.SGD`` without dampening) or is plain SGD (``w -= lr·g``).
    """

    def loss_of(parameters, buffers, x, y):
        state = {**dict(zip(parameter_names, parameters)), **dict(zip(buffer_names, buffers))}
        return F.cross_entropy(torch.func.functional_call(template, state, (x,)), y)

    gradient_and_loss = torch.func.grad_and_value(loss_of)

    def steps(parameters, buffers, velocities, x_train, y_train, indices, lr, beta):
        current = list(parameters)
        velocity = list(velocities)
        losses = []
        for step in range(steps_per_call):
            index = indices[step : step + 1]
            gradients, loss = gradient_and_loss(
                current, buffers, x_train.index_select(0, index), y_train.index_select(0, index)
            )
            if momentum:
                velocity = [beta * v + g for v, g in zip(velocity, gradients)]
                current = [w - lr * v for w, v in zip(current, velocity)]
            else:
                current = [w - lr * g for w, g in zip(current, gradients)]
            losses.append(loss)
        for target, value in zip(parameters, current):
            target.copy_(value)
        if momentum:
            for target, value in zip(velocities, velocity):
                target.copy_(value)
        return torch.stack(losses)

    return steps


class CompiledSteps:
    """``K`` compiled single-sample SGD steps per call for one architecture.

    Get one with :func:`compiled_steps`, which shares it between models of the same
    architecture.

    Parameters
    ----------
    model : torch.nn.Module
        A model of the architecture (its structure is copied, not its tensors).
    steps_per_call : int
        Steps ``K`` per call.
    momentum : bool
        Whether calls take momentum buffers (see :func:`unrolled_sgd_steps`).
    """

    def __init__(self, model: nn.Module, steps_per_call: int, momentum: bool) -> None:
        self.template = copy.deepcopy(model)
        self.steps_per_call = steps_per_call
        self.momentum = momentum
        parameter_names = [name for name, _ in model.named_parameters()]
        buffer_names = [name for name, _ in model.named_buffers()]
        function = unrolled_sgd_steps(
            self.template, parameter_names, buffer_names, steps_per_call, momentum
        )
        self.function = torch.compile(function, backend=BACKEND, fullgraph=True, dynamic=False)

    def __call__(
        self,
        parameters: list[torch.Tensor],
        buffers: list[torch.Tensor],
        velocities: list[torch.Tensor],
        x_train: torch.Tensor,
        y_train: torch.Tensor,
        indices: torch.Tensor,
        lr: torch.Tensor,
        beta: torch.Tensor,
    ) -> torch.Tensor:
        """Make ``K`` steps in place on detached ``parameters`` (and ``velocities``)."""
        with torch.no_grad():
            return self.function(
                parameters, buffers, velocities, x_train, y_train, indices, lr, beta
            )


_SHARED: dict[tuple, CompiledSteps] = {}


def compiled_steps(model: nn.Module, steps_per_call: int, momentum: bool) -> CompiledSteps:
    """The process's compiled steps for ``model``'s architecture (built on first use)."""
    key = architecture_key(model, steps_per_call, momentum)
    if key not in _SHARED:
        _SHARED[key] = CompiledSteps(model, steps_per_call, momentum)
    return _SHARED[key]
