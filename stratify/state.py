"""Model states as ``{name: tensor}`` dictionaries: copying, loading, which keys are which.

Aggregation math works on these dictionaries, so it can be checked against hand-computed
values without a model or a engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

State = dict[str, torch.Tensor]


def parameter_names(model: nn.Module) -> list[str]:
    """Names (state-dict keys) of the trainable parameters, in ``model.parameters()`` order."""
    return [name for name, parameter in model.named_parameters() if parameter.requires_grad]


def buffer_names(model: nn.Module) -> list[str]:
    """State-dict keys that are not trainable parameters: BN running statistics and counters."""
    trainable = set(parameter_names(model))
    return [name for name in model.state_dict() if name not in trainable]


def clone_state(
    state: Mapping[str, torch.Tensor],
    keys: Sequence[str] | None = None,
    device: torch.device | None = None,
) -> State:
    """Detached copies of ``state`` (of ``keys`` only, if given), moved to ``device`` if given."""
    keys = list(state) if keys is None else keys
    if device is None:
        return {key: state[key].detach().clone() for key in keys}
    return {key: state[key].detach().to(device, copy=True) for key in keys}


@torch.no_grad()
def load_into(model: nn.Module, values: Mapping[str, torch.Tensor]) -> None:
    """Copy ``values`` into the matching parameters/buffers of ``model`` in place."""
    state = model.state_dict()
    for key, value in values.items():
        state[key].copy_(value)
