# The fake Proxmox root and the `pct` stand-in are shared with tests/proxmox.
import sys

import pytest

from tests.proxmox.conftest import fake_pct, pve_root  # noqa: F401

from .hostroot import HostRoot


@pytest.fixture
def make_root(tmp_path, monkeypatch):
    """HostRoot factory; the stand-in tools act under the root it builds (GPUDOCTOR_STANDIN_ROOT)."""
    def make(**kw) -> HostRoot:
        r = HostRoot(tmp_path, **kw)
        monkeypatch.setenv("GPUDOCTOR_STANDIN_ROOT", str(r.root))
        monkeypatch.setenv("GPUDOCTOR_STANDIN_PYTHON", sys.executable)  # a real interpreter, not a pyenv shim
        return r
    return make
