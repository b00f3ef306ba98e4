"""The systemd lab, one boot per test module (tests/systemdlab.py)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests import needs


@pytest.fixture(scope="module")
def sdlab():
    from tests.systemdlab import SystemdLab, skip_reason

    needs.elsewhere("systemd-lab")
    why = skip_reason()
    if why:
        needs.unavailable(why)
    base = Path(tempfile.mkdtemp(prefix="gpudoctor-sdlab-"))
    lab = SystemdLab(base)
    try:
        lab.start()
        yield lab
    finally:
        try:
            lab.close()
        finally:
            shutil.rmtree(base, ignore_errors=True)
