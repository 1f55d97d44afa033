"""Command-line targets: a log file, a store directory or a store URL, as a store URL.

Shared by every command that takes a TARGET (scan, repair, show, convert, compact).
"""

from __future__ import annotations

import os

from . import InvalidStoreUrl, open_store, scheme_of
from .contract import EventStore, SessionNotFound

KNOWN_SCHEMES = frozenset({"memory", "jsonl", "zstd", "sqlite", "postgresql"})
FILE_SCHEMES = {".jsonl.zst": "zstd", ".jsonl": "jsonl"}
SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")


def resolve_target(text: str) -> tuple[str, str | None]:
    """A store URL and optional session id for a command-line TARGET.

    A store URL stays as it is. A file ``DIR/<id>.jsonl`` / ``DIR/<id>.jsonl.zst`` is
    that session of ``jsonl:DIR`` / ``zstd:DIR``; a ``.sqlite``/``.db`` file is
    ``sqlite:///FILE``; a directory holding ``*.jsonl`` (or ``*.jsonl.zst``) files is
    that store. Raises InvalidStoreUrl when the backend cannot be told (an empty or
    missing directory, both kinds of files): name it with a URL then."""
    head, sep, _ = text.partition(":")
    if sep and head.partition("+")[0].lower() in KNOWN_SCHEMES and not os.path.exists(text):
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
    try:
        names = os.listdir(path)
    except OSError as exc:
        raise InvalidStoreUrl(f"{text}: cannot list: {exc.strerror or exc}") from exc
    found = {scheme for name in names if not name.startswith(".")
             for suffix, scheme in FILE_SCHEMES.items() if name.endswith(suffix)
             and not (suffix == ".jsonl" and name.endswith(".jsonl.zst"))}
    if len(found) == 1:
        return f"{found.pop()}:{path}", None
    if not found:
        raise InvalidStoreUrl(f"{text}: holds no session logs; name the backend with a URL (jsonl:{text}, zstd:{text})")
    raise InvalidStoreUrl(f"{text}: holds both *.jsonl and *.jsonl.zst logs; name one with a URL")


def open_source(url: str) -> EventStore:
    """Open a store to read without writing to it: a file store's directory (or a SQLite
    file) must exist; a file store's directory is not created or swept; a SQL store is
    opened read-only (no table, schema or file is created; a database without the
    sessionlog tables is CorruptLog)."""
    scheme = scheme_of(url)
    if scheme in ("jsonl", "zstd"):
        directory = url.partition(":")[2]
        directory = directory[2:] if directory.startswith("//") else directory
        if not os.path.isdir(directory):
            raise SessionNotFound(f"{directory}: no such store directory")
        return open_store(url, create_dir=False)
    if scheme == "sqlite":
        path = url.partition(":///")[2].partition("?")[0]
        if path and path != ":memory:" and not os.path.isfile(path):
            raise SessionNotFound(f"{path}: no such SQLite store")
    if scheme in ("sqlite", "postgresql"):
        return open_store(url, read_only=True)
    return open_store(url)
