"""Session fixtures of the end-to-end lab (tests/lxclab.py): ct200 on real LXC with the kernel's cgroup2 device
program and a real sshd inside, on the Proxmox node kpro6 (an sshd in its own mount and cgroup namespaces).

    lxclab     session: the running LxcLab (.inventory, .known_hosts, .pct(...), .config_file, ...)
    seed_lab   function: the lab reset to the seed's state (seed config, ct200 running as started from it)

Without the lab's parts (root, lxc, bpftool, busybox, sshd, gcc, util-linux) every test here is skipped with one
line naming what is missing and the install command; under CI=true that is a failure.
"""

from __future__ import annotations

import pytest

from tests import lxclab as L
from tests import needs


@pytest.fixture(scope="session")
def lab_parts():
    """The lab's parts are all here (root, lxc, ip, …), or the test is skipped with the one line naming the first
    one missing (a failure under CI=true). Every test that builds a lab of its own asks for this."""
    needs.elsewhere("lxc-lab")
    reason = L.skip_reason()
    if reason:
        needs.unavailable(reason)


@pytest.fixture(scope="session")
def lxclab(lab_parts, tmp_path_factory):
    L.remove_stale()
    with L.LxcLab(tmp_path_factory.mktemp("lxclab")) as lab:
        yield lab


@pytest.fixture
def seed_lab(lxclab):
    lxclab.reset()
    return lxclab
