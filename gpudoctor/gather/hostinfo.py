"""Host layer facts: kernel modules, driver version file, live device majors, container/VM detection."""

from __future__ import annotations

import re

from gpudoctor.boundary.platform import engine_of_cgroup
from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host


def parse_proc_devices(text: str) -> dict:
    """/proc/devices → {"char": {name: major}, "block": {...}}; the live majors (dynamic ones drift)."""
    out: dict = {"char": {}, "block": {}}
    section = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("Character devices"):
            section = "char"
        elif s.startswith("Block devices"):
            section = "block"
        elif section and (m := re.match(r"^(\d+)\s+(\S.*)$", s)):
            out[section].setdefault(m.group(2), int(m.group(1)))
    return out


def parse_driver_version(text: str) -> dict:
    """/proc/driver/nvidia/version → kernel module version and flavour (open or proprietary)."""
    m = re.search(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s", text or "")
    return {"version": m.group(1) if m else None, "open": "Open Kernel Module" in (text or ""),
            "line": (text or "").splitlines()[0].strip() if text else None}


def detect_container(reads: dict) -> dict:
    """Decide lxc | docker | podman | vm | bare from what the guest can see; keep the evidence. A VM only when no
    container shows (platform.detect refines it with /run/.containerenv and the probe's own cgroup)."""
    ev = []
    env1 = reads.get("/proc/1/environ") or ""
    sysd = (reads.get("/run/systemd/container") or "").strip()
    cgroup = reads.get("/proc/1/cgroup") or ""
    cpuinfo = reads.get("/proc/cpuinfo") or ""
    vendor = (reads.get("/sys/class/dmi/id/sys_vendor") or "").strip()
    product = (reads.get("/sys/class/dmi/id/product_name") or "").strip()
    kind = "bare"
    m = re.search(r"container=([a-z\-]+)", env1.replace("\0", "\n"))
    if sysd:
        kind = "docker" if sysd in ("docker", "podman", "oci") else sysd
        ev.append(f"/run/systemd/container = {sysd}")
    elif m:
        kind = m.group(1)
        ev.append(f"/proc/1/environ has container={kind}")
    elif reads.get("/.dockerenv") is not None:
        kind = "docker"
        ev.append("/.dockerenv exists")
    elif "/lxc/" in cgroup or "lxc.payload" in cgroup:
        kind = "lxc"
        ev.append("/proc/1/cgroup names lxc")
    elif engine := engine_of_cgroup(cgroup):
        kind = engine
        ev.append(f"/proc/1/cgroup names {engine}")
    # Only when no container shows: the hypervisor flag is also set inside any container on a VM, and in a chroot
    # /proc/1 may be the outer init, which says nothing of this root (gpudoctor never asks systemd-detect-virt,
    # which answers for the machine, not for the root the probe runs in).
    if kind == "bare" and (re.search(r"^flags\s*:.*\bhypervisor\b", cpuinfo, re.M) or
                           re.search(r"QEMU|KVM|VMware|Xen|Firecracker|Amazon EC2|Google|Microsoft", vendor + product)):
        kind = "vm"
        ev.append("cpu flags include 'hypervisor'" + (f"; DMI {vendor} {product}".rstrip() if vendor else ""))
    if kind.startswith("lxc"):
        kind = "lxc"
    return {"kind": kind, "evidence": ev}


_CONTAINER_FILES = ["/run/systemd/container", "/proc/1/environ", "/proc/1/cgroup", "/.dockerenv",
                    "/sys/class/dmi/id/sys_vendor", "/sys/class/dmi/id/product_name"]


_KERNEL_FILES = ["/proc/modules", "/proc/driver/nvidia/version", "/proc/devices", "/proc/sys/kernel/osrelease",
                 "/proc/sys/kernel/hostname", "/proc/sys/kernel/random/boot_id", "/proc/sys/kernel/dmesg_restrict"]


def gather(host: Host, ctx: GatherContext) -> dict:
    t = min(ctx.timeout, 3.0)
    # One round trip: every file at once (the first CPU's flags are enough of /proc/cpuinfo).
    got = host.batch([*(("read", p) for p in _KERNEL_FILES),
                      *(("read", p, 64 << 10) for p in [*_CONTAINER_FILES, "/proc/cpuinfo"])], t)
    r = dict(zip([*_KERNEL_FILES, *_CONTAINER_FILES, "/proc/cpuinfo"], got))
    modules, version, devices = r["/proc/modules"], r["/proc/driver/nvidia/version"], r["/proc/devices"]
    reads = {p: (r[p].text if r[p].ok else None) for p in _CONTAINER_FILES}
    reads["/proc/cpuinfo"] = r["/proc/cpuinfo"].text if r["/proc/cpuinfo"].ok else ""
    mods = sorted({ln.split()[0] for ln in (modules.text or "").splitlines() if ln.strip()})
    osrel, hostname, boot, restrict = (r[p] for p in _KERNEL_FILES[3:])
    return {
        "modules": {"error": modules.error, "nvidia": [m for m in mods if m.startswith("nv")]},
        "driver_version_file": {"error": version.error, **parse_driver_version(version.text or "")},
        "proc_devices": {"error": devices.error, **parse_proc_devices(devices.text or "")},
        "container": detect_container(reads),
        "kernel": (osrel.text or "").strip() or None,
        "hostname": (hostname.text or "").strip() or None,
        "boot_id": (boot.text or "").strip() or None,
        "dmesg_restrict": int(restrict.text.strip()) if restrict.ok and restrict.text.strip().isdigit() else None,
    }
