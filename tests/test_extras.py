"""Optional dependencies: a store or integration whose package is missing says which extra
installs it (a SessionLogError, exit 4 on the command line), and the core needs none."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

import sessionlog
from sessionlog.cli import main
from sessionlog.extras import MissingExtra, require

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def test_postgres_url_without_psycopg_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # what an install without the extra sees
    with pytest.raises(MissingExtra) as info:
        sessionlog.open_store(PG_URL)
    assert isinstance(info.value, sessionlog.SessionLogError)
    assert info.value.extra == "postgres" and info.value.module == "psycopg"
    assert "pip install 'sessionlog[postgres]'" in str(info.value)
    assert isinstance(info.value.__cause__, ImportError)


def test_cli_on_postgres_url_without_psycopg_exits_4_with_the_extra_on_stderr(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)
    out = io.StringIO()
    for argv in (["scan", PG_URL], ["repair", PG_URL], ["show", PG_URL]):
        assert main(argv, out) == 4
        err = capsys.readouterr().err
        assert "sessionlog[postgres]" in err and "Traceback" not in err
    assert out.getvalue() == ""


def test_require_returns_the_module_and_names_any_extra():
    assert require("json", extra="x", purpose="p").loads("1") == 1
    with pytest.raises(MissingExtra, match=r"the agents adapter needs .*sessionlog\[agents\]"):
        require("sessionlog_no_such_package", extra="agents", purpose="the agents adapter")


def test_core_imports_and_file_stores_work_without_psycopg(tmp_path):
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "import sessionlog\n"
        f"s = sessionlog.open_store('jsonl:{tmp_path}'); s.create('a'); s.append('a', [{{'type': 'x'}}])\n"
        f"q = sessionlog.open_store('sqlite:///{tmp_path}/db.sqlite'); q.create('a')\n"
        "print(s.scan('a').status, q.scan('a').status)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["clean", "clean"]
