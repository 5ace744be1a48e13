"""A torch module as a stream's :class:`~stratify.stream.model.StreamModel`: a given
model, another ``--model``, a model on a GPU, or one a policy that trains torch models
needs (docs/streaming.md, "The model").

Its classifier grows through :mod:`.classifier`. A torch MLP of float32 CPU tensors
still predicts and steps in NumPy, through views of its weights
(:class:`~stratify.stream.step.MLPArrays`): a batch-of-one step of torch's eager
autograd costs tens of dispatcher calls. torch is imported when a model is built, so
that importing this module does not load it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from stratify.errors import ConfigError
from stratify.stream.classifier import (
    classifier_head,
    head_input,
    imprint_row,
    row_generator,
    widen_classifier,
    widen_input,
)
from stratify.stream.config import StreamConfig, check_model_memory
from stratify.stream.numpy_model import arrays_finite, softmax_of
from stratify.stream.step import MLPArrays, copy_of

if TYPE_CHECKING:
    import torch
    from torch import nn

    from stratify.stream.buffers import ClientBuffers
    from stratify.stream.features import StreamFeatures
    from stratify.stream.step import SingleSampleStep


class TorchStreamModel:
    """A torch module with a linear ``head`` as a stream's model.

    Parameters
    ----------
    network : torch.nn.Module
        The model, on ``device`` (trained in place); its ``head`` an ``nn.Linear``.
    device : str
        Where it lives.
    features : StreamFeatures
        The standardisation of raw samples.
    """

    def __init__(self, network: nn.Module, device: str, features: StreamFeatures) -> None:
        from torch import nn

        from stratify.nn.norm import has_batch_norm

        if has_batch_norm(network):
            raise ConfigError(
                f"{type(network).__name__} normalises with batch statistics, which one "
                "sample cannot give; use --norm gn (or none)"
            )
        classifier_head(network)  # refuses a model whose classifier cannot grow
        self.network = network
        self.device = device
        self.features = features
        # switching a model between train and eval mode walks all its modules: on a small
        # model that costs as much as the prediction, so it is done only where it matters
        mode_dependent = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._NormBase)
        self.mode_matters = any(isinstance(module, mode_dependent) for module in network.modules())
        self.follow()

    @classmethod
    def build(
        cls,
        config: StreamConfig,
        given: object,
        device: str,
        input_shape: tuple[int, ...],
        rows: int,
        features: StreamFeatures,
    ) -> TorchStreamModel:
        """``given`` (or ``config.model`` of ``rows`` rows, seeded) on ``device``, with
        torch's CPU settings for single-sample steps."""
        import torch

        from stratify.backend import configure_cpu_for_single_sample
        from stratify.nn.models import build_model

        if device == "cpu":
            configure_cpu_for_single_sample()
        if given is None:
            check_model_memory(config, input_shape, rows)
            torch.manual_seed(config.seed)
            given = build_model(
                config.model, input_shape, rows, norm=config.norm, hidden=config.mlp_hidden
            )
        assert isinstance(given, torch.nn.Module)
        return cls(given.to(device), device, features)

    def follow(self) -> None:
        """Take the model's parameters now (after it was built or grew): walking its
        modules for them every event would cost as much as a small model's step."""
        #: NumPy views of a CPU MLP's weights (``None``: it predicts with torch)
        self.arrays = MLPArrays.of(self.network)
        self.weights = [parameter.detach() for parameter in self.network.parameters()]

    @property
    def rows(self) -> int:
        """Rows of the classifier."""
        return classifier_head(self.network).out_features

    @property
    def is_mlp(self) -> bool:
        """Whether it is a :class:`stratify.nn.models.MLP`."""
        from stratify.nn.models import MLP

        return isinstance(self.network, MLP)

    def as_tensor(self, raw: Any) -> torch.Tensor:
        """A raw sample as a tensor on the device."""
        import torch

        return torch.as_tensor(raw).to(self.device)

    def probabilities(self, raw: Any, known: Sequence[int]) -> np.ndarray:
        """The softmax over rows ``known`` for one raw sample."""
        if self.arrays is not None:
            return softmax_of(self.arrays, self.features.array(raw).reshape(-1), known)
        import torch

        with torch.no_grad():
            x = self.features.tensor(self.as_tensor(raw))
            if self.mode_matters:
                self.network.eval()
            output = self.network(x.unsqueeze(0))[0, known]
            if self.mode_matters:
                self.network.train()
            return torch.softmax(output.float(), dim=0).cpu().numpy()

    def predict_rows(self, batch: np.ndarray, known: Sequence[int]) -> np.ndarray:
        """The position in ``known`` of the highest logit of every raw sample."""
        import torch

        self.network.eval()
        with torch.no_grad():
            x = self.features.tensor(torch.from_numpy(batch).to(self.device))
            predicted = self.network(x)[:, known].argmax(dim=1).cpu().numpy()
        self.network.train()
        return predicted

    def learn(self, step: SingleSampleStep, buffers: ClientBuffers, slot: int) -> Any:
        """One step on the sample buffered in ``slot``: in NumPy where ``step`` has the
        MLP's arrays and the buffers are on CPU, else with autograd."""
        if step.arrays is not None and buffers.x_array is not None:
            x = self.features.array(buffers.x_array[slot]).reshape(-1)
            return step.step_array(x, buffers.target(slot))
        return step.step(self.features.tensor(buffers.x[slot : slot + 1]), buffers.target(slot))

    def widen_classifier(self, rows: int, seed: int) -> dict[int, Any]:
        """:func:`~stratify.stream.classifier.widen_classifier`."""
        replaced = widen_classifier(self.network, rows, seed)
        self.follow()
        return replaced

    def widen_input(self, features: int) -> dict[int, Any]:
        """:func:`~stratify.stream.classifier.widen_input` (an MLP's only)."""
        from stratify.nn.models import MLP

        assert isinstance(self.network, MLP)
        replaced = widen_input(self.network, features)
        self.follow()
        return replaced

    def redraw_row(self, row: int, seed: int) -> None:
        """Draw row ``row`` again from ``row_generator(seed, row)`` (uniform in
        ``±1/sqrt(width)``, as :func:`~stratify.stream.classifier.widen_head` does)."""
        import torch

        head = classifier_head(self.network)
        width = head.in_features
        bound = 1.0 / math.sqrt(width)
        values = torch.empty(width + 1).uniform_(-bound, bound, generator=row_generator(seed, row))
        with torch.no_grad():
            head.weight[row] = values[:width].to(head.weight)
            if head.bias is not None:
                head.bias[row] = values[width].to(head.bias)

    def imprint(self, row: int, raw: Any, known: Sequence[int]) -> None:
        """Imprint row ``row`` from the sample as training sees it."""
        x = self.features.tensor(self.as_tensor(raw))
        embedding = head_input(self.network, x.unsqueeze(0))[0]
        imprint_row(classifier_head(self.network), row, embedding, known)

    def save_weights(self) -> list[Any]:
        """A copy of every parameter."""
        return [copy_of(weight) for weight in self.weights]

    def restore_weights(self, saved: list[Any]) -> None:
        """Put the parameters back, in place."""
        for weight, value in zip(self.weights, saved):
            weight[...] = value

    def finite(self, losses: list[Any]) -> bool:
        """Whether every weight and ``losses`` are finite, in one device sync (in NumPy
        for a CPU MLP whose steps left no loss on the device)."""
        if self.arrays is not None and not losses:
            return arrays_finite(self.arrays)
        import torch

        total = torch.stack(torch._foreach_norm(self.weights)).sum()
        if losses:
            total = total + torch.stack(losses).sum()
        return math.isfinite(float(total))

    def state_dict(self) -> dict[str, np.ndarray]:
        """The weights as NumPy arrays under their ``state_dict`` names."""
        return {
            name: value.detach().cpu().numpy() for name, value in self.network.state_dict().items()
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load :meth:`state_dict`'s weights."""
        import torch

        self.network.load_state_dict(
            {name: torch.as_tensor(np.asarray(value)) for name, value in state.items()}
        )
