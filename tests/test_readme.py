"""The README's code blocks do what they say when a user pastes them."""

from __future__ import annotations

import os
import re

import sessionlog

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def python_block(section: str) -> str:
    text = open(README, encoding="utf-8").read()
    body = text.split(f"\n## {section}\n", 1)[1]
    return re.search(r"```python\n(.*?)```", body, re.S).group(1)


def test_embedded_use_runs_as_written(tmp_path):
    code = python_block("Embedded use").replace("/var/lib/agent/sessions", str(tmp_path))
    code = code.replace("[...]", '[{"type": "llm/retry", "attempt": 3}]')  # the one placeholder
    scope: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the README's own example
    store = scope["store"]
    assert scope["rep"].status in ("clean", "repaired")
    assert store.scan("s1").status.value == "clean"


def test_open_store_refuses_what_is_not_a_url_with_a_sessionlog_error():
    """README: every error is a SessionLogError, also for a URL that is not a string."""
    for url in (None, 5, b"jsonl:/tmp", "", "nothing"):
        try:
            sessionlog.open_store(url)  # type: ignore[arg-type]
        except sessionlog.InvalidStoreUrl:
            continue
        raise AssertionError(f"open_store({url!r}) did not raise InvalidStoreUrl")
