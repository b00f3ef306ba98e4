"""Fixtures for the daemon tests; the harness lives in daemon_harness.py."""

from __future__ import annotations

import pytest
from daemon_harness import DaemonProc


@pytest.fixture
def daemon_factory(tmp_path):
    made = []

    def make(scenario, **kw):
        d = DaemonProc(tmp_path, scenario, **kw)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()
