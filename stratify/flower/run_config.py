"""The deployed app's run as run-configuration keys, one key per setting, as Flower users
set them (``flwr run . --run-config "epochs=3 lr=0.05"``; docs/flower.md, "Run
configuration").

Every :class:`~stratify.config.TrainConfig` field is a key named as its ``stratify train``
flag (``lr-schedule``, ``dp-epsilon``); a method's option is ``METHOD.OPTION``
(``stratify.batch-labels``, ``fedavg.local-epochs``): only the chosen method's apply, so
switching ``algorithm`` keeps each method's own; ``dataset-options`` is the loader's
``-o KEY=VALUE`` pairs, space-separated. Flower accepts an override only for a key the
app's ``pyproject.toml`` declares, and TOML has no null, so that file declares every key
and the text ``"default"`` means the setting's default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from stratify.algorithms import strategy_class
from stratify.config import TrainConfig
from stratify.errors import ConfigError, DatasetError, PartitionError
from stratify.flower.messages import flower_methods

#: the value of a key left at the setting's default (the app's pyproject declares every key)
DEFAULT = "default"
#: TrainConfig fields that are no key: the method's and the loader's options have keys of
#: their own, and the server app's files go to ``result-dir``
NOT_KEYS = ("options", "dataset_options", "out")
#: the key of the loader's options (``-o KEY=VALUE`` pairs, space-separated)
DATASET_OPTIONS = "dataset-options"


def key_of(name: str) -> str:
    """The run-configuration key of a field: its flag's name (``lr_schedule`` ->
    ``lr-schedule``)."""
    return name.replace("_", "-")


#: run-configuration key -> TrainConfig field
TRAIN_KEYS: dict[str, str] = {
    key_of(field.name): field.name
    for field in dataclasses.fields(TrainConfig)
    if field.name not in NOT_KEYS
}


def option_keys() -> dict[str, tuple[str, str]]:
    """Every method option's key, ``METHOD.OPTION`` -> (method, option field), for the
    methods that run over Flower."""
    return {
        f"{method}.{key_of(field.name)}": (method, field.name)
        for method in flower_methods()
        for field in strategy_class(method).options_class.option_fields()
    }


def train_keys() -> tuple[str, ...]:
    """Every key of the run's settings, in the order the app's pyproject lists them."""
    return (*TRAIN_KEYS, DATASET_OPTIONS, *option_keys())


def _hidden_widths(value: Any) -> tuple[int, ...]:
    """``mlp-hidden``: the widths as text, ``"256,128"`` (TOML's run-config values are
    scalars), or one width as a number."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if not isinstance(value, str):
        raise ConfigError(f'mlp-hidden must be widths such as "256,128", got {value!r}')
    try:
        return tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f'mlp-hidden must be widths such as "256,128", got {value!r}') from None


def _dataset_options(value: Any) -> dict[str, str]:
    """``dataset-options``: ``KEY=VALUE`` pairs separated by spaces, as text; the loader
    converts and checks each value as it does the command line's ``-o``."""
    if not isinstance(value, str):
        raise ConfigError(f"dataset-options must be text of KEY=VALUE pairs, got {value!r}")
    pairs: dict[str, str] = {}
    for pair in value.split():
        key, equals, text = pair.partition("=")
        if not equals or not key:
            raise ConfigError(f"dataset-options must be KEY=VALUE pairs, got {pair!r}")
        pairs[key] = text
    return pairs


def train_config_of(settings: Mapping[str, Any]) -> TrainConfig:
    """The run's :class:`~stratify.config.TrainConfig` from its keys (others ignored).

    Parameters
    ----------
    settings : mapping
        The run configuration: keys of :func:`train_keys` (an absent key, or one holding
        :data:`DEFAULT`, is the setting's default).

    Returns
    -------
    TrainConfig
        Checked as any configuration is.

    Raises
    ------
    ConfigError
        One line naming the key and the value refused.
    """
    given = {key: value for key, value in settings.items() if value != DEFAULT}
    values: dict[str, Any] = {
        field: given[key] for key, field in TRAIN_KEYS.items() if key in given
    }
    if "mlp_hidden" in values:
        values["mlp_hidden"] = _hidden_widths(values["mlp_hidden"])
    if DATASET_OPTIONS in given:
        values["dataset_options"] = _dataset_options(given[DATASET_OPTIONS])
    algorithm = values.get("algorithm", TrainConfig.algorithm)
    values["options"] = {
        option: given[key]
        for key, (method, option) in option_keys().items()
        if method == algorithm and key in given
    }
    try:
        return TrainConfig(**values)
    except TypeError as error:  # a value of a type the field's check did not expect
        raise ConfigError(f"the run configuration's settings were refused: {error}") from None
    except (DatasetError, PartitionError) as error:  # a loader's option, a split's spec
        raise ConfigError(str(error)) from None


def _value(value: Any) -> Any:
    """A setting as a run-configuration value (a TOML scalar)."""
    if value is None:
        return DEFAULT
    if isinstance(value, tuple):
        return ",".join(str(width) for width in value)
    return value


def run_config_of(config: TrainConfig) -> dict[str, Any]:
    """Every key of :func:`train_keys` for ``config`` (:data:`DEFAULT` where a setting
    is its default), so that an override leaves none of the app's own values in place.

    Parameters
    ----------
    config : TrainConfig
        The run (its ``out`` is not carried: the server app writes to ``result-dir``).
    """
    defaults = TrainConfig()
    keys: dict[str, Any] = {
        key: DEFAULT
        if getattr(config, field) == getattr(defaults, field)
        else _value(getattr(config, field))
        for key, field in TRAIN_KEYS.items()
    }
    keys[DATASET_OPTIONS] = (
        " ".join(f"{key}={value}" for key, value in config.dataset_options.items()) or DEFAULT
    )
    for key, (method, option) in option_keys().items():
        value = config.options.get(option) if method == config.algorithm else None
        keys[key] = _value(value)
    return keys


__all__ = ["DEFAULT", "TRAIN_KEYS", "option_keys", "run_config_of", "train_config_of", "train_keys"]
