"""File primitives with their durability spelled out, over one I/O seam.

Every system call the file backends make goes through a :class:`FileSystem`; tests
inject faults by subclassing it (fail the Nth ``fdatasync``, short-write, ENOSPC).
Nothing here knows about records: it moves bytes durably.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import stat
import sys
import time
import weakref
from collections.abc import Iterable, Iterator

import filelock

from .contract import AppendFailed, OwnershipLost, SessionLocked, SessionLogError

O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
FILE_MODE = 0o600
DIR_MODE = 0o700
PROBE_GRACE = 0.05
"""Seconds a lock attempt keeps trying even with timeout 0: a scan's ownership probe
holds a shared lock for microseconds and must not make a writer fail."""
LOCK_POLL = 0.005
"""Seconds between two attempts at a lock another process holds."""


class NotARegularFile(OSError):
    """A FIFO, device, socket, directory or symbolic link where a session, lock or quarantine file
    belongs: refused at open, before any byte is read (reading a FIFO would hang)."""


class FileSystem:
    """The seam: thin wrappers over ``os``. Subclass to inject faults."""

    def open(self, path: str, flags: int, mode: int = FILE_MODE) -> int:
        """Open ``path``; unless ``flags`` asks for a directory, only a regular file:
        never through a symlink (O_NOFOLLOW), never blocking on a FIFO or device
        (O_NONBLOCK; it changes nothing for a regular file), and anything else is
        refused with :class:`NotARegularFile` naming the path before it is read."""
        if flags & O_DIRECTORY:
            return os.open(path, flags | O_CLOEXEC, mode)
        try:
            fd = os.open(path, flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, mode)
        except OSError as exc:
            if exc.errno == errno.ELOOP and os.path.islink(path):
                raise NotARegularFile(
                    errno.ELOOP, "a symbolic link (never opened through a link: name the file it points to, "
                    f"{os.path.realpath(path)})", path,
                ) from exc
            raise
        try:
            kind = stat.S_IFMT(os.fstat(fd).st_mode)
        except BaseException:
            os.close(fd)
            raise
        if kind != stat.S_IFREG:
            os.close(fd)
            raise NotARegularFile(errno.EINVAL, f"not a regular file ({_FILE_KINDS.get(kind, 'special file')})", path)
        return fd

    def close(self, fd: int) -> None:
        os.close(fd)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        return os.pread(fd, n, offset)

    def fsync(self, fd: int) -> None:
        if sys.platform == "darwin":  # pragma: no cover - Linux is the target
            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
        else:
            os.fsync(fd)

    if sys.platform == "darwin":  # pragma: no cover - Linux is the target
        def fdatasync(self, fd: int) -> None:
            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)
    else:
        def fdatasync(self, fd: int) -> None:
            os.fdatasync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def fstat(self, fd: int) -> os.stat_result:
        return os.fstat(fd)

    def fchmod(self, fd: int, mode: int) -> None:
        os.fchmod(fd, mode)

    def stat(self, path: str) -> os.stat_result:
        return os.stat(path, follow_symlinks=False)

    def link(self, src: str, dst: str) -> None:
        os.link(src, dst, follow_symlinks=False)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def mkdir(self, path: str, mode: int = DIR_MODE) -> None:
        os.mkdir(path, mode)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def flock(self, fd: int, operation: int) -> None:
        fcntl.flock(fd, operation)

    def lock_descriptor(self, fd: int, *, blocking: bool) -> bool:
        """Take the exclusive lock on ``fd`` (filelock's primitive on a descriptor this
        seam opened); with ``blocking=False``, False when another process holds it."""
        return filelock.lock_descriptor(fd, blocking=blocking, poll_interval=LOCK_POLL)

    def unlock_descriptor(self, fd: int) -> None:
        filelock.unlock_descriptor(fd)


OS = FileSystem()

_FILE_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


def read_head(path: str, n: int, fs: FileSystem = OS) -> bytes:
    """The first ``n`` bytes of the regular file at ``path``, or nothing for a missing or
    unreadable file, a FIFO, a device or a link (the seam's open never blocks and never
    follows a link): what content sniffing reads before it decides anything."""
    try:
        fd = fs.open(path, os.O_RDONLY)
    except OSError:
        return b""
    try:
        return fs.pread(fd, n, 0)
    except OSError:
        return b""
    finally:
        fs.close(fd)


def fsync_dir(fs: FileSystem, directory: str) -> None:
    """After this, entries created, linked or unlinked in ``directory`` survive power loss."""
    fd = fs.open(directory, os.O_RDONLY | O_DIRECTORY)
    try:
        fs.fsync(fd)
    finally:
        fs.close(fd)


def file_state(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What must not change for a file to be the one this process last saw at a path:
    its inode, size, mtime and ctime (no one can set ctime, so neither a copy with an old
    mtime nor a new file on a reused inode number passes)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


# The files whose name this process has made durable, by path: the file_state each had
# when this process last knew its name durable. Keyed by path and state, not by inode
# number alone: a file deleted outside the engine frees its inode number for a new file
# whose name may not be durable yet. Reset in a forked child, which is a new process.
_DURABLE_NAMES: dict[str, tuple[int, int, int, int, int]] = {}
_DURABLE_NAMES_PID = os.getpid()


def _durable_names() -> dict[str, tuple[int, int, int, int, int]]:
    global _DURABLE_NAMES_PID
    if os.getpid() != _DURABLE_NAMES_PID:
        _DURABLE_NAMES.clear()
        _DURABLE_NAMES_PID = os.getpid()
    return _DURABLE_NAMES


def ensure_name_durable(fs: FileSystem, directory: str, path: str, st: os.stat_result) -> None:
    """Make the name ``path`` of the open file whose ``fstat`` is ``st`` durable in
    ``directory``, once per process and file: a ``create`` that died after ``link()`` and
    before its directory fsync left a name that power loss may still take away, and an
    append acknowledged into that file would go with it."""
    names = _durable_names()
    state = file_state(st)
    if names.get(path) == state:
        return
    fsync_dir(fs, directory)  # after this the file's name survives power loss
    names[path] = state


def name_still_durable(path: str, st: os.stat_result) -> None:
    """The file at ``path`` whose name this process made durable is now ``st``: it changed
    only by this process's own writes while it held the session's lock."""
    names = _durable_names()
    if path in names:
        names[path] = file_state(st)


def forget_name(path: str) -> None:
    """The file at ``path`` was unlinked: a new file there starts with an undurable name."""
    _durable_names().pop(path, None)


def write_all(fs: FileSystem, fd: int, data: bytes) -> None:
    """Write every byte of ``data``, looping over short writes."""
    if not data:
        return
    n = fs.write(fd, data)
    if n == len(data):  # one write took it all, as a regular file's write does
        return
    view = memoryview(data)
    while True:
        if n <= 0:  # pragma: no cover - a regular file never does this
            raise OSError(errno.EIO, "write returned 0")
        view = view[n:]
        if not view:
            return
        n = fs.write(fd, view)


def ensure_store_dir(fs: FileSystem, directory: str) -> None:
    """Create ``directory`` (mode 0700) if needed, durably linked into its parent; missing
    parents are created the same way first (as ``mkdir -p`` does). An existing directory
    is made durable in its parent too: its creator (another process creating the same
    store now, or one that died) may not have fsynced the parent yet. That is best
    effort: a parent this process may not read, or on a file system that cannot fsync a
    directory (a read-only image with a writable store bound into it), is left as it is;
    it was not made here."""
    try:
        fs.mkdir(directory, DIR_MODE)
    except FileExistsError:
        if not stat.S_ISDIR(fs.stat(directory).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", directory) from None
        try:
            fsync_dir(fs, os.path.dirname(os.path.abspath(directory)))
        except OSError:
            pass
        return
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(directory))
        if parent == os.path.abspath(directory):
            raise
        ensure_store_dir(fs, parent)
        ensure_store_dir(fs, directory)
        return
    # After this the new store directory survives power loss.
    fsync_dir(fs, os.path.dirname(os.path.abspath(directory)))


def temp_name(final_name: str) -> str:
    return f".{final_name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"


def publish_new(fs: FileSystem, directory: str, final_name: str, chunks: Iterable[bytes]) -> None:
    """Materialize ``directory/final_name`` holding ``chunks``, atomically and durably.

    Temp file (O_EXCL|O_NOFOLLOW, 0600), fsync, ``link`` to the final name (never over an
    existing file: FileExistsError), check the name is the temp's inode, fsync the
    directory, unlink the temp. After return the file and its content survive power loss.
    """
    tmp = os.path.join(directory, temp_name(final_name))
    final = os.path.join(directory, final_name)
    fd = fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW, FILE_MODE)
    try:
        try:
            for chunk in chunks:
                write_all(fs, fd, chunk)
            fs.fsync(fd)  # the content is durable under the temp name
            tmp_ino = fs.fstat(fd).st_ino
        finally:
            fs.close(fd)
        fs.link(tmp, final)
        st = fs.stat(final)
        if st.st_ino != tmp_ino:  # pragma: no cover - a racing replacement
            raise OSError(errno.EEXIST, "published name is not the temp file", final)
        fsync_dir(fs, directory)  # the final name survives power loss
    finally:
        try:
            fs.unlink(tmp)
        except FileNotFoundError:
            pass
    # The temp's removal need not be durable: a leftover temp is swept when its pid is dead.
    try:
        st = fs.stat(final)  # after the unlink, which changed its link count and ctime
    except OSError:
        return  # the first open makes the name durable again
    _durable_names()[final] = file_state(st)


def publish_replace(
    fs: FileSystem, directory: str, final_name: str, chunks: Iterable[bytes], *, expect: os.stat_result
) -> None:
    """Replace ``directory/final_name`` with ``chunks``, atomically and durably.

    Temp file (O_EXCL|O_NOFOLLOW, the replaced file's mode), fsync, then — only if the
    name still is the file ``expect`` describes (same inode, size and mtime: nobody
    replaced or appended to it meanwhile; else FileExistsError and nothing changes) —
    ``rename`` over it and fsync the directory. After return the new content survives
    power loss under the same name; a crash before the rename leaves the old file whole.
    """
    tmp = os.path.join(directory, temp_name(final_name))
    final = os.path.join(directory, final_name)
    fd = fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW, FILE_MODE)
    renamed = False
    try:
        try:
            fs.fchmod(fd, stat.S_IMODE(expect.st_mode))
            for chunk in chunks:
                write_all(fs, fd, chunk)
            fs.fsync(fd)  # the new content is durable under the temp name
        finally:
            fs.close(fd)
        now = fs.stat(final)
        if (now.st_ino, now.st_dev, now.st_size, now.st_mtime_ns) != (
                expect.st_ino, expect.st_dev, expect.st_size, expect.st_mtime_ns):
            raise FileExistsError(errno.EEXIST, "changed since it was read; nothing replaced", final)
        fs.rename(tmp, final)
        renamed = True
        fsync_dir(fs, directory)  # the rename survives power loss
    finally:
        if not renamed:
            try:
                fs.unlink(tmp)
            except FileNotFoundError:
                pass


def durable_append(fs: FileSystem, fd: int, data: bytes, end: int) -> int:
    """Append ``data`` at ``end`` (the file's known size) and make it durable.

    On any failure (including KeyboardInterrupt) the file is truncated back to ``end``
    and fsynced, and :class:`AppendFailed` is raised chaining the cause. If the rollback
    fails too, AppendFailed has ``outcome_unknown=True`` and the caller must poison the
    handle. Returns the new end.
    """
    try:
        write_all(fs, fd, data)
        fs.fdatasync(fd)  # after this the batch survives power loss: acknowledge
        return end + len(data)
    except BaseException as exc:
        try:
            fs.ftruncate(fd, end)
            fs.fsync(fd)  # the rollback is durable: the batch is not in the log
        except BaseException as rollback_exc:
            raise AppendFailed(
                f"append failed ({exc!r}) and rolling back to offset {end} failed too "
                f"({rollback_exc!r}): outcome unknown; rescan in a new process",
                outcome_unknown=True,
            ) from exc
        if isinstance(exc, SessionLogError):
            raise
        raise AppendFailed(f"append failed and was rolled back to offset {end}: {exc!r}") from exc


def quarantine_name(log_name: str, offset: int, kind: str) -> str:
    """A never-reused sibling name for the tail cut from ``log_name`` at ``offset``:
    ``<log>.<offset>.<kind>.<utc stamp>-<random>.quarantine``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return f"{log_name}.{offset}.{kind}.{stamp}-{secrets.token_hex(4)}.quarantine"


_QUARANTINE = re.compile(r"\.(\d+)\.([a-z-]+)\.\d{8}T\d{6}Z-[0-9a-f]{8}\.quarantine")


def parse_quarantine_name(log_name: str, name: str) -> tuple[int, str] | None:
    """``(offset, kind)`` when ``name`` is a quarantine file of ``log_name`` exactly (the
    log of session ``a`` never claims the quarantine of session ``a.jsonl.x``)."""
    if not name.startswith(log_name):
        return None
    match = _QUARANTINE.fullmatch(name, len(log_name))
    return (int(match.group(1)), match.group(2)) if match else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        return True
    return True


def sweep_temps(fs: FileSystem, directory: str) -> None:
    """Remove leftover publish temps whose writer process is dead."""
    for name in fs.listdir(directory):
        if not (name.startswith(".") and name.endswith(".tmp")):
            continue
        parts = name[:-4].rsplit(".", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        if not pid_alive(int(parts[1])):
            try:
                fs.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass


class FileLock:
    """An exclusive lock on a lock file that is created 0600 with O_NOFOLLOW and never
    unlinked, taken with filelock's ``lock_descriptor`` on the descriptor the seam opened
    (``flock`` on Linux). One lock per instance; not usable after ``fork``.

    A lock is on a file, not on its name: if the file is removed or replaced (a cleaner of
    old files in /tmp, an operator), a second process creates a new one and takes that.
    So a lock is taken only on the file its path names once it is held (else it is taken
    again), and :meth:`check` (one ``stat``, before each append) refuses to write once
    the path names another file."""

    def __init__(self, fs: FileSystem, path: str) -> None:
        self.fs = fs
        self.path = path
        self.fd: int | None = None
        self._pid = os.getpid()
        self._ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the locked file

    def acquire(self, timeout: float | None = 0.0) -> None:
        """Take the lock, waiting up to ``timeout`` seconds (None: as long as it takes;
        never less than a short grace that outlasts a scanner's probe); SessionLocked if
        it stays held. OSError from opening the lock file (NotARegularFile for a FIFO or
        device planted there) propagates to the caller, which names the operation."""
        if self.fd is not None:
            raise SessionLogError(f"{self.path}: lock already held by this handle")
        deadline = None if timeout is None else time.monotonic() + max(timeout, PROBE_GRACE)
        while True:
            fd = self.fs.open(self.path, os.O_RDWR | os.O_CREAT | O_NOFOLLOW, FILE_MODE)
            try:
                if deadline is None:
                    self.fs.lock_descriptor(fd, blocking=True)
                else:
                    # filelock's descriptor lock either blocks without a deadline or tries
                    # once: a bounded wait is attempts until the deadline.
                    while not self.fs.lock_descriptor(fd, blocking=False):
                        if time.monotonic() >= deadline:
                            raise SessionLocked(f"{self.path}: another writer owns this session")
                        time.sleep(LOCK_POLL)
                ident = self._named(fd)
            except BaseException:
                self.fs.close(fd)
                raise
            if ident is not None:
                break
            # The file was removed or replaced while this waited for it: whoever holds
            # the lock on the file the path names now owns the session. Take that one.
            self.fs.close(fd)
            if deadline is not None and time.monotonic() >= deadline:
                raise SessionLocked(f"{self.path}: another writer owns this session (its lock file was replaced "
                                    "while this waited for it)")
            time.sleep(LOCK_POLL)
        self.fd = fd
        self._ident = ident
        self._pid = os.getpid()
        _HELD_LOCKS.add(self)

    def _named(self, fd: int) -> tuple[int, int] | None:
        """The identity of the file open on ``fd`` when the path names it, else None."""
        held = self.fs.fstat(fd)
        try:
            named = self.fs.stat(self.path)
        except FileNotFoundError:
            return None
        if (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
            return None
        return held.st_dev, held.st_ino

    def check(self) -> None:
        """Raise OwnershipLost when the path no longer names the locked file (it was
        removed or replaced: another process can take a lock on the new one)."""
        try:
            named = self.fs.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            named = None
        except OSError as exc:  # EACCES, EIO...: not known to be lost; nothing written, retry allowed
            raise AppendFailed(f"{self.path}: cannot check the lock file ({exc.strerror or exc}); "
                               "nothing was written") from exc
        if named is None or (named.st_dev, named.st_ino) != self._ident:
            raise OwnershipLost(
                f"{self.path}: the lock file was {'removed' if named is None else 'replaced'} while this "
                "handle held its lock, so another writer may own the session; nothing was written: close this "
                "handle, then open the session again"
            )

    def release(self) -> None:
        """Drop the lock (in the process that took it only: a forked child sharing the
        descriptor must not release its parent's lock) and close the descriptor."""
        fd, self.fd = self.fd, None
        _HELD_LOCKS.discard(self)
        if fd is not None and os.getpid() == self._pid:
            try:
                self.fs.unlock_descriptor(fd)
            except OSError:
                pass  # closing the descriptor below drops the lock all the same
            finally:
                self.fs.close(fd)

    @property
    def held(self) -> bool:
        return self.fd is not None and os.getpid() == self._pid


FENCE_WAIT = 10.0
"""Seconds a writer waits for another writer's fence on a log file (a sync takes far less)."""


@contextlib.contextmanager
def log_fence(fs: FileSystem, fd: int, path: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the log file open on ``fd`` (every writer of a log
    file takes it from its checks to its sync or rename), released before the block ends.
    Waits up to :data:`FENCE_WAIT` seconds, then AppendFailed (nothing was written). The
    caller must not close ``fd`` inside the block: the lock is released on ``fd`` itself,
    never through a descriptor number that may have been closed and reused since. The
    caller tracks ``fd`` (:func:`track_log_fd`) from its open, so that a child forked
    while it is open never keeps the fence."""
    deadline = time.monotonic() + FENCE_WAIT
    while True:
        try:
            fs.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise AppendFailed(
                    f"{path}: another process has held the log file's write lock for {FENCE_WAIT:g} s "
                    "(a writer of the same session, or a process that inherited its descriptor); nothing "
                    "was written"
                ) from None
            time.sleep(LOCK_POLL)
        except OSError as exc:
            raise AppendFailed(f"{path}: cannot lock the log file: {exc.strerror or exc}; nothing was written") from exc
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            fs.flock(fd, fcntl.LOCK_UN)


_LOG_FDS: set[int] = set()
"""Descriptors of log files this process has open for writing (which carry the fence)."""


def track_log_fd(fd: int) -> None:
    """``fd`` is a log file open for writing until :func:`untrack_log_fd`: a forked child
    points its copy at /dev/null (see :func:`_forget_locks_in_child`)."""
    _LOG_FDS.add(fd)


def untrack_log_fd(fd: int) -> None:
    """Before ``fd`` is closed."""
    _LOG_FDS.discard(fd)


_HELD_LOCKS: weakref.WeakSet[FileLock] = weakref.WeakSet()
"""The locks this process holds, for :func:`_forget_locks_in_child`."""


def _forget_locks_in_child() -> None:
    """After ``fork``, in the child: close its copies of the held locks' descriptors. A
    flock belongs to the open file, shared by both copies: were the child to keep its
    copy, a parent killed later would leave its sessions owned for as long as the child
    lives. Closing a copy does not release the parent's lock (the parent's descriptor
    still holds it); the child's handles are unusable anyway."""
    for lock in list(_HELD_LOCKS):
        fd, lock.fd = lock.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    _HELD_LOCKS.clear()
    # The log files open for writing: a fence the parent takes on one later (and is killed
    # holding) would live on in the child's copy of the open file. The child's copies
    # become /dev/null (the numbers stay taken: its handles close them as their own).
    point_at_devnull(list(_LOG_FDS))
    _LOG_FDS.clear()


def point_at_devnull(fds: Iterable[int]) -> None:
    """In a forked child: make each of ``fds`` (its copies of the parent's open files)
    refer to /dev/null instead. The child's reference to the parent's open file goes
    (with whatever lock or connection rides on it), while the numbers stay taken, so
    whatever still holds them in the child closes /dev/null, never a file opened later."""
    fds = list(fds)
    if not fds:
        return
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:  # pragma: no cover - no /dev/null: leave them be
        return
    try:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.dup2(null, fd)
    finally:
        os.close(null)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_locks_in_child)


def lock_is_held(fs: FileSystem, path: str) -> bool:
    """True when some process holds the lock on ``path``: a shared ``flock`` probe, which
    filelock's descriptor API has no call for (its exclusive lock is ``flock`` too, so
    the two contend). Never creates the file; NotARegularFile for a FIFO or device."""
    try:
        fd = fs.open(path, os.O_RDONLY | O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        try:
            fs.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fs.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        fs.close(fd)


def printable(text: str) -> str:
    """``text`` as it can be written as UTF-8 (to a stream, in JSON): a file name that is
    not UTF-8 (its bytes held as lone surrogates by ``os.fsdecode``) with those bytes
    escaped (``x\\xff.jsonl``); any other text as it is (the same object)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text
