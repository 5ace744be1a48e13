"""Options as dataclasses: one class per method and per dataset loader, inheriting,
validated on creation.

A field made with :func:`option` carries its help text, its check, its choices and the
modes it applies to; :class:`StrategyOptions` (a method's) and :class:`DatasetOptions` (a
loader's, ``-o KEY=VALUE``) validate every field in ``__post_init__``, and the ``train``
command generates its flags from these fields, so a default and its help are written once
(docs/architecture.md, "Options").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from stratify.errors import ConfigError
from stratify.validation import Typed, check_choice

MODES = ("single-sample", "batch")
#: where tensors live: ``auto`` is ``cuda`` when torch sees a GPU, else ``cpu``
DEVICES = ("auto", "cpu", "cuda")

OptionsT = TypeVar("OptionsT", bound="StrategyOptions")


def flag(name: str) -> str:
    """The command-line spelling of option ``name`` (``local_epochs`` -> ``--local-epochs``)."""
    return "--" + name.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class Probe:
    """Another value of a method's option than its default, for the option-effect tests
    (tests/test_option_effects.py; river's ``_unit_test_params``): a short run with it
    must differ from the default run (final weights, losses or traffic), or be refused.

    Parameters
    ----------
    value : object
        The other value; ``None``: the option's other choice.
    settings : mapping
        Run settings given to both runs so that the option can act there:
        :class:`~stratify.config.TrainConfig` fields, ``options`` (other options), or
        ``"dataset": "unbalanced"`` (labels of unequal counts).
    unobservable : str
        Why a short run cannot show the option's effect, and which test checks it
        instead (an option that computes the same numbers another way, by design); empty
        when it can.
    """

    value: Any = None
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    unobservable: str = ""


def option(
    default: Any,
    help: str,
    *,
    check: Callable[[Any, str], Any] | None = None,
    choices: Sequence[str] | None = None,
    modes: Sequence[str] = MODES,
    cli_type: type | None = None,
    envvar: str | None = None,
    per_mode: Mapping[str, Any] | None = None,
    probe: Probe | None = None,
) -> Any:
    """A dataclass field of a method's options (or of :class:`~stratify.config.TrainConfig`).

    Parameters
    ----------
    default : object
        Default value; ``None`` means "resolved later" (by ``per_mode``, or by an
        override of :meth:`StrategyOptions.for_mode`).
    help : str
        One sentence for ``--help`` and ``stratify methods``.
    check : callable, optional
        ``check(value, flag)`` returns the value in its type or raises ConfigError.
    choices : sequence of str, optional
        The allowed values.
    modes : sequence of str
        The modes (``single-sample``, ``batch``) in which giving the option makes sense;
        giving it in another mode is refused.
    cli_type : type, optional
        Python type of the value on the command line (``int``, ``float``, ``str``,
        ``bool``); inferred from the default when omitted.
    envvar : str, optional
        Environment variable the command line reads when the flag is not given.
    per_mode : mapping, optional
        Mode -> the value a ``None`` default resolves to in that mode (e.g. FedAvg's
        local epochs: 10 in batch mode, 1 in single-sample mode), applied by
        :meth:`StrategyOptions.for_mode`.
    probe : Probe, optional
        A method option's other value for the option-effect tests (every method option
        declares one; settings of a run need none).
    """
    if cli_type is None:
        cli_type = str if default is None else value_type(default)
    return dataclasses.field(
        default=default,
        metadata={
            "help": help,
            "check": check,
            "choices": tuple(choices) if choices is not None else None,
            "modes": tuple(modes),
            "type": cli_type,
            "envvar": envvar,
            "per_mode": dict(per_mode or {}),
            "probe": probe,
        },
    )


def dataset_option(
    default: Any,
    help: str,
    *,
    kind: type | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: Sequence[str] | None = None,
) -> Any:
    """A field of a dataset loader's :class:`DatasetOptions` (``-o KEY=VALUE``): an
    :func:`option` whose check is :class:`~stratify.validation.Typed`, which converts text
    from the command line and typed Python values alike.

    Parameters
    ----------
    default : object
        Value when the option is not given; ``None`` only for "not set".
    help : str
        One sentence on what the option does.
    kind : type, optional
        ``int``, ``float``, ``bool``, ``str``, or ``tuple`` (of floats); inferred from the
        default when omitted.
    minimum, maximum : float, optional
        Inclusive bounds of a number, or of every number of a tuple.
    choices : sequence of str, optional
        The allowed values of a ``str`` option.
    """
    if kind is None:
        kind = value_type(default)
    names = tuple(choices) if choices is not None else ()
    example = tuple(default) if kind is tuple and default is not None else ()
    return option(
        default,
        help,
        check=Typed(kind, minimum, maximum, names, example),
        choices=choices,
        cli_type=kind,
    )


@dataclasses.dataclass(frozen=True)
class Inherited:
    """An inherited option with new defaults (see :func:`inherit`)."""

    default: Any
    per_mode: Mapping[str, Any] | None


def inherit(default: Any = None, *, per_mode: Mapping[str, Any] | None = None) -> Any:
    """An option a subclass of :class:`StrategyOptions` inherits, with its own default.

    Help, check, choices and modes stay those of the parent's field; only the default
    (and, with ``per_mode``, the defaults by mode) change, in one line::

        class FedTANOptions(FedAvgOptions):
            local_momentum: float | None = inherit(0.9)
            local_batch_size: int | None = inherit(per_mode={"batch": 128})

    Parameters
    ----------
    default : object
        The subclass's default; ``None`` leaves the value to ``per_mode``.
    per_mode : mapping, optional
        Mode -> default in that mode, replacing the parent's for the modes it names.
    """
    return Inherited(default, per_mode)


def resolve_inherited(cls: type) -> None:
    """Turn the :func:`inherit` markers in class ``cls``'s body into dataclass fields
    that copy the parent's field with the new defaults; called before ``@dataclass``."""
    for name, value in list(vars(cls).items()):
        if not isinstance(value, Inherited):
            continue
        parent_fields = (getattr(base, "__dataclass_fields__", {}) for base in cls.__mro__[1:])
        parent = next((fields[name] for fields in parent_fields if name in fields), None)
        if parent is None:
            raise TypeError(f"{cls.__name__}.{name}: inherit() needs an option of a parent class")
        metadata = dict(parent.metadata)
        if value.per_mode is not None:
            metadata["per_mode"] = {**metadata["per_mode"], **value.per_mode}
        setattr(cls, name, dataclasses.field(default=value.default, metadata=metadata))
        if name not in vars(cls).get("__annotations__", {}):
            cls.__annotations__ = {**vars(cls).get("__annotations__", {}), name: parent.type}


def option_of(owner: type, name: str, **changes: Any) -> Any:
    """A copy of the :func:`option` field ``name`` of dataclass ``owner``, for another
    dataclass that takes the same setting; ``changes`` replace its ``default`` or any
    of :func:`option`'s arguments (``help``, ``check``, ``choices``, ``cli_type``), so a
    setting shared by two commands is declared once.
    """
    fields = {entry.name: entry for entry in dataclasses.fields(owner)}
    if name not in fields or "help" not in fields[name].metadata:
        raise ValueError(f"{owner.__name__} has no option {name!r}")
    source = fields[name]
    metadata = dict(source.metadata)
    arguments = {
        "help": metadata["help"],
        "check": metadata["check"],
        "choices": metadata["choices"],
        "modes": metadata["modes"],
        "cli_type": metadata["type"],
        "envvar": metadata["envvar"],
        "per_mode": metadata["per_mode"],
        "probe": metadata.get("probe"),
        **{key: value for key, value in changes.items() if key != "default"},
    }
    return option(changes.get("default", source.default), **arguments)


def option_default(cls: type, name: str, mode: str | None = None) -> Any:
    """The default of option ``name`` of the dataclass ``cls``, as declared there.

    Commands that restate a library setting (the benchmarks' ``--chunk``, ``--clients``)
    take their default from here, so it is written once.

    Parameters
    ----------
    cls : type
        A dataclass whose fields are made with :func:`option` (``TrainConfig``, a
        method's options class).
    name : str
        The field's name.
    mode : str, optional
        For a default that depends on the mode (``per_mode``): the mode's value.
    """
    field = cls.__dataclass_fields__[name]  # type: ignore[attr-defined]
    if field.default is None and mode is not None:
        return field.metadata["per_mode"].get(mode)
    return field.default


def value_type(value: Any) -> type:
    return bool if isinstance(value, bool) else value.__class__


def check_value(field: dataclasses.Field, value: Any, name: str) -> Any:
    """``value`` of the :func:`option` field ``field`` through its check, then its choices;
    ``name`` is how the user spells the option (``--chunk``, or ``base`` for ``-o``)."""
    check = field.metadata["check"]
    if check is not None:
        value = check(value, name)
    if field.metadata["choices"]:
        value = check_choice(value, name, field.metadata["choices"])
    return value


def validate_fields(instance: Any) -> None:
    """Check every field of dataclass ``instance`` made with :func:`option`, in place.

    ``None`` means "not given" and is left for later resolution; any other value goes
    through the field's check and choices, and is stored in its checked type. A
    class with a ``spell`` method names its options that way in messages, else as flags.
    """
    spell = getattr(instance, "spell", flag)
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if value is None or "help" not in field.metadata:
            continue
        setattr(instance, field.name, check_value(field, value, spell(field.name)))


class OptionFields:
    """Base of the dataclasses made of :func:`option` fields that a user fills in by name: a
    method's options (:class:`StrategyOptions`) and a loader's (:class:`DatasetOptions`).

    A subclass may change an inherited field's default with :func:`inherit`; instances
    are validated on creation.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        resolve_inherited(cls)

    def __post_init__(self) -> None:
        validate_fields(self)

    @classmethod
    def spell(cls, name: str) -> str:
        """How the user writes option ``name``, for messages."""
        return flag(name)

    @classmethod
    def option_fields(cls) -> list[dataclasses.Field]:
        return [field for field in dataclasses.fields(cls) if "help" in field.metadata]  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


def check_given(instance: Any) -> None:
    """Refuse ``None`` for a field of ``instance`` made with :func:`option` whose default
    is not ``None``: there ``None`` does not mean "resolved later" and would only fail
    where the value is used."""
    for field in dataclasses.fields(instance):
        if "help" in field.metadata and field.default is not None:
            if getattr(instance, field.name) is None:
                raise ConfigError(
                    f"{flag(field.name)} must be given (default {field.default!r}), got None"
                )


class RunSettings:
    """Base of the dataclasses that define one run of a command (``TrainConfig``,
    ``StreamConfig``): their :func:`option` fields are the command's flags, they are
    validated on creation, and a resumed run must keep every field but
    ``resumable_changes``."""

    #: the fields a resumed run may change (e.g. how many epochs, where it runs)
    resumable_changes: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        validate_fields(self)

    def comparable(self) -> dict[str, Any]:
        """The fields a resumed run must share with its checkpoint."""
        values = dataclasses.asdict(self)  # type: ignore[call-overload]
        for key in self.resumable_changes:
            values.pop(key)
        return values

    @classmethod
    def flag_fields(cls) -> list[dataclasses.Field]:
        """The fields that are flags of the command."""
        return [entry for entry in dataclasses.fields(cls) if "help" in entry.metadata]  # type: ignore[arg-type]


@dataclasses.dataclass
class StrategyOptions(OptionFields):
    """Base of every method's options; subclasses add fields made with :func:`option`."""

    def __post_init__(self) -> None:
        check_given(self)
        super().__post_init__()

    def for_mode(self: OptionsT, mode: str) -> OptionsT:
        """These options with the defaults that depend on ``mode`` filled in.

        Every field left ``None`` takes its ``per_mode`` default for ``mode`` where it
        has one. Subclasses override it to refuse values that do not fit ``mode`` or to
        resolve defaults that depend on other fields.
        """
        resolved = {
            field.name: field.metadata["per_mode"][mode]
            for field in self.option_fields()
            if getattr(self, field.name) is None and mode in field.metadata["per_mode"]
        }
        return dataclasses.replace(self, **resolved) if resolved else self

    @classmethod
    def from_values(
        cls: type[OptionsT], values: Mapping[str, Any], algorithm: str, mode: str
    ) -> OptionsT:
        """Options from user-given ``values`` (``None`` meaning "not given").

        Refuses a value the method does not take and one given in a mode it does not
        apply to, each with one line naming the flag and what would fit.
        """
        given = {key: value for key, value in values.items() if value is not None}
        fields = {field.name: field for field in cls.option_fields()}
        foreign = sorted(key for key in given if key not in fields)
        if foreign:
            valid = ", ".join(flag(name) for name in fields) or "no options"
            raise ConfigError(
                f"{', '.join(flag(key) for key in foreign)} does not apply to --algorithm "
                f"{algorithm}; its options are: {valid}"
            )
        for key in given:
            modes = fields[key].metadata["modes"]
            if mode not in modes:
                raise ConfigError(f"{flag(key)} applies to --mode {' or '.join(modes)}, not {mode}")
        return cls(**given).for_mode(mode)


@dataclasses.dataclass
class DatasetOptions(OptionFields):
    """Base of a dataset loader's options (``-o KEY=VALUE``); subclasses add fields made
    with :func:`dataset_option` (or :func:`inherit`), and the loader declares the class
    (:func:`~stratify.data.datasets.base.dataset_loader`), which checks the given values
    before any file is read. A loader without options declares this class itself."""

    @classmethod
    def spell(cls, name: str) -> str:
        return name  # -o name=value
