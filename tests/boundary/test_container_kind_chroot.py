"""Podman and Docker inside a chroot are detected as what they are, not as the VM underneath (#42 item 4).

The layout is what gpudoctor saw in CI's trixie stage (the suite chrooted into a Debian 13 root filesystem on a VM,
tests/boundary/test_podman_cdi.py's container started from there): the container's root has podman's
/run/.containerenv — empty or "graphRootMounted=1" in an unprivileged container, no engine= line — and no
/run/systemd/container; /proc/1 says nothing (its environ has no container=, its cgroup is "/"), while /proc/cpuinfo
has the hypervisor flag and DMI names QEMU, which any container on a VM sees too. Before, that read "vm". The real
gathers (gather/hostinfo.py, gather/platform.py) read a fake root through LocalHost(root=...); the host.platform
finding is what a user reads.
"""

from __future__ import annotations

import pytest

from gpudoctor.boundary.platform import detect
from gpudoctor.gather import hostinfo, platform
from gpudoctor.gather.context import GatherContext
from gpudoctor.host.local import LocalHost

CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu vme de pse tsc msr pae hypervisor lahf_lm\n"
LIBPOD = "libpod-f24054c9b2ef7ff1b5f285c9800e279c845ad14bb2b5d9cd345d63457321210c"
DOCKER = "docker-3a1f0d6c8e2b4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c"


def fake_root(tmp_path, files: dict[str, str]):
    """A root as a chroot on a VM shows it: the VM's cpuinfo and DMI, /proc/1 telling nothing, plus `files`."""
    base = {"/proc/cpuinfo": CPUINFO, "/sys/class/dmi/id/sys_vendor": "QEMU\n",
            "/sys/class/dmi/id/product_name": "Standard PC (Q35 + ICH9, 2009)\n", "/proc/1/environ": "",
            "/proc/1/cgroup": "0::/\n", "/proc/self/cgroup": "0::/\n", **files}
    for path, text in base.items():
        p = tmp_path / path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return LocalHost(root=str(tmp_path))


def kind_of(host):
    ctx = GatherContext(name="chroot", timeout=5)
    facts = {"host": {"container": hostinfo.gather(host, ctx)["container"]}, "platform": platform.gather(host, ctx)}
    return facts, detect(facts)


def test_the_bare_layout_is_a_vm(tmp_path):
    """The control: nothing of a container in the root, the hypervisor flag → a VM, as before."""
    facts, plat = kind_of(fake_root(tmp_path, {}))
    assert plat.kind == "vm", plat
    assert facts["host"]["container"]["kind"] == "vm"


@pytest.mark.parametrize("containerenv", ["", "graphRootMounted=1\n"], ids=["empty", "graphRootMounted"])
def test_podman_in_a_chroot_on_a_vm_is_podman(tmp_path, containerenv):
    facts, plat = kind_of(fake_root(tmp_path, {"/run/.containerenv": containerenv}))
    assert plat.kind == "podman", plat
    assert plat.label == "a podman container" and plat.container and plat.oci
    assert "/run/.containerenv exists" in plat.evidence
    assert any("hypervisor flag shows through a container" in e for e in plat.evidence), plat.evidence


def test_podman_seen_by_its_cgroup_alone(tmp_path):
    """No /run/.containerenv (a --rootfs overlay that hides it): the libpod cgroup of the process still says podman."""
    _, plat = kind_of(fake_root(tmp_path, {"/proc/self/cgroup": f"0::/machine.slice/{LIBPOD}.scope/container\n"}))
    assert plat.kind == "podman", plat
    _, plat = kind_of(fake_root(tmp_path, {"/proc/1/cgroup": f"9:name=systemd:/libpod_parent/{LIBPOD}\n"}))
    assert plat.kind == "podman", plat


@pytest.mark.parametrize("files", [
    {"/.dockerenv": ""},
    {"/proc/self/cgroup": f"0::/system.slice/{DOCKER}.scope\n"},
    {"/proc/1/cgroup": "12:devices:/docker/3a1f0d6c8e2b4f5a6b7c8d9e0f1a2b3c\n"},
], ids=["dockerenv", "systemd-driver-cgroup", "cgroupfs-driver-cgroup"])
def test_docker_in_a_chroot_on_a_vm_is_docker(tmp_path, files):
    _, plat = kind_of(fake_root(tmp_path, files))
    assert plat.kind == "docker", plat
    assert plat.label == "a Docker/OCI container"


def test_the_host_platform_finding_names_podman(tmp_path):
    from gpudoctor.diagnose import diagnose

    facts, _ = kind_of(fake_root(tmp_path, {"/run/.containerenv": "graphRootMounted=1\n"}))
    [f] = [x for x in diagnose(facts).findings if x.id == "host.platform"]
    assert f.data["kind"] == "podman" and "podman" in f.summary, f.summary
