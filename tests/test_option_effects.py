"""Every option a method accepts changes its run, or is refused (docs/architecture.md,
"Options"): an option accepted and ignored is a bug.

For every registered method in every mode it runs in (:func:`stratify.testing.method_cases`)
and every option it declares for that mode, a run with the option set to another value
than its default (:data:`OTHER_VALUES`) is compared with the default run, on the tiny
federation of :mod:`stratify.testing`. The two must differ (in the final weights, the
losses or the traffic), or the other value must be refused with a ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from stratify.data.datasets import Dataset
from stratify.errors import ConfigError
from stratify.run import Run
from stratify.testing import (
    MethodCase,
    case_config,
    fresh_process_state,
    method_cases,
    tiny_dataset,
)

#: Option -> (another value, settings the comparison needs so the option can act there).
#: The settings are run settings (``TrainConfig`` fields) or options, given to both runs:
#: e.g. weights by sample count equal equal weights on clients of equal sizes, so the
#: weighting is compared on a Dirichlet split, whose clients differ in size; and
#: ``"dataset": "unbalanced"`` (:func:`unbalanced_dataset`) runs on labels of unequal
#: counts, where Stratify's proportional repeats differ from its uniform ones.
OTHER_VALUES: dict[str, tuple[Any, dict[str, Any]]] = {
    "chunk": (1, {}),
    "batch_labels": (8, {}),
    "selection": ("weighted", {"partition": "dirichlet:1.0"}),
    "repeats": ("proportional", {"dataset": "unbalanced"}),
    "repeat_count": (3, {}),
    "cap": (2, {}),  # refused with the default --repeats uniform
    "momentum": (0.5, {}),
    "hops": ("direct", {}),
    "exhausted": ("skip", {"options": {"repeat_count": 40}}),
    "local_epochs": (2, {}),
    "local_batch_size": (8, {}),
    "local_momentum": (0.5, {"options": {"local_epochs": 2}}),  # FedTAN: 1 step a round
    "local_weight_decay": (0.1, {}),
    "client_fraction": (0.67, {}),
    # None: the other choice; FedBSS and FedDiverse sample one of the three clients
    "weighting": (None, {"partition": "dirichlet:1.0", "options": {"client_fraction": 1.0}}),
    "local_steps": (2, {}),
    "bn_buffers": ("local", {}),
    "mu": (1.0, {}),
    "server_lr": (0.5, {}),
    "server_momentum": (0.5, {}),
    "warmup_rounds": (2, {}),
    "pseudo_data": ("mixture", {}),
    "pseudo_weight": (0.5, {}),
    "contrast_weight": (0.1, {}),
    "positive_temperature": (0.1, {}),
    "negative_temperature": (0.1, {}),
    "rsm_size": (5, {}),
    "mixture_size": (2, {"options": {"pseudo_data": "mixture"}}),
    "dht": ("known", {}),
    "pretrain_rounds": (2, {}),
    "bias_epochs": (1, {}),
    "attribute_epochs": (2, {}),
    "cosine_temperature": (0.5, {}),
    "margin": (0.5, {}),
    "drift_weight": (0.0, {}),
    "min_share": (20, {}),  # the tiny clients hold about 16 samples a batch
}

#: Options that choose how the same numbers are computed, not which: their equality is
#: what their own tests check (tests/test_compiled.py, tests/test_stratify.py).
SAME_NUMBERS_BY_DESIGN = {
    "compile": "the compiled step computes the eager step's numbers",
    "batch_path": "a global batch fused or client by client: the same summed gradient",
}

#: Options that act, but whose effect the tiny federation cannot show, with where it is
#: checked: FedDiverse's biased models (trained with the GCE's q) fit all of a tiny client's
#: samples whatever q is, so the estimated triplets, and the run, coincide.
NOT_VISIBLE_ON_THE_TINY_FEDERATION = {
    "gce_q": "tests/test_feddiverse.py: the generalized cross-entropy's q, by hand",
}


def option_cases() -> list[tuple[MethodCase, str]]:
    return [
        (case, entry.name)
        for case in method_cases()
        for entry in case.strategy_class.options_class.option_fields()
        if case.mode in entry.metadata["modes"] and entry.name in OTHER_VALUES
    ]


def test_every_declared_option_has_another_value_to_try():
    declared = {
        entry.name
        for case in method_cases()
        for entry in case.strategy_class.options_class.option_fields()
    }
    exempt = set(SAME_NUMBERS_BY_DESIGN) | set(NOT_VISIBLE_ON_THE_TINY_FEDERATION)
    assert declared - exempt == set(OTHER_VALUES)


def unbalanced_dataset() -> Dataset:
    """:func:`~stratify.testing.tiny_dataset` with half of label 0's training images."""
    tiny = tiny_dataset()
    keep = torch.cat(
        [torch.nonzero(tiny.y_train == 0)[::2, 0], torch.nonzero(tiny.y_train != 0)[:, 0]]
    )
    return dataclasses.replace(tiny, x_train=tiny.x_train[keep], y_train=tiny.y_train[keep])


_RUNS: dict[tuple[str, str, str], tuple[Any, ...] | str] = {}


def outcome(case: MethodCase, settings: dict[str, Any]) -> tuple[Any, ...] | str:
    """What a run of ``case`` with ``settings`` ends with (records without times, final
    weights), or the ``ConfigError`` that refused it."""
    key = (case.algorithm, case.mode, repr(sorted(settings.items())))
    if key not in _RUNS:
        base = case_config(case)
        options = {**base.options, **settings.get("options", {})}
        values = {k: v for k, v in settings.items() if k not in ("options", "dataset")}
        dataset = unbalanced_dataset() if settings.get("dataset") else tiny_dataset()
        try:
            config = dataclasses.replace(base, **values, options=options, epochs=3)
            with fresh_process_state(0):
                run = Run(config, dataset=dataset)
                run.train()
        except ConfigError as error:
            _RUNS[key] = str(error)
        else:
            records = [
                {k: v for k, v in dataclasses.asdict(r).items() if k != "wall_seconds"}
                for r in run.records
            ]
            weights = [t.clone() for t in run.engine.model.state_dict().values()]
            _RUNS[key] = (records, weights)
    return _RUNS[key]


def same(one: tuple[Any, ...], other: tuple[Any, ...]) -> bool:
    return one[0] == other[0] and all(torch.equal(a, b) for a, b in zip(one[1], other[1]))


@pytest.mark.parametrize(
    "case, name", option_cases(), ids=lambda value: getattr(value, "id", value)
)
def test_an_accepted_option_changes_the_run(case: MethodCase, name: str):
    value, context = OTHER_VALUES[name]
    entry = {e.name: e for e in case.strategy_class.options_class.option_fields()}[name]
    options = case.strategy_class.options_class.from_values(
        {**case_config(case).options, **context.get("options", {})}, case.algorithm, case.mode
    )
    default = getattr(options, name)
    if value is None:
        value = next(choice for choice in entry.metadata["choices"] if choice != default)
    assert value != default, f"{name}: the other value is {case.algorithm}'s default"
    plain = outcome(case, context)
    assert not isinstance(plain, str), f"{case.id} with {context}: refused: {plain}"
    changed = outcome(case, {**context, "options": {**context.get("options", {}), name: value}})
    if isinstance(changed, str):
        return  # refused: the method says it does not take this value here
    assert not same(plain, changed), (
        f"{case.id}: --{name.replace('_', '-')} {value} is accepted and changes nothing"
    )
