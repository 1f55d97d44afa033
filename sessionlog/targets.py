"""Command-line targets: what a TARGET names, in sessionlog's terms.

Shared by every command that takes a TARGET (scan, repair, show, convert, compact). A
TARGET is one of:

* a store URL (``jsonl:DIR``, ``zstd:DIR``, ``sqlite:///FILE``, ``postgresql+psycopg://...``,
  ``memory:``): every session in it;
* a store directory (``*.jsonl`` or ``*.jsonl.zst`` files) or a SQLite file: every session
  in it. Inside a store the file name is the session id: a file whose header names another
  session is still inspected, under its header's id, with a note saying so;
* a session log file, whatever its name: the session its header names (a copied or renamed
  log can be inspected and repaired; the backend is told by its content: a zstd frame or a
  JSON line);
* ``-``: standard input, spooled to a temporary file (read-only commands).

One rule for a TARGET that names nothing: :class:`TargetNotFound` (exit 4), whatever the
spelling (a path, a ``jsonl:``/``zstd:``/``sqlite:`` URL, a session the store lacks).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

from . import InvalidStoreUrl, open_store, scheme_of
from .contract import EventStore, SessionNotFound
from .durable import read_head
from .events import SESSION_START, Record, RecordError, valid_session_id

KNOWN_SCHEMES = frozenset({"memory", "jsonl", "zstd", "sqlite", "postgresql"})
FILE_SCHEMES = {".jsonl.zst": "zstd", ".jsonl": "jsonl"}
SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
SQLITE_MAGIC = b"SQLite format 3\x00"
STDIN = "-"
# How much of a file is read to find its header line (the record limit is 1 MiB).
HEADER_LIMIT = (1 << 20) + 2


class TargetNotFound(SessionNotFound):
    """A TARGET that names no file, directory, store or session (exit 4)."""


@dataclass(slots=True)
class StoreTarget:
    """A store, and which of its sessions a command works on.

    ``session`` None means every session of the store except ``skip``. ``file_name`` is
    set for a session file whose name is not ``<session><suffix>`` (a copied or renamed
    log, identified by its header): the store sees it under that name. ``note`` says why
    the target is not what its spelling suggests (read by people, printed on stderr).
    ``shown_as`` replaces the path in output (``-`` for standard input)."""

    text: str
    url: str
    session: str | None = None
    file_name: str | None = None
    skip: frozenset[str] = frozenset()
    note: str | None = None
    shown_as: str | None = None
    path: str | None = None

    def open(self, *, writing: bool) -> EventStore:
        """Open the store, which must exist: read-only (``open_source``), or with
        ``writing`` to change its sessions (nothing is created: not a directory, not a
        table). Raises TargetNotFound, CorruptLog (a database that is not a store)."""
        store = open_existing(self.url) if writing else open_source(self.url)
        if self.file_name is not None and self.session is not None:
            store.file_names[self.session] = self.file_name  # type: ignore[attr-defined]
        return store

    def sessions(self, store: EventStore) -> list[str]:
        """The session ids to work on in ``store`` (opened from this target).
        Raises TargetNotFound when the one session asked for is not there."""
        if self.session is not None:
            if self.file_name is None and self.session not in store.sessions():
                if not valid_session_id(self.session):
                    raise TargetNotFound(f"{self.text}: no session {self.session!r}: not a valid session id")
                raise TargetNotFound(f"{self.text}: no session {self.session!r}")
            return [self.session]
        return [sid for sid in store.sessions() if sid not in self.skip]


@dataclass(slots=True)
class Header:
    """What a session file's first line says: its session id (None when the first line
    is not a session/start header naming a valid id) and its backend scheme."""

    scheme: str
    session: str | None
    notes: list[str] = field(default_factory=list)


def _is_url(text: str) -> bool:
    head, sep, _ = text.partition(":")
    return bool(sep) and head.partition("+")[0].lower() in KNOWN_SCHEMES and not os.path.exists(text)


def _check_scheme(text: str) -> None:
    """InvalidStoreUrl for a new destination that reads as a URL of no known backend
    (``jsnol:DIR``, ``http://...``): no path to suggest a URL for."""
    head, sep, _ = text.partition(":")
    if sep and head and "/" not in head and not os.path.lexists(text) and not _is_url(text):
        raise InvalidStoreUrl(f"{text}: {head!r} is no store backend "
                              "(jsonl:DIR, zstd:DIR, sqlite:///FILE, postgresql+psycopg://...)")


def resolve(text: str, *, session: str | None = None) -> list[StoreTarget]:
    """The store targets one command-line TARGET names (several for a store directory
    holding files whose headers disagree with their names).

    Raises TargetNotFound (nothing there), InvalidStoreUrl (a malformed URL, a directory
    whose backend cannot be told, a file that is no store or log)."""
    if not text:  # not the current directory: an empty word names nothing
        raise TargetNotFound("an empty TARGET names no file, directory or store URL")
    if _is_url(text):
        scheme = scheme_of(text)
        directory = text.partition(":")[2].removeprefix("//")
        if scheme in FILE_SCHEMES.values() and session is None and os.path.isdir(directory):
            return _directory(text, os.path.abspath(directory), session, scheme=scheme, url=text)
        return [StoreTarget(text, text, session=session)]
    path = os.path.abspath(text)
    if not os.path.lexists(path):
        raise TargetNotFound(f"{text}: no such file, directory or store URL "
                             "(jsonl:DIR, zstd:DIR, sqlite:///FILE, postgresql+psycopg://...)")
    if os.path.isdir(path):
        return _directory(text, path, session)
    return [_file(text, path, session)]


def _file(text: str, path: str, session: str | None) -> StoreTarget:
    name = os.path.basename(path)
    directory = os.path.dirname(path)
    head = read_head(path, 16)
    if head.startswith(SQLITE_MAGIC) or (not head and name.endswith(SQLITE_SUFFIXES)):
        return StoreTarget(text, f"sqlite:///{path}", session=session, path=path)
    scheme = "zstd" if head.startswith(ZSTD_MAGIC) else None
    if scheme is None:
        for suffix, by_name in FILE_SCHEMES.items():
            if name.endswith(suffix) and not head:
                scheme = by_name
                break
        else:
            scheme = "jsonl"
    header = read_header(path, scheme)
    stem = _stem(name, scheme)
    sid = header.session if header.session is not None else stem
    if sid is None:
        # No header naming a session and no usable name: let the scan say why (not a log).
        sid = "unnamed"
    if session is not None and session != sid:
        raise TargetNotFound(f"{text} holds session {sid!r}, not {session!r}")
    note = None
    file_name = None
    if stem != sid:
        file_name = name
        if header.session is not None:
            named = f" (the file name says {stem!r})" if stem is not None else ""
            note = f"{text}: inspected as session {sid!r}, the id its header names{named}"
    return StoreTarget(text, f"{scheme}:{directory}", session=sid, file_name=file_name, note=note, path=path)


def _stem(name: str, scheme: str) -> str | None:
    for suffix, by_name in FILE_SCHEMES.items():
        if by_name == scheme and name.endswith(suffix) and valid_session_id(name[: -len(suffix)]) \
                and not (scheme == "jsonl" and name.endswith(".jsonl.zst")):
            return name[: -len(suffix)]
    return None


def _directory(text: str, path: str, session: str | None, *, scheme: str | None = None,
               url: str | None = None) -> list[StoreTarget]:
    """The targets of a store directory; ``scheme`` and ``url`` when a store URL named
    it (otherwise the backend is told by the files' suffixes)."""
    try:
        names = os.listdir(path)
    except OSError as exc:
        raise InvalidStoreUrl(f"{text}: cannot list: {exc.strerror or exc}") from exc
    if scheme is None:
        found = {scheme for name in names if not name.startswith(".")
                 for suffix, scheme in FILE_SCHEMES.items() if name.endswith(suffix)
                 and not (suffix == ".jsonl" and name.endswith(".jsonl.zst"))}
        if not found:
            raise InvalidStoreUrl(f"{text}: holds no session logs; name the backend with a URL (jsonl:{text}, zstd:{text})")
        if len(found) > 1:
            raise InvalidStoreUrl(f"{text}: holds both *.jsonl and *.jsonl.zst logs; name one with a URL")
        scheme = found.pop()
    suffix = next(s for s, sch in FILE_SCHEMES.items() if sch == scheme)
    if url is not None and session is None:
        _other_backend(text, path, names, scheme)
    shown = text if url is None else path
    url = url or f"{scheme}:{path}"
    if session is not None:
        return [StoreTarget(text, url, session=session)]
    renamed: list[StoreTarget] = []
    for name in sorted(names):
        if name.startswith(".") or not name.endswith(suffix) or (scheme == "jsonl" and name.endswith(".jsonl.zst")):
            continue
        stem = _stem(name, scheme)
        header = read_header(os.path.join(path, name), scheme)
        if stem is None:
            # A log whose name is no session id ("my session.jsonl"): the store cannot
            # name it, but it is inspected like the file named alone, never passed over.
            sid = header.session if header.session is not None else "unnamed"
            renamed.append(StoreTarget(
                text, url, session=sid, file_name=name, path=os.path.join(path, name),
                note=(f"{os.path.join(shown, name)}: the file name is not a session id: inspected as "
                      f"{sid!r}" + (", the id its header names" if header.session is not None else "")
                      + f"; rename it to {sid}{suffix} or convert it"),
            ))
        elif header.session is not None and header.session != stem:
            renamed.append(StoreTarget(
                text, url, session=header.session, file_name=name, path=os.path.join(path, name),
                note=(f"{os.path.join(shown, name)}: in a store the file name is the session id, but this "
                      f"file's header names {header.session!r}: inspected as {header.session!r}; rename it "
                      f"to {header.session}{suffix} or convert it"),
            ))
    skip = frozenset(_stem(t.file_name or "", scheme) or "" for t in renamed)
    return [StoreTarget(text, url, skip=skip), *renamed]



def _other_backend(text: str, path: str, names: list[str], scheme: str) -> None:
    """TargetNotFound for a ``jsonl:``/``zstd:`` URL naming a directory that holds no log
    of that backend but logs of the other one: the URL names nothing there, and an
    empty answer (no sessions, exit 0) would hide the mistake."""
    def logs(of: str) -> list[str]:
        return [n for n in names if not n.startswith(".") and _stem(n, of) is not None]

    if logs(scheme):
        return
    other = "zstd" if scheme == "jsonl" else "jsonl"
    found = logs(other)
    if found:
        suffix = next(s for s, sch in FILE_SCHEMES.items() if sch == other)
        raise TargetNotFound(f"{text}: {path} holds no {scheme} logs but {len(found)} *{suffix} "
                             f"log(s): name it {other}:{path.rstrip('/') or '/'}")


def read_header(path: str, scheme: str) -> Header:
    """The session id a log file's first record names (None when it is not a valid
    session/start header: the scan of the file then says what it is). Never raises for
    bad content; reads at most one record's worth."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return Header(scheme, None)
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return Header(scheme, None)
            if scheme == "zstd":
                import zstandard

                # The first frame alone (the header frame): damage in a later frame must
                # not hide the header that names the session.
                frame = zstandard.ZstdDecompressor().decompressobj()
                data = b""
                while b"\n" not in data and len(data) < HEADER_LIMIT and not frame.eof:
                    chunk = f.read(65536)
                    if not chunk:
                        break
                    data += frame.decompress(chunk)
            else:
                data = f.readline(HEADER_LIMIT)
    except (OSError, Exception):  # zstandard.ZstdError and friends: the scan says what it is
        return Header(scheme, None)
    line, nl, _ = data.partition(b"\n")
    if not nl:
        return Header(scheme, None)
    try:
        record = Record.from_line(line)
    except RecordError:
        return Header(scheme, None)
    sid = record.get("session")
    if record.seq != 1 or record.type != SESSION_START or not valid_session_id(sid):
        return Header(scheme, None)
    return Header(scheme, sid)


@contextlib.contextmanager
def stdin_log() -> Iterator[str]:
    """Standard input spooled to a file in a private temporary directory (removed on
    exit); yields the file's path. The log is read like a file TARGET (by its header)."""
    root = tempfile.mkdtemp(prefix="sessionlog-stdin-")
    try:
        path = os.path.join(root, "stdin.log")
        with open(path, "wb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
        yield path
    finally:
        shutil.rmtree(root, ignore_errors=True)


def resolve_target(text: str) -> tuple[str, str | None]:
    """A store URL and optional session id for ``text`` (one store target: a URL, a store
    directory, or a session file by its header). Raises TargetNotFound, InvalidStoreUrl
    (also when a directory holds files whose headers disagree with their names)."""
    [target] = resolve(text) if not _is_url(text) else [StoreTarget(text, text)]
    if target.file_name is not None:
        raise InvalidStoreUrl(f"{text}: the file name does not match the session its header names "
                              f"({target.session!r}); rename it to use it as a store path")
    return target.url, target.session


def destination(text: str) -> tuple[str, str | None]:
    """A store URL and optional session id for a destination: an existing store path or
    file name, a URL, or a new ``DIR/<id>.jsonl[.zst]`` file (its directory may be new).
    Raises InvalidStoreUrl when the backend of a new path cannot be told."""
    _check_scheme(text)
    if _is_url(text):
        scheme_of(text)
        return text, None
    path = os.path.abspath(text)
    name = os.path.basename(path)
    if not os.path.isdir(path):
        for suffix, scheme in FILE_SCHEMES.items():
            if name.endswith(suffix) and len(name) > len(suffix):
                return f"{scheme}:{os.path.dirname(path)}", name[: -len(suffix)]
        if name.endswith(SQLITE_SUFFIXES):
            return f"sqlite:///{path}", None
        if not os.path.exists(path):
            raise InvalidStoreUrl(f"{text}: no such file or directory; name a new store with a URL (zstd:{text})")
        raise InvalidStoreUrl(f"{text}: not a session log (*.jsonl, *.jsonl.zst) or store directory")
    return resolve_target(text)


def local_path(url: str) -> str | None:
    """The directory a ``jsonl:`` or ``zstd:`` URL names, or the file a ``sqlite:///``
    URL names ("" when the URL names none); None for a store that is not on the local
    file system (PostgreSQL, SQLite in memory)."""
    scheme = scheme_of(url)
    if scheme in ("jsonl", "zstd"):
        directory = url.partition(":")[2]
        return directory[2:] if directory.startswith("//") else directory
    if scheme == "sqlite":
        path = url.partition(":///")[2].partition("?")[0]
        return None if path == ":memory:" else path
    return None


_OPENED: list[EventStore] = []
"""The stores :func:`open_source` and :func:`open_existing` opened and the command has not
closed: :func:`close_opened` closes them when the command ends."""


def close_opened() -> None:
    """Close what the command's targets opened (a SQLite store's connections: the last one
    to close removes the ``-wal`` and ``-shm`` files a read made, so a scan leaves the
    directory as it found it). Best effort; closing twice is harmless."""
    while _OPENED:
        with contextlib.suppress(Exception):
            _OPENED.pop().close()


def _opened(store: EventStore) -> EventStore:
    _OPENED.append(store)
    return store


def open_source(url: str) -> EventStore:
    """Open a store to read without writing to it: a file store's directory (or a SQLite
    file) must exist; a file store's directory is not created or swept; a SQL store is
    opened read-only (no table, schema or file is created; a database without the
    sessionlog tables is CorruptLog). Raises TargetNotFound for a store that is not there."""
    scheme = scheme_of(url)
    path = local_path(url)
    if scheme in ("jsonl", "zstd"):
        if not path:
            raise InvalidStoreUrl(f"{url!r}: a {scheme} URL names a directory: {scheme}:DIR")
        if not os.path.isdir(path):
            raise TargetNotFound(f"{url}: no such store directory")
        return open_store(url, create_dir=False)
    if scheme == "sqlite":
        if path and os.path.isdir(path):
            raise TargetNotFound(f"{url}: {path} is a directory, not a SQLite database file")
        if path and not os.path.isfile(path):
            raise TargetNotFound(f"{url}: no such SQLite store")
    if scheme in ("sqlite", "postgresql"):
        return _opened(open_store(url, read_only=True))
    return _opened(open_store(url))


def open_existing(url: str) -> EventStore:
    """Open an existing store to write to its sessions (repair, compact): like
    :func:`open_source`, nothing is created; a SQL database must already be a store."""
    open_source(url).close()
    scheme = scheme_of(url)
    if scheme in ("jsonl", "zstd"):
        return open_store(url, create_dir=False)
    return _opened(open_store(url))
