"""Real components the tests need, and what happens when one is missing.

`need("sshd")` returns the component's path. When it is missing: outside CI the test is skipped with ONE line naming
the component and the command that installs it (pytest folds the identical skips of every test into one summary line,
because they are all raised here); under CI=true it is a failure, never a skip: CI installs everything (.ci/run).
"""

from __future__ import annotations

import os
import shutil

import pytest

# component -> (how to find it, what installs it)
COMPONENTS: dict[str, tuple[tuple[str, ...], str]] = {
    "sshd": (("sshd", "/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd"),
             "apt-get install openssh-server openssh-client"),
    "ssh-keygen": (("ssh-keygen",), "apt-get install openssh-client"),
    "gcc": (("gcc",), "apt-get install gcc libc6-dev"),
    "systemd-analyze": (("systemd-analyze",), "apt-get install systemd"),
    "unshare": (("unshare",), "apt-get install util-linux"),
    "nsenter": (("nsenter",), "apt-get install util-linux"),
    "lxc-start": (("lxc-start",), "apt-get install lxc"),
    "bpftool": (("bpftool", "/usr/sbin/bpftool"), "apt-get install bpftool"),
    "busybox": (("busybox", "/bin/busybox"), "apt-get install busybox-static"),
    "podman": (("podman",), "apt-get install podman runc"),
    "runc": (("runc", "/usr/sbin/runc"), "apt-get install runc"),
    # the Slurm lab (tests/slurmlab.py) and the Prometheus tests (tests/gate/test_prometheus.py)
    "slurmctld": (("slurmctld", "/usr/sbin/slurmctld"), "apt-get install slurmctld slurmd slurm-client munge"),
    "slurmd": (("slurmd", "/usr/sbin/slurmd"), "apt-get install slurmctld slurmd slurm-client munge"),
    "scontrol": (("scontrol",), "apt-get install slurmctld slurmd slurm-client munge"),
    "munged": (("munged", "/usr/sbin/munged"), "apt-get install slurmctld slurmd slurm-client munge"),
    "mmdebstrap": (("mmdebstrap",), "apt-get install mmdebstrap"),  # .ci/rootfs: the trixie rootfs of OpenSSH 10
    "ip": (("ip", "/usr/sbin/ip", "/sbin/ip"), "apt-get install iproute2"),
    "promtool": (("promtool",), "apt-get install prometheus"),
    "prometheus": (("prometheus",), "apt-get install prometheus"),
    "node_exporter": (("prometheus-node-exporter", "node_exporter"), "apt-get install prometheus-node-exporter"),
}


MARK = " (tests that need it are skipped)"  # tests/conftest.py folds these skips into one summary line each


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def find(name: str) -> str | None:
    candidates, _ = COMPONENTS[name]
    for c in candidates:
        found = shutil.which(c) if "/" not in c else (c if os.access(c, os.X_OK) else None)
        if found:
            return found
    return None


def missing(name: str, what: str | None = None) -> None:
    """Skip (or, under CI=true, fail) because `name` is not here."""
    install = COMPONENTS[name][1] if name in COMPONENTS else "see .ci/run"
    line = f"{what or name} is not installed{MARK}: {install}"
    if in_ci():
        pytest.fail(f"CI=true: {line} — .ci/run must install it", pytrace=False)
    pytest.skip(line)


def unavailable(line: str) -> None:
    """A real component or privilege the test needs is not here (root, a cgroup2 mount, …): skip with the line,
    a failure under CI=true."""
    if in_ci():
        pytest.fail(f"CI=true: {line}", pytrace=False)
    pytest.skip(line)


ROOT_LINE = (f"not running as root{MARK}: mknod, mount, chown, namespaces, cgroups and LXC need root "
             "(the whole suite wants root: README)")


def root() -> None:
    """The test needs root (device nodes, mounts, chown, namespaces, cgroups, another uid): as an ordinary user it is
    skipped with ROOT_LINE, which pytest's summary folds into one line for all of them; under CI=true a failure."""
    if os.geteuid() != 0:
        unavailable(ROOT_LINE)


def opt_in(var: str, line: str) -> None:
    """A real component too heavy to fetch unasked (gigabytes): outside CI the test is skipped with ONE line saying
    what it costs and how to ask for it (`var=1`); with `var=1`, or under CI=true (CI builds everything), the caller
    goes on and builds it."""
    if in_ci() or os.environ.get(var, "").lower() in ("1", "true", "yes"):
        return
    pytest.skip(f"{line}{MARK}: opt in with {var}=1")


CGROUP_V1_DEVICES = "/sys/fs/cgroup/devices"


def cgroup_v1_devices() -> str:
    """The mounted cgroup v1 devices controller; on a pure cgroup2 host (stock Debian 12, Proxmox VE 8, Ubuntu 22.04
    and later) the test is skipped with one line (a failure under CI=true, whose machines mount it)."""
    if not os.path.isfile(os.path.join(CGROUP_V1_DEVICES, "devices.list")):
        unavailable(f"no cgroup v1 devices controller at {CGROUP_V1_DEVICES}{MARK}: this is a pure cgroup2 host")
    return CGROUP_V1_DEVICES


def module(name: str, why: str):
    """A Python package of the test extras (openai, matplotlib, tokenizers): the imported module. Missing: outside CI
    the test (or, called at import time, the whole module) is skipped with one line naming it and what installs it;
    under CI=true a failure (README line 2 installs the extras)."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        line = f"the Python package {name} is not installed{MARK}: {why}; pip install '.[test]' (README line 2)"
        if in_ci():
            pytest.fail(f"CI=true: {line}", pytrace=False)
        pytest.skip(line, allow_module_level=True)


def not_a_proxmox_node() -> None:
    """The test shows gpudoctor off a Proxmox node; on one (it has /etc/pve) skip with one line, under CI=true a
    failure (a CI machine is never a Proxmox node)."""
    if os.path.isdir("/etc/pve"):
        unavailable(f"this machine is a Proxmox node (it has /etc/pve){MARK}: the off-the-node behaviour cannot be seen")


def need(name: str) -> str:
    """The path of a required real component; skips (outside CI) or fails (CI=true) when it is missing."""
    path = find(name)
    if path is None:
        missing(name)
    return path
