"""Reading a file the user or a run left, trusting nothing about what it is.

A leaf module (it imports nothing of the package but its errors), so that the data
loaders and the run-folder code share it without a loader importing the run folders
(docs/architecture.md, "Package map"). It also keeps the list of this process's inputs,
which no output may replace (:func:`guard_input`, :func:`check_output`): every file read
through :func:`read_file` joins it, so the rule needs the reading and the writing side
in one place.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from stratify.errors import CorruptRunError, OutputError


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
    The file is guarded from the command's outputs from then on (:func:`guard_input`).

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
        if guarded_as(path) is None:  # what this command reads, no output may replace
            guard_input(path, "a file this command reads", named=False)
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


# -- inputs are never outputs ---------------------------------------------------------------


@dataclass(frozen=True)
class Guarded:
    """A file (or a folder and all below it) that no output of this process may be.

    Attributes
    ----------
    what : str
        What it is, for the refusal (``"the --source events of this stream"``).
    owner : object or None
        The writer allowed to write it (a :class:`RunFolder` its own files), or ``None``.
    named : bool
        Whether the user named it as an input (a run folder of the command must not
        hold it either), rather than a file the command happened to read back; such a
        file is guarded only while it is the file that was read (same path, same inode),
        so a file the toolkit later replaced, or removed, is free again.
    folder : bool
        Whether everything below it is guarded too (a data folder's files).
    inode : tuple of int, optional
        Its ``(device, inode)`` when it was guarded.
    """

    what: str
    owner: object | None = None
    named: bool = True
    folder: bool = False
    inode: tuple[int, int] | None = None


#: resolved path -> what guards it; and (device, inode) -> resolved path, so a hard link
#: or a bind mount naming a guarded file meets the same entry
_GUARDED: dict[str, Guarded] = {}
_GUARDED_INODES: dict[tuple[int, int], str] = {}


def _identity(path: str | os.PathLike) -> tuple[str, tuple[int, int] | None]:
    resolved = os.path.realpath(path)
    try:
        info = os.stat(resolved)
    except (OSError, ValueError):
        return resolved, None
    return resolved, (info.st_dev, info.st_ino)


def guard_input(
    path: str | os.PathLike,
    what: str,
    *,
    owner: object | None = None,
    named: bool = True,
    folder: bool = False,
) -> None:
    """Declare ``path`` an input of this process (or a file a run owns): from now on no
    output is written to it, whatever ``--overwrite`` says (:func:`check_output`).

    Every place that opens an output checks it (``runfolder.write_file``, the stream's
    appended files, ``RunFolder.open``), so every command gets the rule by declaring
    its inputs (docs/architecture.md, "Run folder").

    Parameters
    ----------
    path : str or os.PathLike
        The file (links followed; it need not exist yet).
    what : str
        What it is, named in the refusal.
    owner, named, folder
        As :class:`Guarded`'s attributes.
    """
    resolved, inode = _identity(path)
    _GUARDED[resolved] = Guarded(what, owner, named, folder, inode)
    if inode is not None and named:
        _GUARDED_INODES[inode] = resolved


def release_input(path: str | os.PathLike, owner: object | None = None) -> None:
    """Stop guarding ``path`` (its command, or its run, is over); with ``owner``, only
    if that writer guards it."""
    resolved, inode = _identity(path)
    entry = _GUARDED.get(resolved)
    if entry is None or (owner is not None and entry.owner is not owner):
        return
    del _GUARDED[resolved]
    if inode is not None and _GUARDED_INODES.get(inode) == resolved:
        del _GUARDED_INODES[inode]


def guarded_as(path: str | os.PathLike, owner: object | None = None) -> Guarded | None:
    """What guards the output ``path`` from ``owner`` (links followed, hard links and
    files below a guarded folder included), or ``None``."""
    resolved, inode = _identity(path)
    found = _GUARDED.get(resolved)
    if found is not None and not found.named and found.inode != inode:
        found = None  # replaced or removed since it was read
    if found is None and inode is not None and inode in _GUARDED_INODES:
        other = _GUARDED_INODES[inode]
        if _identity(other)[1] == inode:  # not an inode number reused since
            found = _GUARDED.get(other)
    if found is None:
        for parent in Path(resolved).parents:
            entry = _GUARDED.get(str(parent))
            if entry is not None and entry.folder:
                found = entry
                break
    if found is None or (owner is not None and found.owner is owner):
        return None
    return found


def named_inputs_below(folder: str | os.PathLike) -> list[tuple[str, Guarded]]:
    """The inputs the user named for this command that lie in ``folder`` or below it
    (resolved path and entry): what replacing ``folder`` would delete."""
    root = Path(os.path.realpath(folder))
    return [
        (resolved, entry)
        for resolved, entry in _GUARDED.items()
        if entry.named and entry.owner is None and Path(resolved).is_relative_to(root)
    ]


def check_output(path: str | os.PathLike, flag: str, owner: object | None = None) -> None:
    """Refuse an output ``path`` that is an input of this command or a file its run owns.

    Parameters
    ----------
    path : str or os.PathLike
        The output, as the user named it.
    flag : str
        The option that named it, for the message.
    owner : object, optional
        The writer; its own guarded files are allowed.

    Raises
    ------
    OutputError
        One line naming what the file is.
    """
    found = guarded_as(path, owner)
    if found is not None:
        raise OutputError(
            f"{flag} {os.fspath(path)} is {found.what}; an output never replaces an input of "
            "the command or a file of its run (whatever --overwrite says): give another file"
        )
