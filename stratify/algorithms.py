"""Every available method, by name; strategies are imported only when used."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from stratify.errors import ConfigError
from stratify.method import Strategy
from stratify.validation import check_choice

# name -> "module:Class"
ALGORITHMS: dict[str, str] = {
    "stratify": "stratify.stratify:Stratify",
    "fedavg": "stratify.baselines.fedavg:FedAvg",
    "fedprox": "stratify.baselines.fedprox:FedProx",
    "scaffold": "stratify.baselines.scaffold:Scaffold",
    "fedavgm": "stratify.baselines.fedavgm:FedAvgM",
    "sfl": "stratify.baselines.sfl:SFL",
    "fedtan": "stratify.baselines.fedtan:FedTAN",
    "fedbss": "stratify.baselines.fedbss:FedBSS",
    "fedbr": "stratify.baselines.fedbr:FedBR",
    "feddiverse": "stratify.baselines.feddiverse:FedDiverse",
    "lfd": "stratify.baselines.lfd:LfD",
}


def check_algorithm(value: object, flag: str) -> str:
    """``value`` as the name of a registered method.

    The registry is read when the value is checked, not when a configuration class is
    defined, so a method registered at run time (``ALGORITHMS["fedtrim"] =
    "mypackage.fedtrim:FedTrim"``, as :mod:`stratify.testing`'s tests do) is accepted.
    """
    return check_choice(value, flag, tuple(ALGORITHMS))


def strategy_class(name: str) -> type[Strategy]:
    """The strategy class registered as ``name``."""
    if name not in ALGORITHMS:
        raise ConfigError(
            f"unknown --algorithm {name!r}; choose one of {', '.join(ALGORITHMS)} "
            "(`stratify methods` describes them)"
        )
    module_name, class_name = ALGORITHMS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)


def method_label(name: str) -> str:
    """How the papers write the method ``name`` (its class's ``label``); ``name`` itself
    for a method not in this build, so a table of old results still shows it.

    Parameters
    ----------
    name : str
        A method's registered name.
    """
    return strategy_class(name).card.label if name in ALGORITHMS else name


def build_strategy(name: str, values: Mapping[str, Any], mode: str) -> Strategy:
    """Instantiate ``name`` from user-given option ``values`` for ``mode``.

    Parameters
    ----------
    name : str
        Registered algorithm name.
    values : mapping
        Option name (field of the method's options dataclass) -> value; ``None`` means
        "not given". Options the method does not take, or that do not apply to ``mode``,
        are refused with one line naming the valid ones.
    mode : {"single-sample", "batch"}
        Learning setting.
    """
    cls = strategy_class(name)
    if mode not in cls.card.identity.modes:
        raise ConfigError(
            f"--algorithm {name} runs in --mode {' or '.join(cls.card.identity.modes)}, not {mode}"
        )
    return cls(cls.options_class.from_values(values, name, mode))
