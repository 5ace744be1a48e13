"""Reading a file the user or a run left, trusting nothing about what it is.

A leaf module (it imports nothing of the package but its errors), so that the data
loaders and the run-folder code share it without a loader importing the run folders
(docs/architecture.md, "Package map").
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from stratify.errors import CorruptRunError


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in a few words (``"a FIFO"``)."""
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def read_file(path: Path, limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path``, refusing anything else before reading.

    A FIFO is opened without waiting for a writer (``O_NONBLOCK``) and refused, so a FIFO
    put where a run file belongs cannot make a command hang; so are folders and devices.

    Parameters
    ----------
    path : Path
        The file.
    limit : int, optional
        Refuse a file larger than this many bytes (a run file grown absurdly large).

    Raises
    ------
    CorruptRunError
        Not a regular file, or larger than ``limit``.
    OSError
        The file cannot be opened or read (missing, permissions).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CorruptRunError(f"{path} is {file_kind(info.st_mode)}, not a regular file")
        if limit is not None and info.st_size > limit:
            raise CorruptRunError(
                f"{path} holds {info.st_size:,} bytes, more than the {limit:,} it can hold"
            )
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
