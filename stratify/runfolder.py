"""Run folders: one process at a time, files replaced atomically, a replacement built beside.

A :class:`RunFolder` is the folder a command writes its results to (``stratify train
--out``). It guarantees, for every command that writes through it:

* **One process at a time.** An exclusive OS lock (``flock``) on a lock file beside the
  folder, ``.<name>.lock``, is held from before the folder is inspected until the command
  ends, and on the folder itself while it exists; a second process on the same folder is
  refused in one line. The lock is keyed on the resolved folder, so a symlink, a ``..``
  path or a bind mount naming the same folder meets the same lock (:class:`FolderLock`).
  The kernel drops the lock when its holder dies, so a killed run stays resumable.
* **Whole files.** Every file is written to a temporary file in the same folder, flushed
  to disk, then renamed over the old one: a reader (or a killed writer) sees the old file
  or the new one, never half of one. A failed write (a full disk) removes its temporary
  file and leaves the old file in place.
* **Nothing lost by replacing.** A replacement (``mode="overwrite"``) is built in a
  staging folder beside the old run, ``.<name>.staging-<random>``, and takes the old
  run's place only at :meth:`RunFolder.commit`, i.e. once it has something worth keeping
  (a first checkpoint). A run that fails before that leaves the old one as it was.

Files the user names outside a run folder (``--json``, a plot's ``--out``, a grid's
tables) go through :func:`write_file`: a regular file is replaced atomically as above, a
symlink is written through to its target, and a device, a FIFO or ``/dev/stdout`` is
written through, never replaced. Run files are read back with
:func:`stratify.files.read_file`, which refuses anything but a regular file, so a FIFO
put in a folder cannot make a command wait.

docs/architecture.md, "Run folder", describes the life of a folder and how a command
uses this API.
"""

from __future__ import annotations

import ast
import errno
import fcntl
import hashlib
import importlib.util
import io
import json
import math
import os
import platform
import re
import secrets
import shutil
import stat
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from stratify import __version__
from stratify.errors import CheckpointError, CorruptRunError, OutputError
from stratify.files import (
    check_output,
    guard_input,
    guarded_as,
    named_inputs_below,
    read_file,
    release_input,
)

MODES = ("new", "resume", "overwrite")
#: longest file name most file systems take (ext4, xfs, btrfs, tmpfs, APFS)
NAME_MAX = 255
#: the random part of staging and replaced names, and the longest suffix
#: :func:`auxiliary_name` is given (``.replaced-`` and that part)
TOKEN = "[0-9a-f]{8}"
LONGEST_SUFFIX = len(".replaced-") + 8
#: the first member of an array checkpoint (:func:`array_checkpoint_bytes`): the state
#: as JSON, each array replaced by a reference to member ``arrays/<n>.npy``
ARRAY_TREE = "stratify-checkpoint.json"
ARRAY_FORMAT_VERSION = 1
#: the key of the one-key JSON object that stands for an array in that tree; a state's
#: own key starting with ``$`` is stored with one more ``$`` in front
ARRAY_KEY = "$array"
#: what an array checkpoint stores, for the message refusing anything else
STORABLE = "NumPy arrays, dicts with str keys, lists, tuples, str, int, float, bool and None"
#: zip members get a fixed time, so the same state gives the same bytes
ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: files get the permissions ``open()`` would give them (temporary files are private)
FILE_MODE = 0o666 & ~_read_umask()


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None``: strict JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def strict_json(value: Any, indent: int | None = None) -> str:
    """``value`` as strict JSON text (non-finite numbers as ``null``)."""
    return json.dumps(json_safe(value), indent=indent, allow_nan=False)


def torch_version() -> str:
    """``torch.__version__`` without importing torch: read from ``torch/version.py``, as
    its build wrote it (``2.14.1+cu130``; the package metadata drops the ``+cu130``), or
    from the package metadata where that file is not found."""
    spec = importlib.util.find_spec("torch")  # finds the package without running it
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            tree = ast.parse(Path(folder, "version.py").read_text())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if not isinstance(node, ast.Assign):
                continue
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id == "__version__":
                return str(ast.literal_eval(node.value))
    return metadata.version("torch")


def software_versions() -> dict[str, str]:
    """What ``config.json`` records of the software a run ran with (recording it does
    not import torch)."""
    return {
        "stratify": __version__,
        "torch": torch_version(),
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def checkpoint_bytes(state: Mapping[str, Any]) -> bytes:
    """``state`` serialised by ``torch.save`` in memory, for :meth:`RunFolder.write_bytes`
    (torch's own file writer reports a full disk as a RuntimeError and leaves a partial
    file; the run folder's writer reports it as one line and keeps the old file)."""
    import torch  # only where the state holds tensors: see array_checkpoint_bytes

    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    return buffer.getvalue()


def array_checkpoint_bytes(state: Mapping[str, Any]) -> bytes:
    """``state`` as an array checkpoint, written and read without torch, for
    :meth:`RunFolder.write_bytes`.

    The checkpoint is a zip archive of stored (uncompressed) members: first
    :data:`ARRAY_TREE`, the state as JSON with every array replaced by
    ``{"$array": n}``, then ``arrays/<n>.npy`` for each array (NumPy's format, read back
    without pickle). Ints, bools, strings, floats (NaN and infinities included) and
    ``None`` come back as they were, each float exactly; a tuple comes back as a list,
    each array with its dtype and shape, an array stored twice as two copies
    (docs/architecture.md, "Run folder").

    Parameters
    ----------
    state : mapping of str to object
        Made of :data:`STORABLE`.

    Raises
    ------
    TypeError
        A value it cannot store (a tensor, a NumPy scalar other than a float, an object
        array) or a dict key that is not a str, naming where in ``state`` it is.
    """
    arrays: list[np.ndarray] = []
    tree = _encode(state, "state", arrays)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        header = {"version": ARRAY_FORMAT_VERSION, "arrays": len(arrays), "state": tree}
        archive.writestr(zipfile.ZipInfo(ARRAY_TREE, ZIP_TIME), json.dumps(header))
        for index, array in enumerate(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, array, version=(1, 0), allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"arrays/{index}.npy", ZIP_TIME), member.getvalue())
    return buffer.getvalue()


def _encode(value: Any, path: str, arrays: list[np.ndarray]) -> Any:
    """``value`` as JSON, its arrays appended to ``arrays``; ``path`` names it in errors."""
    if value is None:
        return None
    # bool before int (True is an int); the subclasses (np.float64, an IntEnum) as the base
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    if type(value) is np.ndarray:
        if value.dtype.kind in "OV":  # objects would need pickle; records are not kept
            raise TypeError(f"{path}: cannot store an array of dtype {value.dtype} ({STORABLE})")
        arrays.append(value)
        return {ARRAY_KEY: len(arrays) - 1}
    if isinstance(value, Mapping):
        encoded = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{path}: cannot store the {type(key).__name__} key {key!r:.40}")
            encoded["$" + key if key.startswith("$") else key] = _encode(
                item, f"{path}[{key!r}]", arrays
            )
        return encoded
    if isinstance(value, (list, tuple)):
        return [_encode(item, f"{path}[{index}]", arrays) for index, item in enumerate(value)]
    raise TypeError(
        f"{path}: cannot store a {type(value).__module__}.{type(value).__name__} ({STORABLE})"
    )


def is_array_checkpoint(data: bytes) -> bool:
    """Whether ``data`` starts as :func:`array_checkpoint_bytes` writes: a zip archive
    whose first member is :data:`ARRAY_TREE` (its name follows the 30-byte local header)."""
    name = ARRAY_TREE.encode()
    return (
        data[:4] == b"PK\x03\x04"
        and data[26:28] == len(name).to_bytes(2, "little")
        and data[30 : 30 + len(name)] == name
    )


def read_array_checkpoint(data: bytes) -> Any:
    """The state in ``data``, an array checkpoint (:func:`array_checkpoint_bytes`).

    Raises
    ------
    Exception
        Whatever is wrong with a damaged or crafted file (``zipfile.BadZipFile``,
        ``ValueError``, ``KeyError``…): :func:`read_checkpoint` turns any into one line.
    """
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        if any(info.compress_type != zipfile.ZIP_STORED for info in archive.infolist()):
            raise ValueError("a compressed member")  # never written: may be a zip bomb
        header = json.loads(archive.read(ARRAY_TREE))
        if not isinstance(header, dict) or header.get("version") != ARRAY_FORMAT_VERSION:
            raise ValueError("not a known version")
        count = header["arrays"]
        if type(count) is not int or not 0 <= count < len(archive.infolist()):
            raise ValueError("a wrong array count")
        arrays = [_read_npy(archive.read(f"arrays/{index}.npy")) for index in range(count)]
    return _decode(header["state"], arrays)


def _read_npy(data: bytes) -> np.ndarray:
    """The array in ``data`` (``.npy``, version 1.0), its size checked against its header
    before anything is allocated, never unpickled."""
    stream = io.BytesIO(data)
    if np.lib.format.read_magic(stream) != (1, 0):
        raise ValueError("not a version 1.0 .npy member")
    shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
    if dtype.hasobject:
        raise ValueError("an object array")
    count = math.prod(shape)
    if len(data) - stream.tell() != count * dtype.itemsize:
        raise ValueError("an array member of the wrong size")
    array = np.frombuffer(data, dtype=dtype, count=count, offset=stream.tell())
    # a copy: frombuffer's array is read-only, and a resumed state is updated in place
    return array.reshape(shape, order="F" if fortran_order else "C").copy()


def _decode(node: Any, arrays: list[np.ndarray]) -> Any:
    """The value JSON ``node`` stands for (:func:`_encode` undone)."""
    if isinstance(node, dict):
        if node.keys() == {ARRAY_KEY}:
            index = node[ARRAY_KEY]
            if type(index) is not int or not 0 <= index < len(arrays):
                raise ValueError("a reference to no array")
            return arrays[index]
        return {
            key[1:] if key.startswith("$") else key: _decode(item, arrays)
            for key, item in node.items()
        }
    if isinstance(node, list):
        return [_decode(item, arrays) for item in node]
    return node


def fresh_start_advice(folder: Path) -> str:
    """What a refusal to resume ``folder`` suggests: a new run with ``--overwrite``, or,
    where the folder holds an input of the command (which ``--overwrite`` would delete,
    and is refused), another ``--out``."""
    if named_inputs_below(folder):
        return "choose another --out (this one holds an input of the command)"
    return "start a new run with --overwrite"


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint in ``path``: an array checkpoint (:func:`array_checkpoint_bytes`,
    read without torch, its arrays as NumPy arrays) or ``torch.save``'s (read with
    ``weights_only``: tensors, numbers, strings and containers only). Neither can run
    code when it is read, whatever the file holds.

    Parameters
    ----------
    path : str or path-like
        The checkpoint file.

    Raises
    ------
    CheckpointError
        One line: the file is not a regular file, cannot be read, or does not hold a
        dictionary.
    """
    path = Path(path)
    advice = fresh_start_advice(path.parent)
    try:
        data = read_file(path)
    except CorruptRunError as error:
        raise CheckpointError(f"--resume: {error}; {advice}", str(error)) from None
    except OSError as error:
        reason = f"{path} is unreadable ({describe_os_error(error)})"
        raise CheckpointError(f"--resume: {reason}; {advice}", reason) from None
    arrays = is_array_checkpoint(data)
    if not arrays:
        import torch  # only for torch.save's format
    try:
        if arrays:
            checkpoint = read_array_checkpoint(data)
        else:
            with warnings.catch_warnings():
                # torch warns about what it checks (sparse tensors): the verdict is ours
                warnings.simplefilter("ignore")
                checkpoint = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as error:  # any unreadable checkpoint is the same user error
        reason = f"{path} is unreadable ({type(error).__name__})"
        raise CheckpointError(f"--resume: {reason}; {advice}", reason) from None
    if not isinstance(checkpoint, dict):
        reason = f"{path} is not a checkpoint"
        raise CheckpointError(f"--resume: {reason}; {advice}", reason)
    return checkpoint


def check_same_settings(
    saved: object, current: Mapping[str, Any], changeable: Iterable[str], path: Path
) -> None:
    """Refuse to resume the checkpoint in ``path`` when its ``saved`` settings differ from
    the ``current`` ones in anything but the ``changeable`` keys (one line naming each)."""
    if not isinstance(saved, dict):
        reason = f"{path} holds no configuration"
        raise CheckpointError(f"--resume: {reason}; {fresh_start_advice(path.parent)}", reason)
    allowed = set(changeable)
    differing = sorted(
        key
        for key in set(saved) | set(current)
        if key not in allowed and saved.get(key) != current.get(key)
    )
    if differing:
        details = ", ".join(
            f"{key}: checkpoint {saved.get(key)!r} vs now {current.get(key)!r}" for key in differing
        )
        reason = f"configuration differs from the checkpoint ({details})"
        raise CheckpointError(f"--resume: {reason}", reason)


def describe_os_error(error: OSError) -> str:
    """The OS's reason for ``error`` in a few words (``"Permission denied"``)."""
    return error.strerror or type(error).__name__


def write_atomically(path: Path, data: bytes, mode: int = FILE_MODE) -> None:
    """Replace ``path`` with ``data`` in one rename; on failure the old file stays.

    The data goes to a temporary file in the same folder (a rename is atomic only within
    one file system), is flushed to disk, and then renamed over ``path``. A failed write
    removes the temporary file. Raises ``OSError``.

    Parameters
    ----------
    path : Path
        The file to replace.
    data : bytes
        Its new content.
    mode : int
        Its permission bits (default: a new file's under the umask); the temporary file
        is made with 0600 and given them before any byte is written, so a secret
        (``0o600``) is never readable by others, not even for a moment.
    """
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(handle, "wb") as file:
            os.fchmod(file.fileno(), mode)
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


#: ``/proc/self/fd/N``, ``/proc/<pid>/fd/N`` and ``/dev/fd/N``: links to open descriptors
DESCRIPTOR_LINK = re.compile(r"/(?:proc/(self|\d+)/fd|dev/fd)/(\d+)")


def own_descriptor(path: Path) -> int | None:
    """The descriptor of this process that ``path`` names through links such as
    ``/dev/stdout`` -> ``/proc/self/fd/1``, or ``None``."""
    current = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on links followed
        match = DESCRIPTOR_LINK.fullmatch(current)
        if match and match.group(1) in (None, "self", str(os.getpid())):
            return int(match.group(2))
        if not os.path.islink(current):
            return None
        target = os.readlink(current)
        current = os.path.normpath(os.path.join(os.path.dirname(current), target))
    return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_through(path: Path, data: bytes) -> None:
    """Write ``data`` into the special file ``path`` (a device, a FIFO) without replacing
    it. A FIFO that no process reads is refused at once instead of waited on."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == errno.ENXIO:
            raise OSError(errno.ENXIO, "no process reads this FIFO", str(path)) from None
        raise
    try:
        # blocking from now on: a slow reader is waited for, not an error
        os.set_blocking(fd, True)
        _write_all(fd, data)
    finally:
        os.close(fd)


def write_file(path: str | os.PathLike, data: bytes, flag: str = "the output") -> None:
    """Write ``data`` to the file the user named ``path``, never replacing what is there
    by something else, and never an input of the command (:func:`check_output`, which
    raises :class:`OutputError` naming ``flag``).

    - a regular file (or a new one) is replaced atomically (:func:`write_atomically`);
    - a symlink is followed: its target is replaced, the link stays;
    - a link to one of this process's descriptors (``/dev/stdout``, ``/dev/fd/3``) is
      written through that descriptor, where the process's other output goes;
    - a device or a FIFO is written through; a FIFO nobody reads is refused.

    Raises ``OSError`` (``IsADirectoryError`` for a folder).
    """
    check_output(path, flag)
    descriptor = own_descriptor(Path(path))
    if descriptor is not None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        _write_all(descriptor, data)
        return
    target = Path(os.path.realpath(path))
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
    if mode is not None and not stat.S_ISREG(mode):
        write_through(target, data)
        return
    write_atomically(target, data)


def write_output_file(path: Path, data: bytes, flag: str = "the output") -> None:
    """:func:`write_file`, a failure (a full disk, a read-only folder) one
    :class:`OutputError` line naming the file and saying whether its previous version is
    kept (it always is when there was one)."""
    try:
        write_file(path, data, flag)
    except OSError as error:
        kept = " (its previous version is kept)" if os.path.isfile(path) else ""
        raise OutputError(f"cannot write {path}: {describe_os_error(error)}{kept}") from None


def auxiliary_name(name: str, suffix: str) -> str:
    """``.<name><suffix>``: the hidden lock, staging or replaced name of folder ``name``.

    A folder name close to the file system's limit would make the auxiliary names too
    long, so such names are shortened and made unique with a hash of the full name; the
    choice depends on ``name`` only, so every auxiliary name of a folder has one stem.
    """
    stem = name
    if len(f".{name}".encode()) + LONGEST_SUFFIX > NAME_MAX:
        stem = f"{name[:64]}-{hashlib.sha256(name.encode()).hexdigest()[:16]}"
    return f".{stem}{suffix}"


class FolderLock:
    """An exclusive lock on a folder, held by this process until :meth:`release`.

    Two locks are taken, both keyed on the folder itself rather than on the name the user
    gave: an ``flock`` on ``.<name>.lock`` beside the *resolved* folder (so a symlink or a
    ``..`` path to the same folder meets the same lock file, and so does a bind mount of
    any folder above it, which shows the same lock file), and, while the folder exists,
    an ``flock`` on the folder's own directory (so a bind mount of the folder itself meets
    it too). The lock file sits beside the folder because ``--overwrite`` replaces the
    folder; it holds the holder's process id, named when a second process is refused.

    Parameters
    ----------
    path : str or os.PathLike
        The folder, as the user gave it (named in messages).
    holder : str
        What holds such folders, for the message (``"run"``, ``"grid"``).
    """

    def __init__(self, path: str | os.PathLike, holder: str = "run") -> None:
        text = os.fspath(path)
        if not text.strip():
            raise OutputError("--out needs a folder name, got an empty one")
        self.given = text
        self.holder = holder
        # realpath resolves symlinks component by component, `..` after a link included
        self.path = Path(os.path.realpath(text))
        if not self.path.name:
            raise OutputError(f"--out {text} is the root folder; give a folder for the run")
        self.lock_path = self.path.parent / auxiliary_name(self.path.name, ".lock")
        self.created_parents: list[Path] = []
        self._fd: int | None = None
        self._folder_fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, making the folders above ``path`` that are missing.

        Raises
        ------
        OutputError
            Another process holds the folder, or the file system refused.
        """
        try:
            self._fd = self._take()
            self.lock_folder()
        except OSError as error:
            self.release()
            reason = describe_os_error(error)
            if error.filename == str(self.lock_path):  # name the folder the user knows
                error.filename = str(self.path.parent)
            where = f" ({error.filename})" if error.filename else ""
            raise OutputError(f"cannot use --out {self.given}: {reason}{where}") from None
        except BaseException:
            self.release()
            raise

    def _in_use(self, holder_pid: str = "") -> OutputError:
        pid = f" (process {holder_pid})" if holder_pid.isdigit() else ""
        return OutputError(
            f"{self.given} is in use by another {self.holder}{pid}; wait for it to end or "
            "choose another --out"
        )

    def _take(self) -> int:
        for _ in range(100):
            self._make_parents()
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                if self.lock_path.parent.is_dir():
                    raise
                continue  # a failed run removed the parent folder it had made: make it again
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip()
                os.close(fd)
                raise self._in_use(holder) from None
            # a holder that was releasing may have unlinked the file we opened: a lock on
            # it guards nothing, so take the lock again on the file now at the path
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.lock_path))
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                return fd
            os.close(fd)
        raise OSError(errno.EAGAIN, "the lock file kept disappearing", str(self.lock_path))

    def lock_folder(self) -> None:
        """Lock the folder's own directory, if it exists (again after it was replaced)."""
        if self._folder_fd is not None:
            os.close(self._folder_fd)
            self._folder_fd = None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            return  # nothing there yet, or a file (refused by the caller)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._in_use() from None
        self._folder_fd = fd

    def _make_parents(self) -> None:
        missing = []
        parent = self.path.parent
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        for folder in reversed(missing):
            try:
                folder.mkdir()
            except FileExistsError:
                continue  # made meanwhile by another process (a grid's workers start together)
            self.created_parents.append(folder)

    def remove_created_parents(self) -> None:
        """Remove the folders :meth:`acquire` made, if they are still empty."""
        for folder in reversed(self.created_parents):
            try:
                folder.rmdir()
            except OSError:
                break  # not empty: something else was put there meanwhile
        self.created_parents.clear()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Release the lock and delete the lock file."""
        if self._folder_fd is not None:
            os.close(self._folder_fd)
            self._folder_fd = None
        if self._fd is not None:
            # unlink while still holding the lock: a process that opened the old file
            # sees it is no longer at the path and takes the lock on a new one
            self.lock_path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
        self.remove_created_parents()


class RunFolder:
    """A run folder held by this process; see the module docstring for what it guarantees.

    Made by :meth:`open`, which takes the lock and checks that ``mode`` fits what the
    folder holds. The life of a run: :meth:`open` → (set-up) → :meth:`start` → writes
    with :meth:`write_json`, :meth:`write_text`, :meth:`write_bytes` → :meth:`commit`
    after the first checkpoint → more writes → :meth:`close` (or leave the ``with``
    block). Until :meth:`commit`, the files are written to :attr:`location` (a staging
    folder when replacing) and :meth:`close` removes them again.

    Parameters
    ----------
    path : str or os.PathLike
        The run folder.
    files : sequence of str
        The names of the files a run of this kind writes; a folder holding any of them
        holds a run.
    checkpoint : str, optional
        The file without which a run cannot be resumed (it was stopped before its first
        checkpoint); ``None``: runs of this kind are never resumed.
    """

    def __init__(
        self, path: str | os.PathLike, files: Sequence[str], checkpoint: str | None = None
    ) -> None:
        self.lock = FolderLock(path)
        # the resolved folder: a symlinked --out is used, and replaced, at its target
        self.path = self.lock.path
        self.given = self.lock.given
        self.files = tuple(files)
        self.checkpoint = checkpoint
        self.mode = "new"
        self.location = self.path
        self.committed = False
        self._started = False
        self._made_folder = False
        self._written: set[str] = set()

    # -- opening ------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        files: Sequence[str],
        *,
        mode: str = "new",
        checkpoint: str | None = None,
    ) -> RunFolder:
        """Lock ``path`` and check that ``mode`` fits what it holds.

        Parameters
        ----------
        path, files, checkpoint
            As for :class:`RunFolder`.
        mode : {"new", "resume", "overwrite"}
            ``new``: the folder must hold no run. ``resume``: it must hold one with its
            checkpoint. ``overwrite``: a run it holds is replaced at :meth:`commit`.

        Raises
        ------
        OutputError
            One line: another process holds the folder, the mode does not fit what it
            holds, or the file system refused (a read-only folder, a name too long, a
            file where a folder should be).
        """
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        folder = cls(path, files, checkpoint)
        folder.mode = mode
        folder._check_inputs()
        folder.lock.acquire()
        try:
            if folder._recover_interrupted_replacement():
                folder.lock.lock_folder()
            folder._check_mode()
            folder._guard_own_files()
        except OSError as error:
            folder.close()
            raise OutputError(
                f"cannot use --out {folder.given}: {describe_os_error(error)}"
            ) from None
        except BaseException:
            folder.close()
            raise
        return folder

    def _check_inputs(self) -> None:
        """Refuse a folder whose run files (or, when replacing it, whose anything) would
        be an input the user named for this command (:func:`guard_input`)."""
        for name in self.files:
            found = guarded_as(self.path / name)
            # another holder's own files are its lock's business
            if found is not None and found.named and found.owner is None:
                raise OutputError(
                    f"--out {self.given}: its {name} would be {found.what}; an output never "
                    "replaces an input of the command: choose another --out"
                )
        if self.mode != "overwrite":
            return
        deleted = named_inputs_below(self.path)
        if deleted:
            resolved, entry = deleted[0]
            raise OutputError(
                f"--out {self.given} --overwrite would delete {resolved}, {entry.what}: "
                "choose another --out"
            )

    def _guard_own_files(self) -> None:
        """Guard this run's files from the command's other outputs (a ``--predictions``
        naming ``metrics.jsonl``) until :meth:`close`."""
        for name in self.files:
            guard_input(self.path / name, f"the {name} of the run in {self.given}", owner=self)

    def _siblings(self, kind: str) -> list[Path]:
        """This folder's ``staging`` or ``replaced`` folders (prefix and 8 hex digits, so
        another folder's auxiliary names never match)."""
        prefix = auxiliary_name(self.path.name, f".{kind}-")
        try:
            entries = list(self.path.parent.iterdir())
        except OSError:
            return []
        return [
            entry
            for entry in entries
            if entry.name.startswith(prefix)
            and re.fullmatch(TOKEN, entry.name[len(prefix) :])
            and entry.is_dir()
        ]

    def _recover_interrupted_replacement(self) -> bool:
        """Finish or undo a replacement whose process died (we hold the lock, so no
        living process owns these folders); whether the old run was put back."""
        replaced = self._siblings("replaced")
        restored = False
        if replaced and not self.path.exists():
            # died between moving the old run aside and moving the new one in: put the
            # old run back, as if the replacement had failed before its commit
            os.rename(replaced.pop(), self.path)
            restored = True
        for stale in replaced + self._siblings("staging"):
            shutil.rmtree(stale, ignore_errors=True)
        if self.path.is_dir():  # temporary files of a write that was killed
            for partial in self.path.glob(".tmp-*.part"):
                partial.unlink(missing_ok=True)
        return restored

    def held_files(self) -> list[str]:
        """The run files already in the folder, in the order of ``files``."""
        return [name for name in self.files if (self.path / name).exists()]

    def _check_mode(self) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise OutputError(f"--out {self.given} is a file, not a folder; choose another --out")
        held = self.held_files()
        self._check_other_files(held)
        resumable = bool(held) and (self.checkpoint is None or self.checkpoint in held)
        # --overwrite is no way out for a folder holding an input of the command: it would
        # be refused (_check_inputs), so it is not suggested
        replaceable = not named_inputs_below(self.path)
        if held and not resumable and self.mode != "overwrite":
            again = "start it again with --overwrite, or " if replaceable else ""
            raise OutputError(
                f"{self.given} holds a run stopped before its first {self.checkpoint} was "
                f"written, so there is nothing to resume; {again}choose another --out"
            )
        if self.mode == "new" and held:
            replace = "--overwrite to replace it, " if replaceable else ""
            raise OutputError(
                f"{self.given} already holds a run ({', '.join(held)}); use --resume to "
                f"continue it, {replace}or another --out"
            )
        if self.mode == "resume" and not held:
            raise OutputError(f"--resume: no run in {self.given}; start without --resume")
        if self.mode == "overwrite" and not held:
            self.mode = "new"  # nothing to replace
        # a run being resumed was kept before this process came: close() must not undo it
        self.committed = self.mode == "resume"

    def _check_other_files(self, held: Sequence[str]) -> None:
        """Refuse a folder holding files that are not a run's where they could be lost.

        ``overwrite`` replaces the whole folder, so any other file (a hidden one too)
        refuses it; ``new`` refuses visible ones, so ``--out .`` cannot write a run into a
        project, but not hidden ones (``.DS_Store``); ``resume`` of a folder holding a run
        writes only the run's files, so a plot or notes saved beside them stay as they are.
        """
        if not self.path.is_dir() or (self.mode == "resume" and held):
            return
        others = sorted(
            entry.name
            for entry in self.path.iterdir()
            if entry.name not in self.files
            and not entry.name.startswith(".tmp-")
            and (self.mode == "overwrite" or not entry.name.startswith("."))
        )
        if others:
            shown = ", ".join(others[:3]) + (", …" if len(others) > 3 else "")
            advice = (
                "move them away to replace the run, or choose another --out"
                if self.mode == "overwrite" and held
                else "give a new or empty folder as --out"
            )
            raise OutputError(f"{self.given} holds files that are not a run's ({shown}); {advice}")

    # -- writing --------------------------------------------------------------------------

    def start(self) -> None:
        """Create the folder files are written to: the run folder, or, when replacing a
        run, a staging folder beside it. Call it once set-up has succeeded, so a failed
        set-up leaves the disk as it was."""
        try:
            if self.mode == "overwrite":
                staging = auxiliary_name(self.path.name, f".staging-{secrets.token_hex(4)}")
                self.location = self.path.parent / staging
                self.location.mkdir()
            else:
                self._made_folder = not self.path.exists()
                self.path.mkdir(exist_ok=True)
                if self._made_folder:
                    self.lock.lock_folder()
        except OSError as error:
            raise OutputError(
                f"cannot create the run folder {self.given}: {describe_os_error(error)}"
            ) from None
        self._started = True

    def write_bytes(self, name: str, data: bytes, mode: int = FILE_MODE) -> None:
        """Replace file ``name`` with ``data`` atomically; on failure the old file stays.

        Parameters
        ----------
        name : str
            The run file.
        data : bytes
            Its content.
        mode : int
            Its permission bits (``0o600`` for a secret; :func:`write_atomically`).
        """
        if not self._started:
            raise RuntimeError("RunFolder.start() must come before the first write")
        path = self.location / name
        try:
            write_atomically(path, data, mode)
        except OSError as error:
            kept = " (its previous version is kept)" if path.exists() else ""
            raise OutputError(
                f"cannot write {self.path / name}: {describe_os_error(error)}{kept}"
            ) from None
        self._written.add(name)

    def write_text(self, name: str, text: str) -> None:
        """Replace text file ``name`` atomically."""
        self.write_bytes(name, text.encode())

    def write_json(self, name: str, payload: Any) -> None:
        """Replace ``name`` with ``payload`` as strict, indented JSON, atomically."""
        self.write_text(name, strict_json(payload, indent=2) + "\n")

    def commit(self) -> None:
        """Keep the run from now on: a replacement takes the old run's place.

        Call it once the run has something worth keeping (its first checkpoint). For a
        replacement, the old folder is moved aside, the staging folder moved to the run
        folder's name and the old one deleted; if the process dies in between, the next
        :meth:`open` of the folder puts the old run back or finishes the deletion.
        """
        if self.committed:
            return
        if self.mode == "overwrite":
            replaced = self.path.parent / auxiliary_name(
                self.path.name, f".replaced-{secrets.token_hex(4)}"
            )
            try:
                if self.path.exists():  # unless the old run was deleted meanwhile
                    os.rename(self.path, replaced)
                os.rename(self.location, self.path)
            except OSError as error:
                raise OutputError(
                    f"cannot move the new run into {self.given}: {describe_os_error(error)}; "
                    f"it is in {self.location}"
                ) from None
            self.location = self.path
            shutil.rmtree(replaced, ignore_errors=True)
            self.lock.lock_folder()  # the folder now at the path is the new run's
        self.committed = True
        self.lock.created_parents.clear()  # they now hold a kept run

    # -- closing --------------------------------------------------------------------------

    def close(self) -> None:
        """Release the lock. A run not committed leaves nothing behind: a staging folder
        is deleted, and a new run's files (and the folders made for it) are removed."""
        if self._started and not self.committed:
            if self.mode == "overwrite":
                shutil.rmtree(self.location, ignore_errors=True)
            else:
                for name in self._written:
                    (self.path / name).unlink(missing_ok=True)
                if self._made_folder:
                    try:
                        self.path.rmdir()
                    except OSError:
                        pass  # not empty: something else was put there meanwhile
            self._started = False
        self.lock.release()
        for name in self.files:
            release_input(self.path / name, owner=self)
        if not self.committed:
            self.lock.remove_created_parents()

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
