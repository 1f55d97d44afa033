"""Optional dependencies: what each extra of ``pip install 'sessionlog[EXTRA]'`` installs,
and the one error raised when code that needs one runs without it.

The core (JSONL, Zstd, SQLite, memory stores, the command line) needs none of them.
PostgreSQL users install ``sessionlog[postgres]`` (psycopg 3); an integration with a
third-party runtime imports its package through :func:`require` inside its own module,
so importing ``sessionlog`` never needs an extra.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .contract import SessionLogError


class MissingExtra(SessionLogError, ImportError):
    """An optional dependency is not installed. ``extra`` names what to install
    (``pip install 'sessionlog[<extra>]'``), ``module`` the package that was missing."""

    def __init__(self, message: str, *, module: str, extra: str) -> None:
        super().__init__(message)
        self.module = module
        self.extra = extra


def require(module: str, *, extra: str, purpose: str) -> ModuleType:
    """Import ``module`` for ``purpose`` (e.g. "a postgresql+psycopg:// store").

    Raises :class:`MissingExtra`, naming the extra that installs it, when it cannot be
    imported; the ImportError is chained as the cause."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(
            f"{purpose} needs the {module!r} package, which is not installed: "
            f"pip install 'sessionlog[{extra}]'",
            module=module, extra=extra,
        ) from exc
