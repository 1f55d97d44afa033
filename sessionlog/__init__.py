"""sessionlog: a crash-safe storage engine for agent session logs.

Open a store by URL and append events to sessions::

    store = sessionlog.open_store("jsonl:path/to/dir")
    store.create("s1")
    store.append("s1", [{"type": "turn/start", "turn": "t1"}])

The record format and vocabulary are in docs/format.md, the guarantees per backend in
docs/backends.md, the runtime API in docs/runtime.md (docs/ ships with the project).
"""

from __future__ import annotations

import importlib
from typing import Any

from .contract import (
    AppendFailed,
    CorruptLog,
    Damage,
    DamageKind,
    DurabilityRefused,
    EventStore,
    InvalidEvent,
    InvalidSessionId,
    IOFailure,
    OwnershipLost,
    RepairReport,
    ScanResult,
    SequenceConflict,
    SessionExists,
    SessionHandle,
    SessionLocked,
    SessionLogError,
    SessionNotFound,
    Status,
    StoreClosed,
    UnsupportedFormat,
)
from .delivery import pending_deliveries
from .extras import MissingExtra
from .events import FORMAT, TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN, Record
from .projection import UnknownFormat, check_pairing, project
from .recovery import CallNotPending, NotAwaitingApproval, OutsideStep, StepScope, ToolOutcome, dispatch_tools
from .scan import Limits
from .writer import WriteBehind

__version__ = "0.1.0"

# scheme -> "module:factory"; the factory takes the URL's remainder and keyword options.
_BACKENDS: dict[str, str] = {
    "memory": "sessionlog.backends.memory:open_url",
    "jsonl": "sessionlog.backends.jsonl:open_url",
    "zstd": "sessionlog.backends.zstd:open_url",
    "sqlite": "sessionlog.backends.sql:open_url",
    "postgresql": "sessionlog.backends.sql:open_url",
}


def scheme_of(url: str) -> str:
    """The backend scheme of a store URL (``postgresql+psycopg://`` is ``postgresql``).
    Raises InvalidStoreUrl for anything that is not a URL string."""
    if not isinstance(url, str):
        raise InvalidStoreUrl(f"{url!r} is not a store URL: a URL is a string")
    head, sep, _ = url.partition(":")
    if not sep:
        raise InvalidStoreUrl(f"{url!r} is not a store URL (jsonl:DIR, zstd:DIR, sqlite:///FILE, "
                              "postgresql+psycopg://..., memory:)")
    return head.partition("+")[0].lower()


class InvalidStoreUrl(SessionLogError, ValueError):
    """A store URL naming no known backend."""


def open_store(url: str, **options: Any) -> EventStore:
    """Open the event store a URL names: ``jsonl:DIR``, ``zstd:DIR``, ``sqlite:///FILE``,
    ``postgresql+psycopg://...`` or ``memory:``.

    Options are the backend's (``limits``, ``lock_timeout``, ...). Raises
    :class:`InvalidStoreUrl` for an unknown scheme, :class:`MissingExtra` when the
    backend's driver is not installed (PostgreSQL: ``pip install 'sessionlog[postgres]'``).
    """
    scheme = scheme_of(url)
    target = _BACKENDS.get(scheme)
    if target is None:
        raise InvalidStoreUrl(f"{url!r}: unknown backend {scheme!r}; known: {', '.join(sorted(_BACKENDS))}")
    module_name, _, factory = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise InvalidStoreUrl(f"{url!r}: the {scheme} backend is not available ({exc})") from exc
    return getattr(module, factory)(url, **options)


__all__ = [
    "FORMAT",
    "TOOL_NOT_STARTED",
    "TOOL_OUTCOME_UNKNOWN",
    "AppendFailed",
    "CorruptLog",
    "Damage",
    "DamageKind",
    "DurabilityRefused",
    "EventStore",
    "IOFailure",
    "InvalidEvent",
    "InvalidSessionId",
    "InvalidStoreUrl",
    "Limits",
    "MissingExtra",
    "OwnershipLost",
    "Record",
    "RepairReport",
    "ScanResult",
    "SequenceConflict",
    "SessionExists",
    "SessionHandle",
    "SessionLocked",
    "SessionLogError",
    "SessionNotFound",
    "Status",
    "StoreClosed",
    "UnknownFormat",
    "UnsupportedFormat",
    "CallNotPending",
    "NotAwaitingApproval",
    "OutsideStep",
    "StepScope",
    "ToolOutcome",
    "WriteBehind",
    "check_pairing",
    "dispatch_tools",
    "open_store",
    "pending_deliveries",
    "project",
    "scheme_of",
]
