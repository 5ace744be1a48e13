"""Files a stream appends to as it goes: its metrics and its predictions.

Both are JSON Lines written by appending, so a report costs one line whatever the
stream's length; each line is flushed at once (a reader, or a pipe, sees it), and the
file is synced to disk at most once a second and at every checkpoint. A checkpoint
records each file's size, and a resumed stream cuts the file back to it, so the lines of
events that will be read again are not written twice (docs/architecture.md, "Streaming").
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time
from pathlib import Path
from typing import IO, Any

from stratify.errors import ConfigError, OutputError
from stratify.files import check_output
from stratify.runfolder import describe_os_error, strict_json

#: seconds between two syncs of an appended file
SYNC_SECONDS = 1.0


class JsonLinesAppender:
    """A JSON Lines file written by appending.

    Parameters
    ----------
    path : pathlib.Path or None
        The file; ``None`` for standard output.
    size : int, optional
        Cut the file back to this many bytes before the first line (resume); ``None``
        keeps what it holds.
    what : str
        What the file is, for error messages (the option that named it).
    flag : str, optional
        The option that named it: the file is then checked not to be an input of the
        command, nor a file its run owns (:func:`~stratify.runfolder.check_output`).
    owner : object, optional
        The run folder whose own file this is (its ``metrics.jsonl``).
    """

    def __init__(
        self,
        path: Path | None,
        size: int | None = None,
        what: str = "",
        flag: str | None = None,
        owner: object | None = None,
    ) -> None:
        self.path = path
        self.what = what or str(path)
        self.handle: IO[bytes] | None = None
        self.regular = False
        self.last_sync = time.monotonic()
        try:
            if path is None:
                self.handle = sys.stdout.buffer
                self.size = 0
                return
            if flag is not None:
                check_output(path, flag, owner)
            # opened for appending (never replaced): a FIFO, a device or a symlink is
            # written through; a FIFO nobody reads is refused at once (ENXIO) rather than
            # waited on, and one with a reader is written blocking (a slow reader is waited
            # for; a stop signal ends the wait, docs/architecture.md "Streaming")
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
            except OSError as error:
                if error.errno == errno.ENXIO:
                    raise OutputError(
                        f"cannot write {self.what}: it is a FIFO no process reads"
                    ) from None
                raise
            os.set_blocking(fd, True)
            # unbuffered: a line is written whole by append, and closing never waits on a
            # reader (a stream stopped while a FIFO was full has nothing left to flush)
            self.handle = os.fdopen(fd, "ab", buffering=0)
            mode = os.fstat(self.handle.fileno()).st_mode
            self.regular = stat.S_ISREG(mode)
            if self.regular and size is not None and size < os.fstat(self.handle.fileno()).st_size:
                os.truncate(self.handle.fileno(), size)
            self.size = os.fstat(self.handle.fileno()).st_size if self.regular else 0
        except OSError as error:
            self.close()
            raise OutputError(f"cannot write {self.what}: {describe_os_error(error)}") from None

    def append(self, record: dict[str, Any]) -> None:
        """Write one line, flush it, and sync the file if a second has passed."""
        assert self.handle is not None
        data = (strict_json(record) + "\n").encode()
        try:
            view = memoryview(data)
            while view:
                view = view[self.handle.write(view) or 0 :]
            self.handle.flush()
        except OSError as error:
            raise OutputError(f"cannot write {self.what}: {describe_os_error(error)}") from None
        self.size += len(data)
        if self.regular and time.monotonic() - self.last_sync >= SYNC_SECONDS:
            self.sync()

    def sync(self) -> None:
        """Put what was written on disk (a checkpoint is about to count on it)."""
        if self.handle is None or not self.regular:
            return
        try:
            self.handle.flush()
            os.fsync(self.handle.fileno())
        except OSError as error:
            raise OutputError(f"cannot write {self.what}: {describe_os_error(error)}") from None
        self.last_sync = time.monotonic()

    def close(self) -> None:
        if self.handle is None:
            return
        if self.path is not None:
            try:
                self.sync()
            except OutputError:
                pass  # closing after a failure: the failure is what is reported
            self.handle.close()
        self.handle = None


def check_predictions_target(path: str, new_run: bool, overwrite: bool) -> None:
    """Refuse, before the stream starts, a ``--predictions`` file that would lose
    something: an input of the stream or a file of its run (whatever ``--overwrite``
    says), a non-empty regular file when a new stream starts without ``--overwrite``, or
    a folder."""
    if path == "-":
        return
    check_output(path, "--predictions")
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"--predictions {path} is a folder; give a file")
    if not target.parent.is_dir():
        raise ConfigError(f"--predictions {path}: no folder {target.parent}")
    if new_run and not overwrite and target.is_file() and target.stat().st_size > 0:
        raise ConfigError(
            f"--predictions {path} is a file that is not empty; give --overwrite to replace "
            "it, or another file"
        )
