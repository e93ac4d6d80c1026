"""Files that are never left half-written: atomic writes through a sibling temporary, one-process locks on
run directories, the clean-up of temporaries a killed run left behind, and checked paths.

Every writer here turns a full disk into one NmtError line, and SIGINT or SIGTERM during the write into a
clean stop (`Interrupted`, signals.py), and removes its temporary; a file that existed before the write is untouched
until the final rename. A temporary that SIGKILL left is removed by the next run that writes the same path, or
by the next run that writes into its directory (`remove_abandoned_temporaries`: a live writer's is locked).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, BinaryIO, TextIO, cast

from nmt_cli.errors import NmtError
from nmt_cli.signals import causes, interruption, stop_on_signals

logger = logging.getLogger(__name__)

TMP_SUFFIX = ".tmp"
LOCK_FILE = ".nmt.lock"


class DiskFullError(NmtError):
    """The device ran out of space while writing; the temporary was removed."""


class BusyError(NmtError):
    """Another nmt process holds the lock on a run directory."""


def tmp_path_of(path: Path) -> Path:
    return path.with_name(path.name + TMP_SUFFIX)


def is_disk_full(error: BaseException) -> bool:
    """True when `error` or an exception it was raised from is ENOSPC (torch chains several on a full disk)."""
    return any(
        (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) or "No space left on device" in str(e)
        for e in causes(error)
    )


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_parent(path: Path, what: str) -> None:
    """Create the directory a file is written into; NmtError naming the option when that is impossible."""
    if path.is_dir():
        raise NmtError(f"{what} {path} is a directory; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NmtError(f"cannot create the directory of {what} {path}: {e.strerror}") from None


@contextmanager
def _atomic_file(path: Path, mode: str, what: str, kept: str | None) -> Iterator[IO[Any]]:
    """`path.tmp` opened in `mode` for the block; fsynced and renamed over `path` when the block succeeds.

    A `path.tmp` a killed run left is replaced; SIGINT and SIGTERM in the block stop it cleanly.
    """
    tmp = tmp_path_of(path)
    existed = path.exists()
    kept = kept or (f"the previous {what} is intact" if existed else "nothing was written")
    try:
        with stop_on_signals(
            f"{what} {path} was not written" + (f"; the previous {what} is intact" if existed else "")
        ):
            try:
                with open_held(tmp, mode) as f:
                    yield f
                    f.flush()
                    os.fsync(f.fileno())
            except BaseException:
                remove_quietly(tmp)  # here, where a second signal is ignored
                raise
        os.replace(tmp, path)
    except BaseException as e:
        remove_quietly(tmp)
        error = user_error(e, str(path), kept, what)
        if error is e:
            raise
        raise error from None
    fsync_dir(path.parent)


def remove_quietly(tmp: Path) -> None:
    """Remove a temporary file a failed write leaves, if it can be: where the directory refuses it (read-only, the
    reason the write failed) the write's own error is the one to report, not this one's."""
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


def open_held(tmp: Path, mode: str) -> IO[Any]:
    """`tmp` opened in `mode` and held with an flock until it is closed, so that `remove_abandoned_temporaries`
    leaves it alone: opened again if a clean-up removed it between the open and the lock."""
    while True:
        f = tmp.open(mode, encoding=None if "b" in mode else "utf-8")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            if os.fstat(f.fileno()).st_ino == os.stat(tmp).st_ino:
                return f
        except FileNotFoundError:
            pass
        except BaseException:
            f.close()
            raise
        f.close()


def user_error(e: BaseException, where: str, kept: str, what: str = "") -> BaseException:
    """What a failed write of `where` (a path, or an option and its path) raises: the signal that stopped it,
    or a full disk or another OSError as one NmtError line; anything else (a bug) as it was."""
    stopped = interruption(e)
    if stopped is not None:
        return stopped
    if is_disk_full(e):
        return DiskFullError(f"no space left on device writing {where}; {kept}")
    if isinstance(e, OSError):
        return NmtError(f"cannot write {what + ' ' if what else ''}{where}: {e.strerror or e}")
    return e


def atomic_write(path: Path, write: Callable[[BinaryIO], object], what: str = "file", kept: str | None = None) -> None:
    """Write `path` through `path.tmp`, fsync, then rename over it: readers see the old file or the new one.

    `kept` ends the full-disk message (default: the previous file is intact, or nothing was written).

    Raises:
        DiskFullError: the device is full; `path.tmp` is removed and an existing `path` is intact.
        NmtError: any other OSError, named with the file.
    """
    with _atomic_file(path, "wb", what, kept) as f:
        write(cast(BinaryIO, f))


def atomic_write_text(path: Path, text: str, what: str = "file") -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")), what)


@contextmanager
def atomic_text_output(path: Path, what: str = "file") -> Iterator[TextIO]:
    """A text file written as `path.tmp` and renamed to `path` when the block ends without an error.

    On an error the temporary is removed (an existing `path` is left as it was); a full disk is a DiskFullError.
    """
    with _atomic_file(path, "w", what, None) as f:
        yield cast(TextIO, f)


def temp_dir_beside(path: Path, what: str) -> Path:
    """A new private directory `.NAME.tmp-XXXX` beside `path` (its parents created) to build `path` in,
    then publish with `rename_dir_into_place`; NmtError naming the option when it cannot be made.

    `path` is resolved first: `.` or a symbolic link names the directory it stands for.
    """
    path = path.resolve()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    except OSError as e:
        raise NmtError(f"cannot write {what} {path}: {e.strerror}") from None


def rename_dir_into_place(tmp: Path, path: Path) -> None:
    """Rename a finished `temp_dir_beside` directory to `path`, with the mode a new directory gets under the
    umask (mkdtemp makes it 0700). An existing `path` (empty, or an earlier result the caller has chosen to
    replace) is moved aside first and removed only once the new one is in place, so that an interruption
    leaves one of the two whole."""
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)
    path = path.resolve()
    if not path.exists():
        tmp.rename(path)
        return
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old)


@contextmanager
def directory_in_place(path: Path, what: str, command: str) -> Iterator[Path]:
    """A temporary directory beside `path` for the block to build `path` in, renamed to `path` when the block
    succeeds (an earlier `path` the caller accepted to replace goes only then).

    One writer at a time: a lock beside `path` (`.NAME.lock`), under which the temporary directories of
    killed runs (`.NAME.tmp-*`) are removed first. SIGINT and SIGTERM stop the block cleanly. On any error
    the temporary directory is removed; a full disk is a DiskFullError.
    """
    try:
        path.resolve().parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        reason = "a parent of it is a file" if isinstance(e, (FileExistsError, NotADirectoryError)) else e.strerror
        raise NmtError(f"cannot write {what} {path}: {reason}") from None
    where = path.resolve()  # `.` names the current directory: its lock goes beside it, not in it
    ours = f".{glob.escape(where.name)}.tmp-*"  # under the lock, once the stale ones are gone, only this run's
    with run_lock(where.parent / f".{where.name}.lock", command, path):
        remove_stale_temporaries(where.parent, (ours,))
        existed = path.exists()
        kept = "nothing was replaced" if existed else "nothing was written"
        try:
            # The signals are ours before the temporary directory exists: a SIGTERM just after mkdtemp would
            # otherwise kill the process with it left behind and no error line.
            with stop_on_signals(f"{what} {path} was not written" + ("; the earlier one is intact" if existed else "")):
                tmp = temp_dir_beside(path, what)
                try:
                    yield tmp
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)  # here, where a second signal is ignored
                    raise
            rename_dir_into_place(tmp, path)
        except BaseException as e:
            for left in where.parent.glob(ours):  # this run's, even one mkdtemp made but had not yet returned
                shutil.rmtree(left, ignore_errors=True)
            error = user_error(e, f"{what} {path}", kept)
            if error is e:
                raise
            raise error from None


def log_removed(removed: list[Path]) -> None:
    if removed:
        names = ", ".join(p.name for p in removed)
        logger.info("removed %d temporary file(s) left by an interrupted run: %s", len(removed), names)


def remove_stale_temporaries(directory: Path, patterns: tuple[str, ...] = (f"*{TMP_SUFFIX}",)) -> list[Path]:
    """Delete temporaries a killed run left in `directory` (call it holding the directory's lock)."""
    removed = []
    for pattern in patterns:
        for path in directory.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    log_removed(removed)
    return removed


def remove_abandoned_temporaries(directory: Path, patterns: tuple[str, ...]) -> list[Path]:
    """Delete the temporaries of `patterns` in `directory` that no live process is writing, for a directory that
    several runs may write into at once (generate's --results-path, average's --output directory), without a lock
    on it. The writers here hold an flock on their temporary (`open_held`), which the kernel drops when the
    process dies: a temporary that can be locked is a killed run's. Regular files only; links are left alone."""
    removed = []
    for pattern in patterns:
        for path in directory.glob(pattern):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:  # a link, gone meanwhile, or not ours to read
                continue
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                    path.unlink()
                    removed.append(path)
            except OSError:  # locked: a live writer's; or replaced or removed meanwhile
                continue
            finally:
                os.close(fd)
    log_removed(removed)
    return removed


@contextmanager
def run_lock(lock_path: Path, command: str, directory: Path) -> Iterator[None]:
    """Hold an exclusive fcntl lock on `lock_path` for the duration; a second holder fails at once.

    The kernel drops the lock when its process dies, so a lock file left by a killed run never blocks.
    The file carries the holder's pid for the message, and is removed on release.
    """
    fd = acquire(lock_path, command, directory)
    try:
        yield
    finally:
        lock_path.unlink(missing_ok=True)  # still holding the lock: no one can have taken this file meanwhile
        os.close(fd)


def acquire(lock_path: Path, command: str, directory: Path) -> int:
    """Lock `lock_path`, retrying when the file was replaced between open and lock (a releaser unlinked it)."""
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise NmtError(f"cannot create the lock file {lock_path}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise BusyError(
                f"another nmt {command} is using {directory} (pid {pid}); wait for it to finish or stop it"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)


def require_file(path: Path, what: str) -> None:
    """NmtError unless `path` is an existing regular file (a directory is named as one, not as missing)."""
    if path.is_dir():
        raise NmtError(f"{what} {path} is a directory; give a file")
    if not path.exists():
        raise NmtError(f"{what} {path} does not exist")
