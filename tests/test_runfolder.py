"""The run-folder mechanics on their own: the lock, atomic writes, the replacement built
beside the old run, and the recovery of a replacement whose process died."""

import errno
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from stratify import runfolder
from stratify.errors import CorruptRunError, OutputError
from stratify.files import read_file
from stratify.runfolder import RunFolder, auxiliary_name, strict_json, write_atomically

FILES = ("config.json", "metrics.jsonl", "checkpoint.pt")


def open_folder(path, mode="new"):
    return RunFolder.open(path, FILES, mode=mode, checkpoint="checkpoint.pt")


def make_run(path, epoch=1):
    """A folder holding a committed run whose checkpoint says ``epoch``."""
    with open_folder(path, "overwrite") as folder:
        folder.start()
        folder.write_json("config.json", {"epoch": epoch})
        folder.write_bytes("checkpoint.pt", f"epoch {epoch}".encode())
        folder.commit()


def contents(path):
    return {entry.name: entry.read_bytes() for entry in sorted(path.iterdir())}


def test_a_second_holder_is_refused_until_the_first_closes(tmp_path):
    first = open_folder(tmp_path / "run")
    with pytest.raises(
        OutputError, match=rf"run is in use by another run \(process {os.getpid()}\)"
    ):
        open_folder(tmp_path / "run")
    first.close()
    open_folder(tmp_path / "run").close()
    # the lock file goes with its holder: nothing is left beside the folder
    assert sorted(entry.name for entry in tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_killed_holder_releases_the_lock(tmp_path):
    script = (
        "import sys, time\n"
        "from stratify.runfolder import RunFolder\n"
        "RunFolder.open(sys.argv[1], ['checkpoint.pt'])\n"
        "print('locked', flush=True)\n"
        "time.sleep(60)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(OutputError, match=f"process {holder.pid}"):
            open_folder(tmp_path / "run")
    finally:
        holder.kill()
        holder.wait()
    # the kernel dropped the dead process's lock; its lock file is simply taken over
    open_folder(tmp_path / "run").close()


def test_a_new_run_that_is_not_committed_leaves_nothing(tmp_path):
    out = tmp_path / "a" / "b" / "run"
    folder = open_folder(out)
    folder.start()
    folder.write_json("config.json", {"x": 1})
    folder.close()
    assert not (tmp_path / "a").exists()  # the folders made for it are gone too


def test_a_committed_new_run_is_kept(tmp_path):
    with open_folder(tmp_path / "run") as folder:
        folder.start()
        folder.write_bytes("checkpoint.pt", b"1")
        folder.commit()
        folder.write_text("metrics.jsonl", "line\n")
    assert contents(tmp_path / "run") == {"checkpoint.pt": b"1", "metrics.jsonl": b"line\n"}
    assert [entry.name for entry in tmp_path.iterdir()] == ["run"]


def test_a_resumed_run_that_fails_before_its_next_checkpoint_keeps_its_files(tmp_path):
    make_run(tmp_path / "run", epoch=1)
    folder = open_folder(tmp_path / "run", "resume")
    folder.start()
    folder.write_json("config.json", {"epoch": 1, "epochs": 5})
    folder.close()  # e.g. the first resumed epoch diverged
    assert contents(tmp_path / "run") == {
        "checkpoint.pt": b"epoch 1",
        "config.json": b'{\n  "epoch": 1,\n  "epochs": 5\n}\n',
    }


def test_an_existing_empty_folder_stays_after_a_failed_run(tmp_path):
    (tmp_path / "run").mkdir()
    folder = open_folder(tmp_path / "run")
    folder.start()
    folder.write_json("config.json", {})
    folder.close()
    assert (tmp_path / "run").is_dir() and not any((tmp_path / "run").iterdir())


def test_a_replacement_is_built_beside_and_swapped_in_at_commit(tmp_path):
    make_run(tmp_path / "run", epoch=1)
    before = contents(tmp_path / "run")
    folder = open_folder(tmp_path / "run", "overwrite")
    folder.start()
    assert folder.location.parent == tmp_path and folder.location.name.startswith(".run.staging-")
    folder.write_bytes("checkpoint.pt", b"epoch 9")
    assert contents(tmp_path / "run") == before  # the old run is untouched until the commit
    folder.commit()
    assert contents(tmp_path / "run") == {"checkpoint.pt": b"epoch 9"}
    folder.write_text("metrics.jsonl", "after\n")
    folder.close()
    assert contents(tmp_path / "run") == {"checkpoint.pt": b"epoch 9", "metrics.jsonl": b"after\n"}
    assert [entry.name for entry in tmp_path.iterdir()] == ["run"]


def test_a_replacement_that_fails_before_its_commit_leaves_the_old_run(tmp_path):
    make_run(tmp_path / "run", epoch=1)
    before = contents(tmp_path / "run")
    folder = open_folder(tmp_path / "run", "overwrite")
    folder.start()
    folder.write_bytes("checkpoint.pt", b"half")
    folder.close()
    assert contents(tmp_path / "run") == before
    assert [entry.name for entry in tmp_path.iterdir()] == ["run"]


def test_the_next_open_repairs_a_replacement_whose_process_died(tmp_path):
    make_run(tmp_path / "run", epoch=1)
    before = contents(tmp_path / "run")
    # died while staging: a stale staging folder beside the intact old run
    stale = tmp_path / ".run.staging-0000dead"
    stale.mkdir()
    (stale / "checkpoint.pt").write_bytes(b"partial")
    # and a killed write left its temporary file inside the run
    (tmp_path / "run" / ".tmp-x.part").write_bytes(b"partial")
    open_folder(tmp_path / "run", "resume").close()
    assert contents(tmp_path / "run") == before
    assert [entry.name for entry in tmp_path.iterdir()] == ["run"]

    # died between moving the old run aside and moving the new one in: the old run is put back
    os.rename(tmp_path / "run", tmp_path / ".run.replaced-0000dead")
    (tmp_path / ".run.staging-000dead2").mkdir()
    with open_folder(tmp_path / "run", "resume") as folder:
        assert folder.held_files() == ["config.json", "checkpoint.pt"]
    assert contents(tmp_path / "run") == before
    assert [entry.name for entry in tmp_path.iterdir()] == ["run"]

    # died after the swap, while deleting the old run: the rest of it is deleted
    (tmp_path / ".run.replaced-000dead3").mkdir()
    # another folder's auxiliary names are not this folder's
    (tmp_path / ".run.staging-1.staging-0000beef").mkdir()
    open_folder(tmp_path / "run", "resume").close()
    assert sorted(entry.name for entry in tmp_path.iterdir()) == [
        ".run.staging-1.staging-0000beef",
        "run",
    ]


@pytest.mark.parametrize(
    "mode, message",
    [
        ("new", "already holds a run .*use --resume to continue it, --overwrite to replace it"),
        ("resume", None),
        ("overwrite", None),
    ],
)
def test_modes_against_a_complete_run(tmp_path, mode, message):
    make_run(tmp_path / "run")
    if message is None:
        open_folder(tmp_path / "run", mode).close()
    else:
        with pytest.raises(OutputError, match=message):
            open_folder(tmp_path / "run", mode)


@pytest.mark.parametrize("mode", ["new", "resume"])
def test_a_run_stopped_before_its_first_checkpoint_has_one_way_out(tmp_path, mode):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    # the same line whether the user tried to start again or to resume: --overwrite
    with pytest.raises(OutputError) as error:
        open_folder(tmp_path / "run", mode)
    assert str(error.value) == (
        f"{tmp_path / 'run'} holds a run stopped before its first checkpoint.pt was written, "
        "so there is nothing to resume; start it again with --overwrite, or choose another --out"
    )
    open_folder(tmp_path / "run", "overwrite").close()


def test_resume_needs_a_run(tmp_path):
    with pytest.raises(OutputError, match="no run in .*; start without --resume"):
        open_folder(tmp_path / "run", "resume")


@pytest.mark.parametrize("mode", ["new", "overwrite"])
def test_a_folder_holding_other_files_is_never_taken(tmp_path, mode):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(OutputError, match=r"holds files that are not a run's \(notes.txt\)"):
        open_folder(tmp_path, mode)
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("extra", ["accuracy.png", ".DS_Store"])
def test_resume_takes_a_run_whatever_lies_beside_it(tmp_path, extra):
    make_run(tmp_path / "run")
    (tmp_path / "run" / extra).write_bytes(b"the user's")
    with open_folder(tmp_path / "run", "resume") as folder:
        folder.start()
        folder.write_bytes("checkpoint.pt", b"epoch 2")
    assert contents(tmp_path / "run") == {
        extra: b"the user's",
        "checkpoint.pt": b"epoch 2",
        "config.json": b'{\n  "epoch": 1\n}\n',
    }
    # only a replacement, which would delete it, keeps the strict rule
    with pytest.raises(OutputError, match=rf"holds files that are not a run's \({extra}\)"):
        open_folder(tmp_path / "run", "overwrite")


def test_a_new_run_ignores_hidden_files_but_not_visible_ones(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".DS_Store").write_bytes(b"finder")
    with open_folder(tmp_path / "run") as folder:
        folder.start()
        folder.write_bytes("checkpoint.pt", b"epoch 1")
        folder.commit()
    assert sorted(contents(tmp_path / "run")) == [".DS_Store", "checkpoint.pt"]


@pytest.mark.parametrize("spelling", ["link", "real/../real", "elsewhere/../real"])
def test_the_lock_is_keyed_on_the_resolved_folder(tmp_path, spelling):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    (tmp_path / "away").mkdir()
    (tmp_path / "elsewhere").symlink_to("away/deeper")  # `..` of a link is its target's parent
    (tmp_path / "away" / "deeper").mkdir()
    (tmp_path / "away" / "real").mkdir()
    expected = tmp_path / ("away/real" if spelling.startswith("elsewhere") else "real")
    holder = open_folder(tmp_path / spelling)
    assert holder.path == expected
    try:
        for other in (str(expected), f"{tmp_path}/{spelling}"):
            with pytest.raises(OutputError, match="is in use by another run"):
                open_folder(other)
    finally:
        holder.close()
    open_folder(expected).close()


def test_overwriting_through_a_symlink_replaces_the_target_and_keeps_the_link(tmp_path):
    make_run(tmp_path / "real")
    (tmp_path / "link").symlink_to("real")
    with open_folder(tmp_path / "link", "overwrite") as folder:
        folder.start()
        folder.write_bytes("checkpoint.pt", b"new")
        folder.commit()
    assert (tmp_path / "link").is_symlink() and os.readlink(tmp_path / "link") == "real"
    assert (tmp_path / "real" / "checkpoint.pt").read_bytes() == b"new"
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["link", "real"]


def test_the_folder_itself_is_locked_so_another_path_to_it_meets_the_lock(tmp_path):
    make_run(tmp_path / "run")
    holder = open_folder(tmp_path / "run", "resume")
    try:
        # what a second path to the same folder (a bind mount) finds: the lock file beside
        # it is another file, but the folder's own lock is the same
        other = runfolder.FolderLock(tmp_path / "run")
        other.lock_path = tmp_path / ".another-name.lock"
        with pytest.raises(OutputError, match="is in use by another run"):
            other.acquire()
        assert not (tmp_path / ".another-name.lock").exists()
    finally:
        holder.close()


def test_a_file_given_as_the_folder_is_refused(tmp_path):
    (tmp_path / "run").write_text("a file")
    with pytest.raises(OutputError, match="is a file, not a folder"):
        open_folder(tmp_path / "run")
    with pytest.raises(OutputError, match=r"cannot use --out .*: Not a directory"):
        open_folder(tmp_path / "run" / "inner")


def test_names_at_the_file_system_limit_get_short_lock_and_staging_names(tmp_path):
    name = "n" * 250  # valid, but ".<name>.lock" would be too long
    assert len(auxiliary_name(name, ".replaced-01234567")) <= 255
    assert auxiliary_name(name, ".lock") != auxiliary_name("n" * 249 + "m", ".lock")
    # one stem for all of a folder's auxiliary names, so stale ones are found by prefix
    assert auxiliary_name(name, ".staging-0123abcd").startswith(auxiliary_name(name, ".staging-"))
    assert auxiliary_name("run", ".lock") == ".run.lock"
    make_run(tmp_path / name)
    (tmp_path / auxiliary_name(name, ".staging-0000dead")).mkdir()  # left by a killed run
    with open_folder(tmp_path / name, "overwrite") as folder:
        folder.start()
        folder.write_bytes("checkpoint.pt", b"new")
        folder.commit()
    assert (tmp_path / name / "checkpoint.pt").read_bytes() == b"new"
    assert [entry.name for entry in tmp_path.iterdir()] == [name]
    with pytest.raises(OutputError, match="File name too long"):
        open_folder(tmp_path / ("n" * 300))


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "checkpoint.pt"
    target.write_bytes(b"good")

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runfolder.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(target, b"new")
    assert target.read_bytes() == b"good"
    assert [entry.name for entry in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_a_new_version_is_written_beside_its_target_and_renamed_over_it(tmp_path, monkeypatch):
    # a rename is atomic only within one file system (and fails across two), so the
    # temporary file is made in the target's folder, never in the system's temporary one
    system_temporary = tmp_path / "system-tmp"
    system_temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_temporary))
    (tmp_path / "run").mkdir()
    target = tmp_path / "run" / "checkpoint.pt"
    target.write_bytes(b"old")
    renames = []
    rename = os.replace

    def recorded_rename(source, destination):
        renames.append((Path(source), Path(destination)))
        rename(source, destination)

    monkeypatch.setattr(runfolder.os, "replace", recorded_rename)
    write_atomically(target, b"new")
    assert target.read_bytes() == b"new"
    ((source, destination),) = renames
    assert destination == target and source.parent == target.parent
    assert list(system_temporary.iterdir()) == []
    assert [entry.name for entry in target.parent.iterdir()] == ["checkpoint.pt"]


def test_a_full_disk_is_one_line_naming_the_file_and_what_is_kept(tmp_path, monkeypatch):
    make_run(tmp_path / "run")
    folder = open_folder(tmp_path / "run", "resume")
    folder.start()
    monkeypatch.setattr(
        runfolder.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full"))
    )
    with pytest.raises(OutputError) as error:
        folder.write_bytes("checkpoint.pt", b"epoch 2")
    folder.close()
    assert str(error.value) == (
        f"cannot write {tmp_path / 'run' / 'checkpoint.pt'}: full (its previous version is kept)"
    )
    assert (tmp_path / "run" / "checkpoint.pt").read_bytes() == b"epoch 1"
    assert sorted(contents(tmp_path / "run")) == ["checkpoint.pt", "config.json"]


def test_files_get_the_usual_permissions(tmp_path):
    make_run(tmp_path / "run")
    mode = (tmp_path / "run" / "config.json").stat().st_mode & 0o777
    (tmp_path / "plain").write_text("x")
    assert mode == (tmp_path / "plain").stat().st_mode & 0o777


def test_strict_json_writes_null_for_non_finite_numbers():
    text = strict_json({"a": float("nan"), "b": [1.0, float("-inf")], "c": "x"})
    assert json.loads(text) == {"a": None, "b": [1.0, None], "c": "x"}


# -------------------------------------------------------------- files the user names


def test_write_file_replaces_a_regular_file_atomically(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    runfolder.write_file(target, b"new")
    assert target.read_bytes() == b"new"
    assert [entry.name for entry in tmp_path.iterdir()] == ["out.json"]


def test_write_file_writes_through_a_symlink_and_keeps_it(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "out.json").write_text("old")
    (tmp_path / "out.json").symlink_to("data/out.json")
    runfolder.write_file(tmp_path / "out.json", b"new")
    assert (tmp_path / "out.json").is_symlink()
    assert (tmp_path / "data" / "out.json").read_bytes() == b"new"


def test_write_file_writes_through_a_device_node(tmp_path):
    node = tmp_path / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        node.symlink_to("/dev/null")  # without CAP_MKNOD: a link to the same device
    runfolder.write_file(node, b"figures")
    assert stat.S_ISCHR(os.stat(node).st_mode)
    assert [entry.name for entry in tmp_path.iterdir()] == ["null"]


@pytest.mark.slow
def test_write_file_writes_into_a_fifo_that_is_read_and_refuses_one_that_is_not(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="no process reads this FIFO"):
        runfolder.write_file(fifo, b"figures")
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:  # until cat has opened its end
            try:
                runfolder.write_file(fifo, b"figures" * 20000)
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        assert reader.communicate(timeout=10)[0] == b"figures" * 20000
    finally:
        reader.kill()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["/dev/stdout", "/proc/self/fd/1"])
def test_write_file_to_stdout_writes_where_the_process_writes(tmp_path, name):
    script = (
        "import sys\n"
        "from stratify.runfolder import write_file\n"
        "print('before', flush=True)\n"
        f"write_file({name!r}, b'figures\\n')\n"
        "print('after')\n"
    )
    out = tmp_path / "out.txt"
    with open(out, "wb") as handle:  # stdout redirected to a regular file
        subprocess.run([sys.executable, "-c", script], stdout=handle, check=True)
    assert out.read_text() == "before\nfigures\nafter\n"
    piped = subprocess.run([sys.executable, "-c", script], capture_output=True, check=True)
    assert piped.stdout == b"before\nfigures\nafter\n"


def test_read_file_refuses_a_fifo_without_waiting(tmp_path):
    os.mkfifo(tmp_path / "metrics.jsonl")
    started = time.monotonic()
    with pytest.raises(CorruptRunError, match="metrics.jsonl is a FIFO, not a regular file"):
        read_file(tmp_path / "metrics.jsonl")
    assert time.monotonic() - started < 5


def test_a_parent_folder_made_meanwhile_by_another_worker_is_taken_not_refused(
    tmp_path, monkeypatch
):
    # two workers of one grid start together: both see the grid folder missing, one makes
    # it first, and the other's mkdir meets it (FileExistsError); it must go on, and must
    # not count the folder as its own to remove
    parent = tmp_path / "seeds"
    parent.mkdir()
    real_exists = Path.exists
    seen = []

    def exists_once_missing(path):
        if path == parent and not seen:
            seen.append(path)
            return False  # the other worker makes it right after this check
        return real_exists(path)

    monkeypatch.setattr(Path, "exists", exists_once_missing)
    lock = runfolder.FolderLock(parent / "seed-0")
    lock.acquire()
    try:
        assert seen and lock.held and lock.created_parents == []
    finally:
        lock.release()


def test_read_checkpoint_takes_a_path_as_a_string(tmp_path):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(runfolder.array_checkpoint_bytes({"w": np.arange(3.0), "epoch": 2}))
    from_string = runfolder.read_checkpoint(str(path))
    assert from_string["epoch"] == 2 and np.array_equal(from_string["w"], np.arange(3.0))
    assert np.array_equal(runfolder.read_checkpoint(path)["w"], from_string["w"])
