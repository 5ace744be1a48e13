"""Every option a method accepts changes its run, or is refused (docs/architecture.md,
"Options"): an option accepted and ignored is a bug.

For every registered method in every mode it runs in (:func:`stratify.testing.method_cases`)
and every option it declares for that mode, a run with the option set to another value
than its default (the :class:`~stratify.options.Probe` its declaration carries) is
compared with the default run, on the tiny federation of :mod:`stratify.testing`. The
two must differ (in the final weights, the losses or the traffic), or the other value
must be refused with a ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from stratify.data.datasets import Dataset
from stratify.errors import ConfigError
from stratify.options import Probe
from stratify.run import Run
from stratify.testing import (
    MethodCase,
    case_config,
    fresh_process_state,
    method_cases,
    tiny_dataset,
)


def probe(entry: dataclasses.Field) -> Probe:
    """The option's other value and settings, as its declaration gives them
    (:class:`~stratify.options.Probe`): e.g. weights by sample count equal equal weights
    on clients of equal sizes, so the weighting is compared on a Dirichlet split; and
    ``"dataset": "unbalanced"`` (:func:`unbalanced_dataset`) runs on labels of unequal
    counts, where Stratify's proportional repeats differ from its uniform ones."""
    declared = entry.metadata.get("probe")
    assert isinstance(declared, Probe), f"option {entry.name} declares no probe"
    return declared


def option_cases() -> list[tuple[MethodCase, str]]:
    return [
        (case, entry.name)
        for case in method_cases()
        for entry in case.strategy_class.options_class.option_fields()
        if case.mode in entry.metadata["modes"] and not probe(entry).unobservable
    ]


def test_every_declared_option_has_another_value_to_try_or_says_where_it_is_checked():
    for case in method_cases():
        for entry in case.strategy_class.options_class.option_fields():
            reason = probe(entry).unobservable
            # an option a short run cannot show names the test that checks it instead
            assert not reason or reason.startswith("tests/test_"), (entry.name, reason)


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
    entry = {e.name: e for e in case.strategy_class.options_class.option_fields()}[name]
    value, context = probe(entry).value, dict(probe(entry).settings)
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
