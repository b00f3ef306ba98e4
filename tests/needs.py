"""Real components the tests need, and what happens when one is missing.

`need("sshd")` returns the component's path. When it is missing: outside CI the test is skipped with ONE line naming
the component and the command that installs it (pytest folds the identical skips of every test into one summary line,
because they are all raised here); under CI=true it is a failure, never a skip: CI installs everything (.ci/run).

The one exception is a lab named in GPUDOCTOR_CI_ELSEWHERE (`elsewhere(lab)`, called first at each lab's single
entry): a CI stage on another platform (.ci/debian's whole-suite run on Debian 13) names the labs that cannot run
there, and CI's main suite on Debian 12 (.ci/run) runs them; each is skipped with ONE line, also under CI=true.
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
    "chattr": (("chattr", "/usr/bin/chattr", "/sbin/chattr"), "apt-get install e2fsprogs"),  # tests/remedies
    "promtool": (("promtool",), "apt-get install prometheus"),
    "prometheus": (("prometheus",), "apt-get install prometheus"),
    "node_exporter": (("prometheus-node-exporter", "node_exporter"), "apt-get install prometheus-node-exporter"),
    # tests/core/test_completion.py: completion driven in the real shells
    "bash": (("bash",), "apt-get install bash"),
    "zsh": (("zsh",), "apt-get install zsh"),
    "fish": (("fish",), "apt-get install fish"),
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


# The labs a CI stage may run elsewhere (GPUDOCTOR_CI_ELSEWHERE), each with why it cannot run in .ci/debian's
# Debian 13 (trixie) root filesystem, where the whole suite runs chrooted with pytest as PID 1 of its own namespace.
LABS: dict[str, str] = {
    "systemd-lab": "it boots systemd 252 as PID 1 under systemd-nspawn (tests/systemdlab.py); trixie's systemd 257 "
                   "fails there (\"Failed to retrieve machine ID: No medium found\")",
    "lxc-lab": "its node sshd runs in real LXC with the kernel's cgroup2 device program (tests/lxclab.py); in the "
               "chroot it fails \"Couldn't open /dev/null: Permission denied\"",
    "slurm-lab": "it runs Debian's munged, slurmctld and slurmd (tests/slurmlab.py); both CI stages run it now "
                 "(22.05 on Debian 12, 24.11 in the trixie stage): name it only for a stage without those packages",
    "podman": "the stage's root filesystem has no podman or runc; in the chroot gpudoctor inside its container saw "
              "the kind 'vm' (tests/boundary/test_podman_cdi.py), fixed since (test_container_kind_chroot.py) but not "
              "yet re-run in the stage",
    "transformers-lab": "its venv is torch CPU for CI's Python 3.11 (tests/bench/transformers_lab.py); on Python 3.13 "
                        "pip would fetch the 5 GB CUDA torch",
}
ELSEWHERE_ENV = "GPUDOCTOR_CI_ELSEWHERE"
ELSEWHERE_MARK = f"{ELSEWHERE_ENV}: "  # every elsewhere skip line starts with it (.ci/debian counts the others)


def elsewhere_labs() -> set[str]:
    """The labs GPUDOCTOR_CI_ELSEWHERE names (space- or comma-separated); an unknown name is a failure."""
    named = set(os.environ.get(ELSEWHERE_ENV, "").replace(",", " ").split())
    unknown = sorted(named - set(LABS))
    if unknown:
        pytest.fail(f"{ELSEWHERE_ENV} names no lab {', '.join(unknown)} (tests/needs.py LABS: "
                    f"{', '.join(sorted(LABS))})", pytrace=False)
    return named


def elsewhere(lab: str) -> None:
    """Called first at the single entry of each lab in LABS: when GPUDOCTOR_CI_ELSEWHERE names it, skip with ONE line
    (also under CI=true) saying which lab, why it cannot run in this stage, and that CI's main suite on Debian 12 runs
    it."""
    if lab not in LABS:
        raise KeyError(f"{lab} is not a lab of tests/needs.py LABS")
    if lab in elsewhere_labs():
        pytest.skip(f"{ELSEWHERE_MARK}the {lab} runs in CI's main suite on Debian 12 (.ci/run), not in this stage: "
                    f"{LABS[lab]}{MARK}")


def need(name: str) -> str:
    """The path of a required real component; skips (outside CI) or fails (CI=true) when it is missing."""
    path = find(name)
    if path is None:
        missing(name)
    return path
