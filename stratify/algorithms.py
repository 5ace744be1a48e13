"""Every available method, by name; strategies are imported only when used."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from stratify.errors import ConfigError
from stratify.router import Strategy

# name -> "module:Class"
ALGORITHMS: dict[str, str] = {
    "stratify": "stratify.strategy:Stratify",
    "fedavg": "baselines.fedavg:FedAvg",
    "fedprox": "baselines.fedprox:FedProx",
    "scaffold": "baselines.scaffold:Scaffold",
    "fedavgm": "baselines.fedavgm:FedAvgM",
    "sfl": "baselines.sfl:SFL",
    "fedtan": "baselines.fedtan:FedTAN",
}


def strategy_class(name: str) -> type[Strategy]:
    """The strategy class registered as ``name``."""
    if name not in ALGORITHMS:
        raise ConfigError(
            f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)} "
            "(`stratify algorithms` describes them)"
        )
    module_name, class_name = ALGORITHMS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def strategy_options(name: str) -> dict[str, Any]:
    """Constructor options of ``name`` with their defaults."""
    signature = inspect.signature(strategy_class(name).__init__)
    return {
        parameter.name: parameter.default
        for parameter in signature.parameters.values()
        if parameter.name != "self"
    }


def option_flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def build_strategy(name: str, options: dict[str, Any]) -> Strategy:
    """Instantiate ``name`` with ``options``, rejecting options it does not take.

    Parameters
    ----------
    name : str
        Registered algorithm name.
    options : dict
        Option name (constructor argument) -> value; ``None`` values mean "not given".
    """
    accepted = strategy_options(name)
    given = {key: value for key, value in options.items() if value is not None}
    foreign = sorted(key for key in given if key not in accepted)
    if foreign:
        flags = ", ".join(option_flag(key) for key in foreign)
        raise ConfigError(f"{flags} does not apply to --algorithm {name}; remove it")
    return strategy_class(name)(**given)
