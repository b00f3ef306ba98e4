"""The file layer's unit tests: a root-owned 0755 directory under a umask of 022, as the door's rule expects of
root's own directories (its parents are pytest's tmp_path, root's)."""

from __future__ import annotations

import os

import pytest

from tests import needs

NOBODY = 65534
NO_SUCH_UID = 4242421  # no passwd entry


@pytest.fixture
def base(tmp_path):
    needs.root()
    old = os.umask(0o022)
    d = tmp_path / "base"
    d.mkdir()
    d.chmod(0o755)
    yield d
    os.umask(old)
