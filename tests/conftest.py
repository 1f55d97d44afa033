"""Shared test setup: the strategies in tests/sessions.py are importable as ``sessions``."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
