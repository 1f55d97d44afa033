"""Where the command line prints: a rich console that never cuts or wraps piped output."""

from __future__ import annotations

import io
import os
from typing import Any, TextIO


def _width(out: TextIO) -> int | None:
    """The terminal's width, or None when ``out`` is not a terminal (never wrapped)."""
    try:
        if out.isatty():
            return os.get_terminal_size(out.fileno()).columns
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass
    return None


def console(out: TextIO) -> Any:
    """A rich console on ``out``: the terminal's width on a terminal; otherwise wide
    enough that nothing is wrapped or cut (piped output is never hard-wrapped)."""
    from rich.console import Console

    width = _width(out)
    return Console(file=out, soft_wrap=width is None, width=width or 100_000, highlight=False,
                   force_terminal=False if width is None else None, no_color=width is None)
