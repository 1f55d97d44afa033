"""The OpenAI Agents SDK is an optional extra: importing sessionlog never imports it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_importing_sessionlog_never_imports_the_agents_sdk() -> None:
    code = (
        "import sys\n"
        "import sessionlog, sessionlog.integrations, sessionlog.cli, sessionlog.recovery, sessionlog.writer\n"
        "store = sessionlog.open_store('memory:')\n"
        "store.create('s')\n"
        "leaked = sorted(m for m in sys.modules if m == 'agents' or m.startswith(('agents.', 'openai')))\n"
        "print(leaked)\n"
        "assert not leaked, leaked\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_without_the_extra_the_integration_names_the_install_line() -> None:
    code = (
        "import sys\n"
        "sys.modules['agents'] = None  # as if openai-agents were not installed\n"
        "import sessionlog\n"
        "try:\n"
        "    import sessionlog.integrations.openai_agents\n"
        "except sessionlog.SessionLogError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("MissingExtra") and "sessionlog[agents]" in done.stdout
