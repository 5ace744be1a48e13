"""Conformance checks that every registered federated method must pass.

Like scikit-learn's ``parametrize_with_checks``, this module turns the method registry
(:data:`stratify.algorithms.ALGORITHMS`) into test cases, so a method gets the checks by
being registered and no list of methods is kept anywhere::

    from stratify.testing import parametrize_with_checks

    @parametrize_with_checks()
    def test_every_method_conforms(case, check):
        check(case)

A :class:`MethodCase` is one registered algorithm in one mode it runs in
(its card's ``identity.modes``). Every case runs on the same tiny federation (:func:`tiny_dataset`:
48 training images of three digits, three clients of two labels each) with the method's
own default options (but its card's ``testing.options``), for :data:`EPOCHS` epochs, as
the user's ``Run`` would. The checks
(:data:`CHECKS`, docs/architecture.md "Testing and data"):

* :func:`check_declarations`: the method's card (:mod:`stratify.card`), which other
  parts read, is its own and names only registered methods and its own options;
* :func:`check_first_epoch`: one epoch runs, trains, and its losses are finite;
* :func:`check_same_seed`: a second run with the same seed gives the same weights and
  metrics, whatever state the process's global generators are in;
* :func:`check_resume`: a run stopped after any epoch and resumed (``--resume``, from the
  run folder) ends with the weights, metrics and method state of an uninterrupted one,
  the process's Python, numpy and torch generators meanwhile reset to other states;
* :func:`check_traffic`: the epoch's counters are what the method declared, and the
  bytes and transfers follow docs/architecture.md "Traffic counting";
* :func:`check_state_round_trip`: ``state_dict`` survives a checkpoint file and
  ``load_state_dict`` into a newly built method;
* :func:`check_bad_options`: a bad value of every option (an option that takes any value
  fails the check), an option of another method or mode and a mode the method does not
  run in are each refused with one line;
* :func:`check_comparator` (a method that declares a base): its matched comparator
  differs only by the method's mechanism and plans the same local work a round.

The runs a case needs are made once per process and shared by its checks.

Adding a check
--------------
A check is a function of a :class:`MethodCase` that raises ``AssertionError`` when the
method does not conform. Append it to :data:`CHECKS` as a :class:`Check`, with
``applies`` saying which cases it concerns (e.g. the matched-comparator contract of the
paired grid: the cases whose method has a FedAvg comparator); every registered method is
then checked by it, in every test that uses :func:`parametrize_with_checks` or
:func:`check_method`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import random
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stratify.algorithms import ALGORITHMS, strategy_class
from stratify.backend import cpu_backend, single_thread_settings
from stratify.card import MethodCard
from stratify.comparison import matched_config, planned_sample_gradients
from stratify.config import TrainConfig, resolve_lr
from stratify.data.datasets import Dataset, load_dataset
from stratify.errors import ConfigError
from stratify.experiment import build_experiment
from stratify.method import ClientUpdate, Context, Round, RoundStats, Strategy
from stratify.options import MODES, flag
from stratify.run import EpochRecord, Run
from stratify.runfolder import checkpoint_bytes, strict_json

#: Epochs of every run a case makes: enough for a method's phases to change within the run
#: (FedBSS warms up for its first round, FedDiverse estimates its triplets in round 2) and
#: for a resume after each of them.
EPOCHS = 4

#: The tiny federation: three clients of two labels each over three classes of digits.
CLASSES = 3
TRAIN_PER_CLASS = 16
TEST_PER_CLASS = 10
CLIENTS = 3
PARTITION = "classes:2"

#: Models tried in turn: the first one a method's ``setup`` accepts is its case's model (a
#: small MLP, or, for a method that needs batch statistics, ResNet-20 with BatchNorm).
MODEL_SETTINGS: tuple[dict[str, Any], ...] = (
    {"model": "mlp", "mlp_hidden": (16,)},
    {"model": "resnet20", "norm": "bn"},
)

#: Values tried, in turn, as a bad value of an option: the first one its own check refuses.
BAD_VALUES = ("-1", "nan", "not-a-number")


@dataclass(frozen=True)
class MethodCase:
    """One registered method in one mode it runs in.

    Parameters
    ----------
    algorithm : str
        The registered name.
    mode : {"single-sample", "batch"}
        The learning setting.
    """

    algorithm: str
    mode: str

    @property
    def id(self) -> str:
        return f"{self.algorithm}-{self.mode}"

    @property
    def strategy_class(self) -> type[Strategy]:
        return strategy_class(self.algorithm)


def method_cases(algorithms: Sequence[str] | None = None) -> list[MethodCase]:
    """Every registered method (or those named) in every mode it runs in."""
    names = list(ALGORITHMS) if algorithms is None else list(algorithms)
    return [
        MethodCase(name, mode)
        for name in names
        for mode in strategy_class(name).card.identity.modes
    ]


@dataclass(frozen=True)
class Check:
    """A conformance check: ``function(case)`` raises ``AssertionError`` when the case's
    method does not conform; ``applies(case)`` says whether the check concerns it."""

    name: str
    function: Callable[[MethodCase], None]
    applies: Callable[[MethodCase], bool] = lambda case: True

    def __call__(self, case: MethodCase) -> None:
        self.function(case)


# -- the tiny federation ---------------------------------------------------------------------

_DATASET: Dataset | None = None


def tiny_dataset() -> Dataset:
    """Three classes of scikit-learn's digits: 16 training and 10 test images of each of
    the digits 0, 1 and 2 (the first ones of the ``digits`` split), 8x8 as loaded.

    Runs never write into a dataset's tensors, so one copy serves every case.
    """
    global _DATASET
    if _DATASET is None:
        digits = load_dataset("digits", device="cpu")
        train = _first_of_each_class(digits.y_train, TRAIN_PER_CLASS)
        test = _first_of_each_class(digits.y_test, TEST_PER_CLASS)
        _DATASET = Dataset(
            "digits",
            digits.x_train[train].clone(),
            digits.y_train[train].clone(),
            digits.x_test[test].clone(),
            digits.y_test[test].clone(),
            CLASSES,
        )
    return _DATASET


def _first_of_each_class(labels: torch.Tensor, count: int) -> torch.Tensor:
    """Positions of the first ``count`` samples of each class ``0 … CLASSES − 1``."""
    return torch.cat([torch.nonzero(labels == label)[:count, 0] for label in range(CLASSES)])


def case_config(case: MethodCase, out: Path | None = None) -> TrainConfig:
    """The configuration of ``case``'s runs: its method with default options on
    :func:`tiny_dataset`, with the first of :data:`MODEL_SETTINGS` the method accepts."""
    return TrainConfig(
        **_values(case), **_model_settings(case), out=None if out is None else str(out)
    )


def _values(case: MethodCase) -> dict[str, Any]:
    return {
        "dataset": "digits",
        "partition": PARTITION,
        "clients": CLIENTS,
        "algorithm": case.algorithm,
        "mode": case.mode,
        "epochs": EPOCHS,
        "seed": 0,
        "device": "cpu",
        "secure": False,
        "options": dict(case.strategy_class.card.testing.options),
    }


_MODELS: dict[tuple[str, str, str], dict[str, Any]] = {}


def _model_settings(case: MethodCase) -> dict[str, Any]:
    key = _key(case)
    if key not in _MODELS:
        refusals = []
        for settings in MODEL_SETTINGS:
            config = TrainConfig(**_values(case), **settings)
            try:
                with fresh_process_state(0):
                    build_experiment(config, dataset=tiny_dataset())
            except ConfigError as error:
                refusals.append(f"{settings['model']}: {error}")
                continue
            _MODELS[key] = settings
            break
        else:
            raise AssertionError(f"{case.id} takes none of the tiny models: {'; '.join(refusals)}")
    return _MODELS[key]


# -- the runs a case makes, shared by its checks ---------------------------------------------


@dataclass
class Declared:
    """What a method declared in one epoch: the sums of its rounds' and updates' counters,
    the copies of the global model its clients received, and what was sent back."""

    stats: RoundStats = field(default_factory=RoundStats)
    received_copies: int = 0
    states_sent: int = 0
    travelling_updates: list[RoundStats] = field(default_factory=list)
    rounds_with_states: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Reference:
    """An uninterrupted run of a case, watched: its records, the model after every
    epoch, the method's final state and what it declared epoch by epoch."""

    records: list[dict[str, Any]]
    models: list[dict[str, torch.Tensor]]
    strategy_state: dict[str, Any]
    declared: list[Declared]
    model_bytes: int
    parameter_bytes: int


@dataclass
class Resumed:
    """The same run stopped after every epoch but the last and resumed each time: its
    first epoch (made by a run started afresh) and where it ended, or the error that
    stopped it."""

    first_epoch_record: dict[str, Any] | None = None
    first_epoch_model: dict[str, torch.Tensor] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    final_model: dict[str, torch.Tensor] = field(default_factory=dict)
    strategy_state: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


class _Stop(Exception):
    """Raised after an epoch's checkpoint to stop a run there, as a kill would."""


_REFERENCES: dict[tuple[str, str, str], Reference] = {}
_RESUMED: dict[tuple[str, str, str], Resumed] = {}


def forget_runs(algorithms: Sequence[str] | None = None) -> None:
    """Drop the runs made so far (of the methods named, or of all), so the next check of
    their cases makes them again: for a test that changes the code a run goes through."""
    runs: dict[tuple[str, str, str], Any]
    for runs in (_MODELS, _REFERENCES, _RESUMED):
        for key in [key for key in runs if algorithms is None or key[0] in algorithms]:
            del runs[key]


def _key(case: MethodCase) -> tuple[str, str, str]:
    return (case.algorithm, ALGORITHMS[case.algorithm], case.mode)


@contextlib.contextmanager
def fresh_process_state(seed: int) -> Iterator[None]:
    """One run's process-wide state: Python's, numpy's and torch's generators in the state
    of ``seed``, and the settings a worker gives every run (one thread, torch's default
    backends); the thread count and backends are put back afterwards.

    The runs of a case start from different generator states: a method must draw from the
    generator its hooks are given (or from torch's, which checkpoints carry), so its
    numbers cannot depend on them. The backend settings are the same for every run, so
    its numbers do not depend on what the process ran before.
    """
    with cpu_backend():
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        single_thread_settings()
        yield


def reference_run(case: MethodCase) -> Reference:
    """The uninterrupted run of ``case`` (made once per process)."""
    key = _key(case)
    if key not in _REFERENCES:
        with fresh_process_state(1000):
            run = Run(case_config(case), dataset=tiny_dataset())
            declared: list[Declared] = [Declared()]
            _watch(run.strategy, run.engine.context, declared)
            models = []

            def after_epoch(record: EpochRecord) -> None:
                models.append(_copy(run.engine.model.state_dict()))
                declared.append(Declared())

            run.on_epoch = after_epoch
            run.train()
        model = run.engine.model
        _REFERENCES[key] = Reference(
            records=[_comparable(record) for record in run.records],
            models=models,
            strategy_state=_copy(run.strategy.state_dict()),
            declared=declared[:-1],
            model_bytes=sum(t.numel() * t.element_size() for t in model.state_dict().values()),
            parameter_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
        )
    return _REFERENCES[key]


def resumed_run(case: MethodCase) -> Resumed:
    """``case``'s run stopped after each epoch but the last, each time resumed from its
    run folder in a new ``Run`` (made once per process)."""
    key = _key(case)
    if key not in _RESUMED:
        resumed = Resumed()
        with tempfile.TemporaryDirectory(prefix="stratify-conformance-") as folder:
            config = case_config(case, Path(folder) / "run")
            for stop in range(1, EPOCHS + 1):
                try:
                    with fresh_process_state(1000 + stop):
                        run = Run(config, resume=stop > 1, dataset=tiny_dataset())
                        run.on_epoch = _stopper(run, stop, resumed)
                        run.train()
                except _Stop:
                    continue
                except Exception as error:  # the checks report it, with the epoch
                    resumed.error = f"after epoch {stop - 1}: {type(error).__name__}: {error}"
                    break
            else:
                lines = (Path(folder) / "run" / "metrics.jsonl").read_text().splitlines()
                resumed.records = [_without_time(json.loads(line)) for line in lines]
                resumed.final_model = _copy(run.engine.model.state_dict())
                resumed.strategy_state = _copy(run.strategy.state_dict())
        _RESUMED[key] = resumed
    return _RESUMED[key]


def _stopper(run: Run, stop: int, resumed: Resumed) -> Callable[[EpochRecord], None]:
    """``run``'s ``on_epoch``: keeps its first epoch in ``resumed`` and stops the run
    after epoch ``stop`` (its checkpoint written), unless that is the last."""

    def after_epoch(record: EpochRecord) -> None:
        if record.epoch == 1:
            resumed.first_epoch_record = _comparable(record)
            resumed.first_epoch_model = _copy(run.engine.model.state_dict())
        if record.epoch == stop < EPOCHS:
            raise _Stop

    return after_epoch


def _watch(strategy: Strategy, context: Context, declared: list[Declared]) -> None:
    """Record, in ``declared[-1]``, every count the strategy declares and every copy of
    the global model its clients receive (an instance-level wrapper of ``fit`` and of the
    trainer's ``receive``: the engine and the method run unchanged)."""
    fit = strategy.fit
    receive = context.trainer.receive

    def watched_fit(context: Context, round_: Round, rng: np.random.Generator) -> list[Any]:
        updates: list[ClientUpdate] = fit(context, round_, rng)
        epoch = declared[-1]
        epoch.stats.add(round_.stats)
        with_states = 0
        for update in updates:
            epoch.stats.add(update.stats)
            if update.state is not None:
                with_states += 1
            else:
                epoch.travelling_updates.append(dataclasses.replace(update.stats))
        epoch.states_sent += with_states
        if with_states and round_.clients is not None:
            epoch.rounds_with_states.append((len(round_.clients), with_states))
        return updates

    def counted_receive(model: torch.nn.Module) -> torch.nn.Module:
        declared[-1].received_copies += 1
        return receive(model)

    setattr(strategy, "fit", watched_fit)  # noqa: B010 - an instance attribute, on purpose
    setattr(context.trainer, "receive", counted_receive)  # noqa: B010


def _copy(value: Any) -> Any:
    """A deep copy of a state (tensors cloned, containers rebuilt)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, Mapping):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_copy(item) for item in value)
    return value


def _comparable(record: EpochRecord) -> dict[str, Any]:
    """A record as ``metrics.jsonl`` holds it (strict JSON), without its wall time."""
    return _without_time(json.loads(strict_json(dataclasses.asdict(record))))


def _without_time(row: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in row.items() if key != "wall_seconds"}


def differences(ours: Any, theirs: Any, path: str = "") -> Iterator[str]:
    """Where two states differ: ``path: why`` for tensors (shape, dtype or any value),
    containers (keys, lengths) and plain values; nothing for equal ones."""
    where = path or "(top)"
    if isinstance(ours, torch.Tensor) or isinstance(theirs, torch.Tensor):
        if not (isinstance(ours, torch.Tensor) and isinstance(theirs, torch.Tensor)):
            yield f"{where}: {type(ours).__name__} vs {type(theirs).__name__}"
        elif ours.shape != theirs.shape or ours.dtype != theirs.dtype:
            yield f"{where}: {ours.dtype}{tuple(ours.shape)} vs {theirs.dtype}{tuple(theirs.shape)}"
        elif not torch.equal(ours.cpu(), theirs.cpu()):
            gap = (ours.double().cpu() - theirs.double().cpu()).abs().max().item()
            yield f"{where}: values differ (up to {gap:.3g})"
    elif isinstance(ours, Mapping) and isinstance(theirs, Mapping):
        if set(ours) != set(theirs):
            missing = sorted(map(str, set(theirs) - set(ours)))
            extra = sorted(map(str, set(ours) - set(theirs)))
            yield f"{where}: keys differ (missing {missing}, extra {extra})"
        for key in ours:
            if key in theirs:
                yield from differences(ours[key], theirs[key], f"{path}/{key}")
    elif isinstance(ours, list | tuple) and isinstance(theirs, list | tuple):
        if len(ours) != len(theirs):
            yield f"{where}: {len(ours)} items vs {len(theirs)}"
        for index, (mine, other) in enumerate(zip(ours, theirs)):
            yield from differences(mine, other, f"{path}[{index}]")
    elif ours != theirs:
        yield f"{where}: {ours!r} vs {theirs!r}"


def _assert_same(ours: Any, theirs: Any, what: str) -> None:
    found = list(differences(ours, theirs))
    assert not found, f"{what}: " + "; ".join(found[:5]) + (" …" if len(found) > 5 else "")


# -- the checks -----------------------------------------------------------------------------


def check_first_epoch(case: MethodCase) -> None:
    """One epoch on the tiny federation trains and gives finite losses and an accuracy."""
    first = reference_run(case).records[0]
    assert first["steps"] > 0, f"{case.id}: epoch 1 made no optimizer step"
    for key in ("train_loss", "test_loss"):
        value = first[key]
        assert value is not None and math.isfinite(value), f"{case.id}: {key} is {value}"
    assert 0.0 <= first["test_accuracy"] <= 1.0, f"{case.id}: accuracy {first['test_accuracy']}"


def check_same_seed(case: MethodCase) -> None:
    """Two runs of the same seed, built from different states of the process's global
    generators, have the same weights and metrics after their first epoch."""
    reference, other = reference_run(case), resumed_run(case)
    assert other.first_epoch_record is not None, f"{case.id}: the second run failed {other.error}"
    _assert_same(other.first_epoch_model, reference.models[0], f"{case.id}: epoch 1 weights")
    assert other.first_epoch_record == reference.records[0], (
        f"{case.id}: epoch 1 metrics differ: {other.first_epoch_record} vs {reference.records[0]}"
    )


def check_resume(case: MethodCase) -> None:
    """Stopped after every epoch and resumed from its folder, a run ends with the metrics,
    weights and method state of the uninterrupted run."""
    reference, resumed = reference_run(case), resumed_run(case)
    assert resumed.error is None, f"{case.id}: resuming failed {resumed.error}"
    for ours, theirs in zip(resumed.records, reference.records):
        assert ours == theirs, (
            f"{case.id}: epoch {ours['epoch']} after a resume: {ours} vs {theirs}"
        )
    assert len(resumed.records) == len(reference.records) == EPOCHS
    _assert_same(resumed.final_model, reference.models[-1], f"{case.id}: final weights")
    _assert_same(resumed.strategy_state, reference.strategy_state, f"{case.id}: method state")


def check_traffic(case: MethodCase) -> None:
    """Every epoch's counters are the sums of what the method declared, and its traffic
    follows docs/architecture.md "Traffic counting":

    * ``bytes_sent = transfers · model_bytes + uploads · parameter_bytes + extra_bytes``,
      with ``model_bytes`` every tensor of the model's ``state_dict`` and
      ``parameter_bytes`` its parameters, measured here;
    * a copy of the global model a client receives is one transfer and a model state it
      sends back another (download and upload): where every update carries a state, the
      transfers are exactly those, and every round's participants each send one;
    * where the model itself travels (an update without a state), the updates declare at
      least one transfer per holder that trained, the hops that brought it there.
    """
    reference = reference_run(case)
    for record, declared in zip(reference.records, reference.declared, strict=True):
        epoch, stats = record["epoch"], declared.stats
        where = f"{case.id}, epoch {epoch}"
        for key in ("steps", "transfers", "skipped", "reused"):
            said, declared_count = record[key], getattr(stats, key)
            assert said == declared_count, (
                f"{where}: metrics say {key} {said}, the method declared {declared_count}"
            )
        expected = (
            stats.transfers * reference.model_bytes
            + stats.uploads * reference.parameter_bytes
            + stats.extra_bytes
        )
        assert record["bytes_sent"] == expected, (
            f"{where}: bytes_sent {record['bytes_sent']}, but {stats.transfers} transfers × "
            f"{reference.model_bytes} + {stats.uploads} uploads × {reference.parameter_bytes} + "
            f"{stats.extra_bytes} extra bytes = {expected}"
        )
        copies = declared.received_copies + declared.states_sent
        if declared.travelling_updates:
            assert stats.transfers >= copies, (
                f"{where}: {stats.transfers} transfers, fewer than the {declared.received_copies} "
                f"copies received and {declared.states_sent} states sent"
            )
            # a chain's hops may be declared on any of its updates (SFL counts the round's
            # chain on its first): every holder that trained needs a hop that brought it
            holders = sum(update.steps > 0 for update in declared.travelling_updates)
            hops = sum(update.transfers for update in declared.travelling_updates)
            assert hops >= holders, (
                f"{where}: the travelling model trained at {holders} holders but the updates "
                f"declare {hops} hops"
            )
        else:
            assert stats.transfers == copies, (
                f"{where}: {stats.transfers} transfers, but {declared.received_copies} copies "
                f"were received and {declared.states_sent} states sent"
            )
        for participants, sent in declared.rounds_with_states:
            assert sent == participants, (
                f"{where}: {participants} participants but {sent} states sent back"
            )


def check_state_round_trip(case: MethodCase) -> None:
    """The method's final ``state_dict`` goes through a checkpoint file (read as
    ``--resume`` reads it, tensors and plain values only) and, loaded into a newly built
    method, gives back the same state."""
    state = reference_run(case).strategy_state
    try:
        restored_state = torch.load(
            io.BytesIO(checkpoint_bytes({"strategy": state})), weights_only=True
        )["strategy"]
    except Exception as error:
        raise AssertionError(
            f"{case.id}: its state_dict cannot be read back as a checkpoint "
            f"({type(error).__name__}: {error})"
        ) from None
    with fresh_process_state(0):
        fresh = build_experiment(case_config(case), dataset=tiny_dataset()).strategy
    fresh.load_state_dict(restored_state)
    _assert_same(fresh.state_dict(), state, f"{case.id}: state after load_state_dict")


@dataclass(frozen=True)
class Refusal:
    """A setting the library must refuse in one line holding ``words``, and
    ``stratify train`` with the case's method, mode and ``arguments`` in one line
    holding ``command_words`` (tests/test_bad_options_cli.py runs the command: the kit
    stays below the command line, docs/architecture.md "Package map").

    Parameters
    ----------
    case : MethodCase
        The method and mode the setting is tried in.
    changes : dict
        ``TrainConfig`` fields changed from the case's (``options`` merged).
    words : tuple of str
        What the library's one-line refusal must name.
    arguments : tuple of str, optional
        The same change as ``stratify train`` flags (``()``: none, the mode is the
        change).
    command_words : tuple of str, optional
        What the command's refusal must name (default: ``words``).
    """

    case: MethodCase
    changes: dict[str, Any]
    words: tuple[str, ...]
    arguments: tuple[str, ...] = ()
    command_words: tuple[str, ...] | None = None


def bad_option_refusals(case: MethodCase) -> list[Refusal]:
    """What the method's options must refuse: a bad value of each of its options (the
    first of :data:`BAD_VALUES` its own check refuses, or a value outside its choices; an
    option that takes all of them fails here as unchecked), each option given in a mode
    it does not apply to, an option of another method, and a mode the method does not
    run in."""
    cls = case.strategy_class
    fields = {entry.name: entry for entry in cls.options_class.option_fields()}
    refusals = []
    for name, entry in fields.items():
        if case.mode not in entry.metadata["modes"]:
            value = _valid_value(entry, entry.metadata["modes"][0])
            refusals.append(
                Refusal(
                    case,
                    {"options": {name: value}},
                    (flag(name), "--mode"),
                    (flag(name), str(value)),
                )
            )
            continue
        bad = _bad_value(entry)
        # an option that takes every one of them is not checked at all: its bad input
        # would reach the run instead of being refused in one line
        assert bad is not None, (
            f"{case.id}: {flag(name)} takes every value tried ({', '.join(BAD_VALUES)}); "
            "give it a check or choices"
        )
        refusals.append(Refusal(case, {"options": {name: bad}}, (flag(name),), (flag(name), bad)))
    foreign = _foreign_option(case, fields)
    if foreign is not None:
        name, value = foreign
        refusals.append(
            Refusal(
                case,
                {"options": {name: value}},
                (flag(name), case.algorithm),
                (flag(name), str(value)),
                command_words=(flag(name),),
            )
        )
    for mode in MODES:
        if mode not in cls.card.identity.modes:
            refusals.append(Refusal(MethodCase(case.algorithm, mode), {}, ("--mode", mode)))
    return refusals


def check_bad_options(case: MethodCase) -> None:
    """Refused by the library in one line that names the flag: every setting of
    :func:`bad_option_refusals` (``stratify train``'s exit code 2 for the same
    arguments is checked in tests/, above the command line)."""
    for refusal in bad_option_refusals(case):
        _assert_refused(refusal)


def _bad_value(entry: dataclasses.Field) -> str | None:
    """A value ``entry``'s own check (or choices) refuses; ``None`` when it takes every
    one of :data:`BAD_VALUES`."""
    choices = entry.metadata["choices"]
    if choices:
        return "no-such-choice"
    check = entry.metadata["check"]
    if check is None:
        return None
    for candidate in BAD_VALUES:
        try:
            check(candidate, flag(entry.name))
        except ConfigError:
            return candidate
    return None


def _valid_value(entry: dataclasses.Field, mode: str) -> Any:
    """A value ``entry`` takes in ``mode``: its default, or its default in that mode."""
    if entry.default is not None:
        return entry.default
    return entry.metadata["per_mode"].get(mode, 1)


def _foreign_option(
    case: MethodCase, fields: Mapping[str, dataclasses.Field]
) -> tuple[str, Any] | None:
    """An option of another registered method that ``case``'s method does not take."""
    for name in ALGORITHMS:
        for entry in strategy_class(name).options_class.option_fields():
            if entry.name not in fields:
                return entry.name, _valid_value(entry, case.mode)
    return None


def _assert_refused(refusal: Refusal) -> None:
    """``TrainConfig`` with the refusal's changes raises one ``ConfigError`` line holding
    its words."""
    case, changes = refusal.case, refusal.changes
    values = {**_values(case), **changes}
    values["options"] = {**_values(case)["options"], **changes.get("options", {})}
    try:
        TrainConfig(**values)
    except ConfigError as error:
        message = str(error)
        assert "\n" not in message, f"{case.id}: {changes} refused in several lines: {message!r}"
        for word in refusal.words:
            assert word in message, f"{case.id}: {changes} refused without naming {word}: {message}"
    else:
        raise AssertionError(f"{case.id}: {changes} was accepted")


def check_declarations(case: MethodCase) -> None:
    """The method's :class:`~stratify.card.MethodCard` is its own and usable: it names the
    method as registered (a variant that kept its parent's card would be its parent in
    every table), with a label no other registered method has, a registered base or the
    reason it has none, test options and step-size options that are its own options, and
    a local benchmark only where it runs single-sample jobs."""
    cls = case.strategy_class
    card = getattr(cls, "card", None)
    assert isinstance(card, MethodCard), (
        f"{case.id}: declares no card on its class (docs/architecture.md, 'Strategy interface')"
    )
    assert card.name == case.algorithm, (
        f"{case.id}: its card names {card.name!r}: a variant declares a card of its own "
        "(MethodCard.derive)"
    )
    # a variant that keeps its parent's label would show as its parent in every table
    namesakes = [
        name
        for name in ALGORITHMS
        if name != case.algorithm and strategy_class(name).card.label == card.label
    ]
    assert not namesakes, f"{case.id}: its label {card.label!r} is also {', '.join(namesakes)}'s"
    base = card.comparison.comparator
    assert base is None or (base in ALGORITHMS and base != case.algorithm), (
        f"{case.id}: its comparator {base!r} is not another registered method"
    )
    own = {entry.name for entry in cls.options_class.option_fields()}
    for group, names in (
        ("testing.options", card.testing.options),
        ("bench.step_size_options", card.bench.step_size_options),
    ):
        foreign = sorted(set(names) - own)
        assert not foreign, f"{case.id}: its card's {group} names {foreign}, not its options"
    if card.bench.benchmark_local:
        assert "single-sample" in cls.card.identity.modes, (
            f"{case.id}: declares benchmark_local but does not run in single-sample mode"
        )


#: Client sizes the comparator check plans a round for: uneven, so that a budget taken
#: over the mean where it should be a sum (or the reverse) shows.
COMPARATOR_CLIENT_SIZES = (20, 32, 44)


def has_comparator(case: MethodCase) -> bool:
    """Whether ``case``'s method declares a base to be matched against."""
    return case.strategy_class.card.comparison.comparator is not None


def check_comparator(case: MethodCase) -> None:
    """The method's matched comparator (docs/architecture.md "Paired grids") differs from
    it only by the method's mechanism: ``matched_config`` gives a valid configuration of
    the base, in the same mode, on the same data, split, model, rounds and seed, at the
    method's resolved learning rate and schedule, and a round of the two is planned to
    take the same local training samples (a method with a base must plan them)."""
    config = case_config(case)
    matched = matched_config(config)
    base = case.strategy_class.card.comparison.comparator
    assert matched.algorithm == base, (
        f"{case.id}: comparator {matched.algorithm}, not the declared base {base}"
    )
    unchanged = ("mode", "dataset", "partition", "clients", "epochs", "seed", "model", "norm")
    for name in unchanged:
        assert getattr(matched, name) == getattr(config, name), (
            f"{case.id}: the comparator's {name} is {getattr(matched, name)!r}, the "
            f"method's {getattr(config, name)!r}"
        )
    assert matched.lr == resolve_lr(config), (
        f"{case.id}: the comparator steps at lr {matched.lr}, the method at {resolve_lr(config)}"
    )
    sizes = list(COMPARATOR_CLIENT_SIZES)
    ours = planned_sample_gradients(config, sizes)
    theirs = planned_sample_gradients(matched, sizes)
    # without a planned budget a paired dry run cannot show the two doing the same work
    assert ours is not None, f"{case.id}: plans no sample-gradients a round to match"
    assert theirs == ours, (
        f"{case.id}: a round is planned to take {ours} sample-gradients, its comparator's {theirs}"
    )


#: The checks every case must pass, in order (see "Adding a check" above).
CHECKS: list[Check] = [
    Check("declarations", check_declarations),
    Check("first_epoch", check_first_epoch),
    Check("same_seed", check_same_seed),
    Check("resume", check_resume),
    Check("traffic", check_traffic),
    Check("state_round_trip", check_state_round_trip),
    Check("bad_options", check_bad_options),
    Check("comparator", check_comparator, applies=has_comparator),
]


def checks_for(case: MethodCase) -> list[Check]:
    """The checks of :data:`CHECKS` that apply to ``case``."""
    return [check for check in CHECKS if check.applies(case)]


def check_method(algorithm: str) -> list[str]:
    """Run every check on every mode of the registered method ``algorithm``; the first
    that fails raises ``AssertionError``. Returns the ids of the checks run
    (``<algorithm>-<mode>-<check>``)."""
    done = []
    for case in method_cases([algorithm]):
        for check in checks_for(case):
            check(case)
            done.append(f"{case.id}-{check.name}")
    return done


def parametrize_with_checks(algorithms: Sequence[str] | None = None) -> Any:
    """A ``pytest.mark.parametrize`` over ``(case, check)``: every check that applies to
    every mode of every registered method (or of those named), with ids such as
    ``fedavg-batch-resume``."""
    import pytest

    pairs = [(case, check) for case in method_cases(algorithms) for check in checks_for(case)]
    return pytest.mark.parametrize(
        "case, check", pairs, ids=[f"{case.id}-{check.name}" for case, check in pairs]
    )
