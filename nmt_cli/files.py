"""Files never left half-written: atomic writes through a sibling temporary, locks on run directories, the
clean-up of temporaries a killed run left, and checked paths.

Every writer turns a full disk into one NmtError line and SIGINT or SIGTERM into a clean stop (`Interrupted`),
removes its temporary, and leaves an existing file untouched until the final rename.
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
    """`path.tmp` opened in `mode` for the block (replacing a killed run's); fsynced and renamed over `path`."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
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
    """Remove a failed write's temporary if it can be: where it cannot, the write's own error is the one to report."""
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


def open_held(tmp: Path, mode: str) -> IO[Any]:
    """`tmp` opened in `mode`, flocked until closed so that `remove_abandoned_temporaries` leaves it alone."""
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
    """What a failed write of `where` raises: the signal that stopped it, an OSError as one NmtError line, or
    anything else (a bug) as it was."""
    stopped = interruption(e)
    if stopped is not None:
        return stopped
    if is_disk_full(e):
        return DiskFullError(f"no space left on device writing {where}; {kept}")
    if isinstance(e, OSError):
        return NmtError(f"cannot write {what + ' ' if what else ''}{where}: {e.strerror or e}")
    return e


def atomic_write(path: Path, write: Callable[[BinaryIO], object], what: str = "file", kept: str | None = None) -> None:
    """Write `path` through `path.tmp`, fsync, then rename over it; `kept` ends the full-disk message.

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
    """A text file written as `path.tmp` and renamed to `path` when the block ends without an error."""
    with _atomic_file(path, "w", what, None) as f:
        yield cast(TextIO, f)


def rename_dir_into_place(tmp: Path, path: Path) -> None:
    """Rename a finished temporary directory to `path`, with the umask's mode (mkdtemp makes it 0700). An existing
    `path` is moved aside and removed only once the new one is in place: an interruption leaves one whole."""
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
    """A temporary directory beside `path` for the block to build `path` in, renamed to `path` when it succeeds.

    One writer at a time: a lock beside `path` (`.NAME.lock`), under which killed runs' `.NAME.tmp-*` are removed.
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
                try:
                    tmp = Path(tempfile.mkdtemp(prefix=f".{where.name}.tmp-", dir=where.parent))
                except OSError as e:
                    raise NmtError(f"cannot write {what} {where}: {e.strerror}") from None
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
    """Delete the temporaries of `patterns` in `directory` that no live process is writing, without a lock on the
    directory: a writer flocks its temporary (`open_held`), so one that can be locked is a killed run's. Regular
    files only."""
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
    """Hold an exclusive flock on `lock_path` (holding our pid) for the block; a second holder fails at once. The
    kernel drops the lock when its process dies, so a killed run's lock file never blocks."""
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
