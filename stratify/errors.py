"""User-facing errors: the CLI prints these as one line and exits non-zero, never a traceback."""


class StratifyError(Exception):
    """A problem with the user's input or environment, with the fix in its message."""


class DatasetError(StratifyError):
    """A dataset is unknown, missing or unreadable."""


class PartitionError(StratifyError):
    """A partition spec is malformed or cannot be satisfied."""


class RegistryError(StratifyError):
    """The label registry rejected its input; nothing was registered."""


class ConfigError(StratifyError):
    """Options that are invalid or do not fit together."""


class TrainingError(StratifyError):
    """Training had to stop (e.g. a non-finite loss)."""


class OutputError(StratifyError):
    """A file or folder the user named cannot be used: in use by another run, read-only,
    full, or holding something else."""


class CheckpointError(ConfigError):
    """A checkpoint cannot be resumed from: unreadable, of another run, or malformed.

    ``reason`` says what is wrong without the advice of the command that met it, so a
    command that handles the checkpoint itself (a grid re-running a cell) can report it.
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


class CorruptRunError(StratifyError):
    """A run folder's file cannot be read back: not a regular file, not UTF-8 text, not
    the records or JSON object it should hold."""
