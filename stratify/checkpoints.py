"""The schema of a training checkpoint, checked before anything in it is applied.

A checkpoint is read with ``torch.load(weights_only=True)``, so it holds only tensors,
numbers, strings and containers; this module checks that those are the ones a run of
this configuration writes: every field's type, every tensor's dtype, layout (dense only)
and shape against the model and the method state built for the run, the epoch records
field by field, and the random-generator state (its size, and that torch takes it).
:func:`checkpoint_problem` names the first field that is wrong (docs/architecture.md,
"Run folder").
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch

#: the fields of a training checkpoint
FIELDS = ("epoch", "config", "model", "strategy", "torch_rng", "records")


def describe(value: object) -> str:
    """What ``value`` is, in a few words, for a refusal."""
    if isinstance(value, torch.Tensor):
        return f"a {value.layout} tensor {tuple(value.shape)} of {value.dtype}"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def tensor_problem(name: str, value: object, expected: torch.Tensor | None = None) -> str | None:
    """What is wrong with tensor ``value`` at ``name``, or ``None``.

    A tensor must be dense (strided), not quantized, and of a number dtype, and its
    floating values finite; with ``expected``, of its shape and dtype.
    """
    if not isinstance(value, torch.Tensor):
        wanted = "a tensor" if expected is None else f"a tensor {tuple(expected.shape)}"
        return f"{name} is {describe(value)}, not {wanted}"
    if value.layout != torch.strided:
        return f"{name} is a {value.layout} tensor; only dense tensors are accepted"
    if value.is_quantized or value.is_complex() or value.dtype not in NUMERIC_DTYPES:
        return f"{name} is a tensor of {value.dtype}, which no run writes"
    if expected is not None:
        if value.shape != expected.shape:
            return f"{name} is {tuple(value.shape)}, the model needs {tuple(expected.shape)}"
        if value.dtype != expected.dtype:
            return f"{name} is {value.dtype}, the model needs {expected.dtype}"
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        return f"{name} holds non-finite values"
    return None


#: the tensor types a checkpoint or a stream event may hold (numbers, not complex)
NUMERIC_DTYPES = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
)


def is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def record_problem(index: int, record: object, record_type: type) -> str | None:
    """What is wrong with epoch record ``index`` (0-based) of the checkpoint, or ``None``.

    Each field must have its dataclass's type (an int where it is an int, a number where
    it is a float, ``None`` only where the field allows it); fields added after a
    checkpoint was written may be missing (they have defaults).
    """
    name = f"records[{index}]"
    if not isinstance(record, dict):
        return f"{name} is {describe(record)}, not an epoch record"
    fields = {entry.name: entry for entry in dataclasses.fields(record_type)}
    unknown = sorted(set(map(str, record)) - set(fields))
    if unknown:
        return f"{name} has fields no epoch record has ({', '.join(unknown[:3])})"
    for key, entry in fields.items():
        if key not in record:
            if (
                entry.default is dataclasses.MISSING
                and entry.default_factory is dataclasses.MISSING
            ):
                return f"{name} lacks {key}"
            continue
        value = record[key]
        annotation = str(entry.type)
        if value is None and "None" in annotation:
            continue
        if annotation.startswith("list[int]"):
            valid = isinstance(value, list) and all(is_count(item) for item in value)
            wanted = "a list of client ids"
        elif annotation.startswith("dict"):
            valid = isinstance(value, dict) and all(isinstance(item, str) for item in value)
            wanted = "a dictionary"
        elif annotation.startswith("int"):
            valid, wanted = is_count(value), "a count"
        else:
            valid, wanted = is_number(value), "a number"
        if not valid:
            return f"{name}.{key} is {value!r:.40}, not {wanted}"
    if record["epoch"] != index + 1:
        return f"{name}.epoch is {record['epoch']}, not {index + 1}"
    return None


def rng_problem(state: object) -> str | None:
    """What is wrong with a saved ``torch.get_rng_state()``, or ``None``: its type, dtype
    and size, then whether torch takes it (a zeroed state is refused by torch)."""
    reference = torch.get_rng_state()
    problem = tensor_problem("torch_rng", state)
    if problem is not None:
        return problem
    assert isinstance(state, torch.Tensor)  # tensor_problem refused anything else
    if state.dtype != reference.dtype or state.shape != reference.shape:
        return (
            f"torch_rng is {describe(state)}, not the {reference.numel()} bytes of torch's "
            "generator state"
        )
    try:
        torch.Generator().set_state(state)
    except RuntimeError as error:
        return f"torch_rng is not a state of torch's generator ({str(error).splitlines()[0]})"
    return None


def state_problem(
    name: str,
    saved: object,
    reference: object,
    model_state: Mapping[str, torch.Tensor],
    parameters: Sequence[torch.Tensor],
) -> str | None:
    """What is wrong with the method state ``saved`` at ``name``, compared with the
    ``reference`` state a freshly built method has, or ``None``.

    Where the reference has a tensor, the saved value must be one of its shape and dtype;
    where it has a container, one of the same kind, compared entry by entry (entries the
    reference lacks, e.g. per-client state made during training, are checked on their
    own); a dictionary keyed by model tensor names must match the model's tensors, and an
    optimizer's state over the model's parameters must match their shapes.
    """
    if isinstance(saved, torch.Tensor) or isinstance(reference, torch.Tensor):
        expected = reference if isinstance(reference, torch.Tensor) else None
        problem = tensor_problem(name, saved, expected)
        if problem is not None and expected is not None:
            problem = problem.replace("the model needs", "the method needs")
        return problem
    if isinstance(saved, dict):
        if reference is not None and not isinstance(reference, dict):
            return f"{name} is {describe(saved)}, not {describe(reference)}"
        reference_items = reference if isinstance(reference, dict) else {}
        keyed_by_model = bool(saved) and all(
            isinstance(key, str) and key in model_state for key in saved
        )
        for key, value in saved.items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                return f"{name} has a key {key!r:.40}, not a name or a number"
            child = f"{name}.{key}"
            if keyed_by_model:
                problem = tensor_problem(child, value, model_state[str(key)])
            else:
                problem = state_problem(
                    child, value, reference_items.get(key), model_state, parameters
                )
            if problem is not None:
                return problem
        return optimizer_problem(name, saved, reference_items, parameters)
    if isinstance(saved, (list, tuple)):
        if reference is not None and not isinstance(reference, (list, tuple)):
            return f"{name} is {describe(saved)}, not {describe(reference)}"
        references: Sequence[object] = reference if isinstance(reference, (list, tuple)) else ()
        if references and len(references) != len(saved):
            return f"{name} has {len(saved)} entries, the method has {len(references)}"
        for index, value in enumerate(saved):
            counterpart = references[index] if references else None
            problem = state_problem(f"{name}[{index}]", value, counterpart, model_state, parameters)
            if problem is not None:
                return problem
        return None
    if saved is None or isinstance(saved, (str, bool)):
        if reference is not None and type(saved) is not type(reference):
            return f"{name} is {saved!r:.40}, not {describe(reference)}"
        return None
    if is_number(saved):
        if isinstance(saved, float) and not math.isfinite(saved):
            return f"{name} is {saved!r}, not a finite number"
        if reference is not None and not is_number(reference):
            return f"{name} is {saved!r:.40}, not {describe(reference)}"
        return None
    return f"{name} is {describe(saved)}, which no method state holds"


def optimizer_problem(
    name: str,
    saved: dict,
    reference: dict,
    parameters: Sequence[torch.Tensor],
) -> str | None:
    """The shapes of an optimizer's per-parameter state (momentum buffers), where the
    method's own optimizer runs over the model's parameters."""
    groups = reference.get("param_groups")
    if set(reference) != {"state", "param_groups"} or not isinstance(groups, list):
        return None
    indices = [index for group in groups for index in group.get("params", [])]
    if len(indices) != len(parameters):
        return None  # an optimizer over something else than the model
    state = saved.get("state")
    if not isinstance(state, dict):
        return f"{name}.state is {describe(state)}, not an optimizer's state"
    for index, values in state.items():
        if not isinstance(index, int) or not 0 <= index < len(parameters):
            return f"{name}.state has an entry for parameter {index!r:.40}, which the model lacks"
        if not isinstance(values, dict):
            return f"{name}.state.{index} is {describe(values)}, not a parameter's state"
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                problem = tensor_problem(f"{name}.state.{index}.{key}", value, parameters[index])
                if problem is not None:
                    return problem
    return None


def checkpoint_problem(
    checkpoint: object,
    model_state: Mapping[str, torch.Tensor],
    parameters: Sequence[torch.Tensor],
    strategy_state: Mapping[str, Any],
    record_type: type,
) -> str | None:
    """The first field of ``checkpoint`` that does not fit the run, or ``None``.

    Parameters
    ----------
    checkpoint : object
        What ``torch.load`` returned.
    model_state : mapping
        The built model's ``state_dict()``: the tensors' names, shapes and dtypes.
    parameters : sequence of Tensor
        The built model's parameters, in order (what an optimizer's state indexes).
    strategy_state : mapping
        The freshly built method's ``state_dict()``, the reference for the saved one.
    record_type : type
        The dataclass of an epoch record.

    Returns
    -------
    str or None
        ``"FIELD …"``: the field and what is wrong with it.
    """
    if not isinstance(checkpoint, dict):
        return f"the file holds {describe(checkpoint)}, not a checkpoint"
    missing = [field for field in FIELDS if field not in checkpoint]
    if missing:
        return f"{', '.join(missing)} missing"
    unknown = sorted(str(key) for key in checkpoint if key not in FIELDS)
    if unknown:
        return f"{', '.join(unknown[:3])} is not a field of a training checkpoint"
    epoch = checkpoint["epoch"]
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
        return f"epoch is {epoch!r:.40}, not a positive integer"
    if not isinstance(checkpoint["config"], dict):
        return f"config is {describe(checkpoint['config'])}, not a configuration"
    saved = checkpoint["model"]
    if not isinstance(saved, dict):
        return f"model is {describe(saved)}, not the model's tensors"
    names = set(map(str, saved))
    if names != set(model_state) or len(saved) != len(model_state):
        extra = sorted(names - set(model_state))
        lacking = sorted(set(model_state) - names)
        detail = f"lacks {lacking[0]}" if lacking else f"has {extra[0]}, which the model lacks"
        return f"model {detail}"
    for key, tensor in model_state.items():
        problem = tensor_problem(f"model.{key}", saved[key], tensor)
        if problem is not None:
            return problem
    problem = rng_problem(checkpoint["torch_rng"])
    if problem is not None:
        return problem
    records = checkpoint["records"]
    if not isinstance(records, list):
        return f"records is {describe(records)}, not a list of epoch records"
    if len(records) != epoch:
        return f"records holds {len(records)} epochs, the checkpoint's epoch is {epoch}"
    for index, record in enumerate(records):
        problem = record_problem(index, record, record_type)
        if problem is not None:
            return problem
    strategy = checkpoint["strategy"]
    if not isinstance(strategy, dict):
        return f"strategy is {describe(strategy)}, not a method state"
    return state_problem("strategy", strategy, dict(strategy_state), model_state, parameters)
