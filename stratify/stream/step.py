"""The stream's single-sample SGD step, lean enough that an event costs what its model
costs (docs/architecture.md, "Streaming").

:class:`SingleSampleStep` is plain SGD with momentum over a model's parameters, as
``torch.optim.SGD`` computes it (``v ← μ·v + g``, ``w ← w − lr·v``; ``v`` starts as the
first gradient), without ``torch.optim``: creating a torch optimizer imports
``torch._dynamo`` (seconds of start-up and hundreds of MB), and its per-step bookkeeping
costs more than a small model's step.

For an MLP on CPU (the default model of a stream: :class:`~stratify.stream.mlp.NumpyMLP`,
or a torch :class:`~stratify.nn.models.MLP` through views of its parameters), forward,
backward and the update are written out in NumPy (:class:`MLPArrays`,
:meth:`SingleSampleStep.step_array`): a batch-of-one step of torch's eager autograd costs
tens of dispatcher calls of a few microseconds each, while the arithmetic of a 200-200 MLP
on one sample takes about as long as one of them. Any other model, or any model on a GPU,
steps with ``torch.autograd.grad`` and fused ``_foreach`` updates. This module imports
torch only for such models.
"""

from __future__ import annotations

import math
import secrets
from typing import TYPE_CHECKING, Any

import numpy as np

from stratify.stream.blas import RankOne
from stratify.stream.events import as_numpy

if TYPE_CHECKING:
    import torch
    from torch import nn


#: the BLAS updates of every step (NumPy's own OpenBLAS, found once at import)
RANK_ONE = RankOne()


#: a diverging model overflows silently, as torch does: the learner's divergence check
#: reports it (docs/architecture.md, "Streaming")
def quiet() -> np.errstate:
    """NumPy's overflow warnings off, for a block."""
    return np.errstate(over="ignore", invalid="ignore")


class MLPArrays:
    """An MLP's weights as NumPy arrays: its forward pass and single-sample gradients.

    Parameters
    ----------
    weights, biases : list of numpy.ndarray
        Per layer (the head last), float32: a ``(out, in)`` weight and an ``(out,)`` bias.
        They may be views of a torch MLP's parameters (:meth:`of`): an update through
        them is then an update of the model, and a change of the model
        (``load_state_dict``, an optimizer) is seen here; a replaced parameter (a grown
        classifier) needs a new :class:`MLPArrays`.
    parameters : list, optional
        What the arrays are views of (a torch model's parameters, in :attr:`arrays`
        order); default: the arrays themselves.
    """

    def __init__(
        self,
        weights: list[np.ndarray],
        biases: list[np.ndarray],
        parameters: list[Any] | None = None,
    ) -> None:
        self.weights = weights
        self.biases = biases
        #: every array in parameter order (weight, bias of each layer)
        self.arrays = [a for pair in zip(self.weights, self.biases) for a in pair]
        #: what the arrays are (views of): a step's velocity follows them
        #: (:meth:`SingleSampleStep.follow`)
        self.sources: list[Any] = self.arrays if parameters is None else parameters
        if any(a.dtype != np.float32 or not a.flags.c_contiguous for a in self.arrays):
            # the BLAS updates of SingleSampleStep write through the arrays' memory
            raise ValueError("an MLP's arrays must be C-contiguous float32")
        #: :attr:`arrays` flattened (views of the same memory), for the learner's check
        #: that every weight is finite
        self.flat = [a.reshape(-1) for a in self.arrays]

    @classmethod
    def of(cls, model: object) -> MLPArrays | None:
        """``model`` itself if it is one, views of a torch MLP of float32 CPU tensors
        with biases, else ``None`` (it steps with autograd)."""
        if isinstance(model, MLPArrays):
            return model
        import torch
        from torch import nn

        from stratify.nn.models import MLP

        if type(model) is not MLP:
            return None
        parameters = list(model.parameters())
        if any(
            p.device.type != "cpu" or p.dtype != torch.float32 or not p.is_contiguous()
            for p in parameters
        ):
            return None
        linears = [layer for layer in model.layers if isinstance(layer, nn.Linear)]
        linears.append(model.head)
        if any(layer.bias is None for layer in linears):
            return None
        return cls(
            [layer.weight.detach().numpy() for layer in linears],
            [layer.bias.detach().numpy() for layer in linears],
            [p for layer in linears for p in (layer.weight, layer.bias)],
        )

    def activations(self, x: np.ndarray) -> list[np.ndarray]:
        """Every layer's input for one flattened sample, and the logits last (call under
        :func:`quiet`)."""
        values = [x]
        last = len(self.weights) - 1
        for index, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            out = weight @ values[-1] + bias
            if index < last:
                np.maximum(out, 0.0, out=out)
            values.append(out)
        return values

    def backward(
        self, x: np.ndarray, target: int
    ) -> tuple[float, list[tuple[np.ndarray, np.ndarray]]]:
        """The cross-entropy loss of one sample and its gradient as factors: per layer,
        ``(delta, input)``, whose outer product is the weight's gradient and ``delta``
        the bias's (call under :func:`quiet`); :meth:`SingleSampleStep.step_array` adds
        the products straight into the weights (or the velocity)."""
        values = self.activations(x)
        logits = values[-1]
        top = float(logits.max())
        exp = np.exp(logits - top)
        total = float(exp.sum())
        loss = math.log(total) + top - float(logits[target])
        delta = exp / total
        delta[target] -= 1.0
        factors: list[tuple[np.ndarray, np.ndarray]] = []
        for index in range(len(self.weights) - 1, -1, -1):
            factors.append((delta, values[index]))
            if index:
                delta = self.weights[index].T @ delta
                delta *= values[index] > 0  # ReLU's gradient: 0 where it cut
        factors.reverse()
        return loss, factors


class SingleSampleStep:
    """SGD with momentum over ``model``'s parameters, one sample per step.

    Parameters
    ----------
    model : NumpyMLP or torch.nn.Module
        Trained in place.
    lr : float
        Learning rate.
    momentum : float
        Momentum ``μ`` (0: plain SGD, no velocity kept).
    clip : float, optional
        Differential privacy (docs/architecture.md, "Differential privacy"): every step's
        gradient is clipped to this L2 norm ``C`` and ``N(0, σ²C²)`` noise is added to
        it before the update. ``None`` (the default): plain steps.
    noise_multiplier : float
        ``σ`` of the noise (with ``clip``).
    seed : int, optional
        Seeds the noise; ``None``: a seed from the operating system's entropy. A given
        seed's generators are in :meth:`state_dict`, so a resumed stream draws the noise
        an uninterrupted one would; an entropy seed's are not, so a resumed stream draws
        fresh noise, never noise already used (docs/architecture.md, "Differential
        privacy").
    """

    def __init__(
        self,
        model: MLPArrays | nn.Module,
        lr: float,
        momentum: float,
        clip: float | None = None,
        noise_multiplier: float = 0.0,
        seed: int | None = None,
    ) -> None:
        self.lr = lr
        self.momentum = momentum
        self.clip = clip
        self.noise_multiplier = noise_multiplier
        self.noise_seed = secrets.randbits(62) if seed is None else int(seed)
        self.seeded = seed is not None
        #: the NumPy path's noise (the torch path makes its generator on first use)
        self.noise = np.random.default_rng(self.noise_seed)
        self.torch_noise: Any = None
        self.arrays: MLPArrays | None = None
        self.velocity = None
        self.follow(model)

    @property
    def velocity(self) -> list[Any] | None:
        """One array (NumPy model) or tensor per parameter once a step was taken (with
        momentum), else ``None``."""
        return self._velocity

    @velocity.setter
    def velocity(self, value: list[Any] | None) -> None:
        self._velocity = value
        #: NumPy views of the velocity, for :meth:`step_array`
        self.velocity_arrays = (
            [v if isinstance(v, np.ndarray) else v.numpy() for v in value]
            if value is not None and self.arrays is not None
            else []
        )

    def follow(self, model: MLPArrays | nn.Module, replaced: dict[int, Any] | None = None) -> None:
        """Step ``model``'s parameters now, carrying every velocity over; a replaced
        parameter's (``replaced``: ``id`` of the old one → the new one) is padded with
        zeros for its new rows or columns."""
        old = getattr(self, "parameters", [])
        self.model = model
        self.arrays = MLPArrays.of(model)
        self.parameters: list[Any] = (
            self.arrays.sources
            if self.arrays is not None
            else [p for p in model.parameters() if p.requires_grad]  # type: ignore[union-attr]
        )
        if self.velocity is None or not old:
            return
        carried = {
            id(replaced.get(id(p), p) if replaced else p): v for p, v in zip(old, self.velocity)
        }
        velocity = []
        for parameter in self.parameters:
            value = carried.get(id(parameter))
            if value is None:
                value = zeros_like(parameter)
            elif value.shape != parameter.shape:  # grown rows or columns: zeros there
                padded = zeros_like(parameter)
                padded[tuple(slice(0, size) for size in value.shape)] = value
                value = padded
            velocity.append(value)
        self.velocity = velocity

    def step(self, x: torch.Tensor, target: int) -> float | torch.Tensor:
        """One SGD step on ``x``, a batch of one sample of class row ``target``; returns
        the loss before the step (a float, or a tensor left on the device)."""
        if self.arrays is not None:
            return self.step_array(x.reshape(-1).numpy(), target)
        import torch
        import torch.nn.functional as functional

        assert not isinstance(self.model, MLPArrays)
        output = self.model(x)
        targets = torch.tensor([target], device=output.device)
        loss_tensor = functional.cross_entropy(output, targets)
        grads = list(torch.autograd.grad(loss_tensor, self.parameters))
        if self.clip is not None:
            grads = self.private_gradient(grads)
        with torch.no_grad():
            self._update(grads)
        return loss_tensor.detach()

    def private_gradient(self, gradients: list[torch.Tensor]) -> list[torch.Tensor]:
        """One sample's gradient clipped to ``C`` and noised, on the torch path."""
        import torch

        from stratify.privacy.dp import add_noise, clip_gradient

        assert self.clip is not None
        if self.torch_noise is None:
            self.torch_noise = torch.Generator(device=gradients[0].device)
            self.torch_noise.manual_seed(self.noise_seed)
        clipped = clip_gradient(gradients, self.clip)
        return add_noise(clipped, self.noise_multiplier, self.clip, self.torch_noise)

    def private_step_array(self, x: np.ndarray, target: int) -> float:
        """:meth:`step_array` with DP: the gradient's norm from its factors
        (``‖δ xᵀ‖² + ‖δ‖² = ‖δ‖²(‖x‖² + 1)`` per layer), clipped to ``C`` and noised
        with ``N(0, σ²C²)`` on every weight and bias, then the SGD update."""
        arrays = self.arrays
        assert arrays is not None and self.clip is not None
        with quiet():
            loss, factors = arrays.backward(x, target)
            norm = math.sqrt(
                sum(
                    float(delta @ delta) * (float(inputs @ inputs) + 1.0)
                    for delta, inputs in factors
                )
            )
            factor = min(1.0, self.clip / (norm + 1e-12))
            scale = self.noise_multiplier * self.clip
            gradients: list[np.ndarray] = []
            for delta, inputs in factors:
                for exact in (np.outer(delta, inputs), delta):
                    noise = self.noise.standard_normal(exact.shape, dtype=np.float32)
                    gradients.append((factor * exact + scale * noise).astype(np.float32))
            self._update_arrays(gradients)
        return loss

    def _update_arrays(self, gradients: list[np.ndarray]) -> None:
        """The SGD update of the NumPy path from explicit gradients (parameter order)."""
        assert self.arrays is not None
        if self.momentum == 0:
            for array, gradient in zip(self.arrays.arrays, gradients):
                array -= self.lr * gradient
            return
        if self.velocity is None:
            self.velocity = [zeros_like(p) for p in self.parameters]
            for velocity, gradient in zip(self.velocity_arrays, gradients):
                velocity[...] = gradient  # torch's first velocity is the gradient itself
        else:
            for velocity, gradient in zip(self.velocity_arrays, gradients):
                velocity *= self.momentum
                velocity += gradient
        for array, velocity in zip(self.arrays.arrays, self.velocity_arrays):
            array -= self.lr * velocity

    def step_array(self, x: np.ndarray, target: int) -> float:
        """One SGD step of an MLP on CPU (:attr:`arrays` set) on the flat sample ``x``,
        in NumPy and BLAS over the model's own memory; returns the loss before the step.

        A weight's gradient is never built apart: it is a rank-1 update (BLAS ``sger``,
        :class:`~stratify.stream.blas.RankOne`) of the weight, or of its velocity, in
        place."""
        if self.clip is not None:
            return self.private_step_array(x, target)
        arrays = self.arrays
        assert arrays is not None
        lr, momentum = self.lr, self.momentum
        with quiet():
            loss, factors = arrays.backward(x, target)
            if momentum == 0:
                for layer, (delta, inputs) in enumerate(factors):
                    RANK_ONE.add_outer(arrays.weights[layer], -lr, delta, inputs)
                    arrays.biases[layer] -= lr * delta
                return loss
            if self.velocity is None:
                self.velocity = [zeros_like(p) for p in self.parameters]
                momentum = 0.0  # torch's first velocity is the gradient itself
            velocity = self.velocity_arrays
            for layer, (delta, inputs) in enumerate(factors):
                weight_velocity, bias_velocity = velocity[2 * layer], velocity[2 * layer + 1]
                weight_velocity *= momentum
                RANK_ONE.add_outer(weight_velocity, 1.0, delta, inputs)
                bias_velocity *= momentum
                bias_velocity += delta
                RANK_ONE.add_scaled(arrays.weights[layer], -lr, weight_velocity)
                arrays.biases[layer] -= lr * bias_velocity
        return loss

    def _update(self, gradients: list[torch.Tensor]) -> None:
        import torch

        with torch.no_grad():
            if self.momentum == 0:
                torch._foreach_add_(self.parameters, gradients, alpha=-self.lr)
                return
            if self.velocity is None:
                self.velocity = [g.clone() for g in gradients]
            else:
                torch._foreach_mul_(self.velocity, self.momentum)
                torch._foreach_add_(self.velocity, gradients)
            torch._foreach_add_(self.parameters, self.velocity, alpha=-self.lr)

    def save_point(self) -> list[Any] | None:
        """A copy of the velocity, for :meth:`restore_point`."""
        return None if self.velocity is None else [copy_of(v) for v in self.velocity]

    def restore_point(self, point: list[Any] | None) -> None:
        """Put back the velocity :meth:`save_point` copied (none: forget it)."""
        self.velocity = point

    def state_dict(self) -> dict[str, Any]:
        """The velocity in ``torch.optim.SGD``'s ``state_dict`` layout, as NumPy arrays
        under the parameters' positions written as strings (a checkpoint's keys)."""
        state = {}
        if self.velocity is not None:
            state = {
                str(index): {"momentum_buffer": as_numpy(v).copy()}
                for index, v in enumerate(self.velocity)
            }
        group = {
            "lr": self.lr,
            "momentum": self.momentum,
            "params": list(range(len(self.parameters))),
        }
        saved: dict[str, Any] = {"state": state, "param_groups": [group]}
        if self.clip is not None and self.seeded:
            saved["noise"] = self.noise_state()
        return saved

    def noise_state(self) -> dict[str, Any]:
        """Where a given seed's noise generators are: the seed, the NumPy generator's
        state and, once the torch path drew, the torch generator's (bytes as an array)."""
        state: dict[str, Any] = {"seed": self.noise_seed, "numpy": self.noise.bit_generator.state}
        if self.torch_noise is not None:
            state["torch"] = self.torch_noise.get_state().numpy().copy()
        return state

    def load_noise_state(self, state: dict[str, Any]) -> None:
        """Put back :meth:`noise_state`: the next draws are those that would have come."""
        if int(state["seed"]) != self.noise_seed:
            raise ValueError("a noise state of another --dp-seed")
        self.noise.bit_generator.state = state["numpy"]
        self.torch_noise = None
        if "torch" in state:
            import torch

            self.torch_noise = torch.Generator(device=self.parameters[0].device)
            self.torch_noise.set_state(torch.as_tensor(np.asarray(state["torch"], np.uint8)))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (or an SGD optimizer's) over the same parameters."""
        buffers = [entry.get("momentum_buffer") for entry in state["state"].values()]
        if len(state["param_groups"][0]["params"]) != len(self.parameters):
            raise ValueError("a step state over other parameters")
        if "noise" in state and self.clip is not None and self.seeded:
            self.load_noise_state(state["noise"])
        if not buffers or any(b is None for b in buffers):
            self.velocity = None
            return
        if len(buffers) != len(self.parameters):
            raise ValueError("a velocity for some parameters only")
        for value, parameter in zip(buffers, self.parameters):
            if tuple(value.shape) != tuple(parameter.shape):
                raise ValueError(f"a velocity of shape {tuple(value.shape)} does not fit")
        self.velocity = [
            like(value, parameter) for value, parameter in zip(buffers, self.parameters)
        ]


def copy_of(value: Any) -> Any:
    """A copy of an array or a tensor (of the same kind)."""
    return value.copy() if isinstance(value, np.ndarray) else value.clone()


def zeros_like(parameter: Any) -> Any:
    """Zeros of ``parameter``'s shape and kind (NumPy array, or tensor on its device)."""
    if isinstance(parameter, np.ndarray):
        return np.zeros_like(parameter)
    import torch

    return torch.zeros_like(parameter)


def like(value: Any, parameter: Any) -> Any:
    """A copy of ``value`` (an array or a tensor) as ``parameter`` is: a float32 NumPy
    array, or a tensor of its device and dtype."""
    if isinstance(parameter, np.ndarray):
        return np.array(as_numpy(value), dtype=parameter.dtype)
    import torch

    return torch.as_tensor(as_numpy(value)).to(parameter.device, parameter.dtype).clone()
