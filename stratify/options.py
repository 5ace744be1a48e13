"""Method options as dataclasses: one class per method, inheriting, validated on creation.

A field made with :func:`option` carries its help text, its check, its choices and the
modes it applies to; :class:`StrategyOptions` validates every field in ``__post_init__``,
and the ``train`` command generates its flags from these fields, so a default and its
help are written once (docs/architecture.md, "Options").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from stratify.errors import ConfigError
from stratify.validation import check_choice

MODES = ("single-sample", "batch")

OptionsT = TypeVar("OptionsT", bound="StrategyOptions")


def flag(name: str) -> str:
    """The command-line spelling of option ``name`` (``local_epochs`` -> ``--local-epochs``)."""
    return "--" + name.replace("_", "-")


def option(
    default: Any,
    help: str,
    *,
    check: Callable[[Any, str], Any] | None = None,
    choices: Sequence[str] | None = None,
    modes: Sequence[str] = MODES,
    cli_type: type | None = None,
    envvar: str | None = None,
) -> Any:
    """A dataclass field of a method's options (or of :class:`~stratify.config.TrainConfig`).

    Parameters
    ----------
    default : object
        Default value; ``None`` means "resolved later" (e.g. per mode, see
        :meth:`StrategyOptions.for_mode`).
    help : str
        One sentence for ``--help`` and ``stratify algorithms``.
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
        },
    )


def value_type(value: Any) -> type:
    return bool if isinstance(value, bool) else value.__class__


def validate_fields(instance: Any) -> None:
    """Check every field of dataclass ``instance`` made with :func:`option`, in place.

    ``None`` means "not given" and is left for later resolution; any other value goes
    through the field's choices and check, and is stored in its checked type.
    """
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if value is None or "help" not in field.metadata:
            continue
        name = flag(field.name)
        if field.metadata["choices"]:
            value = check_choice(value, name, field.metadata["choices"])
        check = field.metadata["check"]
        if check is not None:
            value = check(value, name)
        setattr(instance, field.name, value)


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
class StrategyOptions:
    """Base of every method's options; subclasses add fields made with :func:`option`."""

    algorithm: ClassVar[str] = "strategy"

    def __post_init__(self) -> None:
        check_given(self)
        validate_fields(self)

    def for_mode(self: OptionsT, mode: str) -> OptionsT:
        """These options with the defaults that depend on ``mode`` filled in.

        Subclasses override it to resolve ``None`` defaults and refuse values that do
        not fit ``mode``; the base class returns the options unchanged.
        """
        return self

    @classmethod
    def option_fields(cls) -> list[dataclasses.Field]:
        return [field for field in dataclasses.fields(cls) if "help" in field.metadata]

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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
