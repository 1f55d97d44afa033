"""``sessionlog demo``: crash a writer mid tool call, then scan, repair and show.

A child process plays an agent runtime: it records a turn whose assistant message asks
for three tools, writes the durable ``tool/call`` intent for two of them, gets one result,
starts writing the next record and is killed with SIGKILL half-way through it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from typing import TextIO

from . import open_store
from .cli import main as cli_main

_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import sessionlog
    store = sessionlog.open_store(sys.argv[1])
    with store.session("demo", create=True) as s:
        s.append([{"type": "turn/start", "turn": "t1"},
                  {"type": "user/message", "turn": "t1", "content": "Deploy api 1.2.3, tell #ops, and check the weather."},
                  {"type": "step/start", "turn": "t1", "step": 1}])
        s.append([{"type": "assistant/message", "turn": "t1", "step": 1, "content": "On it.", "tool_calls": [
            {"id": "call_weather", "name": "weather", "arguments": {"city": "Oslo"}},
            {"id": "call_deploy", "name": "deploy", "arguments": {"service": "api", "version": "1.2.3"}},
            {"id": "call_notify", "name": "notify", "arguments": {"channel": "#ops"}}]}])
        # Checkpoint: the durable intent precedes the side effect.
        s.append([{"type": "tool/call", "turn": "t1", "step": 1, "call_id": "call_weather", "name": "weather"}])
        s.append([{"type": "tool/result", "turn": "t1", "step": 1, "call_id": "call_weather",
                   "output": "4 C, rain", "is_error": False}])
        s.append([{"type": "tool/call", "turn": "t1", "step": 1, "call_id": "call_deploy", "name": "deploy"}])
        # ... the deploy runs, its result is being written, and the process dies mid-record:
        fd = os.open(s.path, os.O_WRONLY | os.O_APPEND)
        os.write(fd, b'{"seq":9,"ts":1.0,"type":"tool/result","call_id":"call_dep')
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


class _Shown(io.TextIOBase):
    """``out`` with the demo's temporary directory written as ``<demo>``: the demo never
    prints a path into a directory it deletes (``--keep`` shows the real paths)."""

    def __init__(self, out: TextIO, root: str) -> None:
        self._out, self._root = out, root

    def write(self, text: str) -> int:
        self._out.write(text.replace(self._root, "<demo>"))
        return len(text)

    def flush(self) -> None:
        self._out.flush()

    def isatty(self) -> bool:
        return self._out.isatty()


def run_demo(out: TextIO, *, keep: bool = False) -> int:
    """Run the demo in a temporary store; returns 0 when the repaired log is valid.
    Without ``keep`` the store is removed at the end and its paths print as ``<demo>/...``."""
    root = tempfile.mkdtemp(prefix="sessionlog-demo-")
    if not keep:
        out = _Shown(out, root)  # type: ignore[assignment]
        _say(out, "(the demo works in a temporary directory, <demo>, removed at the end; --keep keeps it)\n")
    store_dir = os.path.join(root, "store")
    url = f"jsonl:{store_dir}"
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = package_root + os.pathsep + env.get("PYTHONPATH", "")
    try:
        _say(out, f"1. A runtime writes a turn to {store_dir}/demo.jsonl and is SIGKILLed mid tool call")
        child = subprocess.run([sys.executable, "-c", _CHILD, url], env=env, capture_output=True, text=True)
        if child.returncode != -signal.SIGKILL:
            out.write(child.stderr)
            return 4
        with open(os.path.join(store_dir, "demo.jsonl"), "rb") as f:
            tail = f.read().splitlines()[-1]
        _say(out, f"   last bytes on disk: {tail.decode(errors='replace')}")
        _say(out, "\n2. sessionlog scan (read-only)")
        code = cli_main(["scan", store_dir], out)
        _say(out, f"   exit {code}: repairable")
        _say(out, "\n3. sessionlog repair: quarantine the torn tail, record what is known about each call")
        code = cli_main(["repair", store_dir, "--json"], out)
        _say(out, f"   exit {code}")
        _say(out, "\n4. sessionlog show --format openai: a history every provider accepts")
        with open_store(url) as store:
            records = list(store.read("demo"))
        for r in records[-6:]:
            fields = {k: v for k, v in r.items() if k not in ("ts", "turn", "step")}
            if "output" in fields:
                fields["output"] = fields["output"][:90] + "..."
            _say(out, "   " + json.dumps(fields))
        code = cli_main(["show", store_dir, "--session", "demo", "--format", "openai", "--check"], out) \
            if _has_projection() else 0
        _say(out, "\n5. sessionlog scan again")
        code = cli_main(["scan", store_dir], out)
        _say(out, f"   exit {code}: clean" if code == 0 else f"   exit {code}")
        return code
    finally:
        if keep:
            _say(out, f"\nkept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def _has_projection() -> bool:
    try:
        from . import projection  # noqa: F401
    except ImportError:
        return False
    return True


def _say(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()
