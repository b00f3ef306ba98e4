"""What stands between the process and the GPU, named once: the platform (LXC, Docker, podman, Kubernetes, a systemd
unit, a VM, bare metal) and the fix text that fits it.

Every check and remedy that tells a user what to do about a device node asks `fix_text(facts, problem, ...)` instead of
writing its own advice, so a Docker host never reads "allow the major in the container's lxc.cgroup2.devices.allow".
Pure: reads facts["host"]["container"] (gather/hostinfo.py) and facts["platform"] (gather/platform.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

LABELS = {"lxc": "an LXC container", "docker": "a Docker/OCI container", "podman": "a podman container",
          "kubernetes": "a Kubernetes pod", "vm": "a virtual machine", "bare": "bare metal (no container or hypervisor seen)"}

# The fixes for the device-rule reset OCI containers suffer after `systemctl daemon-reload` under the systemd cgroup
# driver (NVIDIA/nvidia-container-toolkit#251, NVIDIA/nvidia-docker#1671 and #1730), most recommended first, as NVIDIA's
# notice lists them, in each engine's own words.
_SYMLINKS = ("for good: on the host run `nvidia-ctk system create-dev-char-symlinks --create-all` at boot through the udev "
             "rule `ACTION==\"add\", DEVPATH==\"/bus/pci/drivers/nvidia\", RUN+=\"/usr/bin/nvidia-ctk system "
             "create-dev-char-symlinks --create-all\"` in /lib/udev/rules.d/71-nvidia-dev-char.rules")
_NODES = ("--device /dev/nvidiactl --device /dev/nvidia0 --device /dev/nvidia-uvm --device /dev/nvidia-uvm-tools")


def daemon_reload_fixes(kind: str) -> tuple[str, ...]:
    """The known fixes for the daemon-reload reset on this engine (docker | podman | kubernetes)."""
    if kind == "kubernetes":
        return ("now: delete the pod so it is created again with its device rules",
                "for good: gpu-operator >= 22.9.2 creates the /dev/char symlinks itself; with the standalone device "
                "plugin " + _SYMLINKS[len("for good: "):],
                "or run the device plugin with --pass-device-specs, so the kubelet passes the nodes explicitly",
                "or use the cgroupfs driver for the kubelet and the runtime (cgroupDriver: cgroupfs, "
                "SystemdCgroup = false in containerd's runc options)")
    if kind == "podman":
        return ("now: restart the container (`podman restart` with the name or id `podman ps` shows) — its device rules are rebuilt",
                _SYMLINKS,
                "or request the GPUs through CDI (`podman run --device nvidia.com/gpu=all`) or the nodes explicitly (`"
                + _NODES + "`)",
                "or use the cgroupfs manager: `cgroup_manager = \"cgroupfs\"` in /etc/containers/containers.conf")
    return ("now: restart the container (`docker restart` with the name or id `docker ps` shows) — its device rules are rebuilt",
            _SYMLINKS,
            "or give the nodes explicitly so the rules survive a reload (`docker run " + _NODES + "`, or CDI: "
            "`--device nvidia.com/gpu=all`)",
            "or run Docker with the cgroupfs driver: `\"exec-opts\": [\"native.cgroupdriver=cgroupfs\"]` in "
            "/etc/docker/daemon.json, then `systemctl restart docker`")


@dataclass(frozen=True)
class Platform:
    kind: str  # lxc | docker | podman | kubernetes | vm | bare
    evidence: list[str] = field(default_factory=list)
    name: str | None = None  # the container's name when the runtime says it
    unit: str | None = None  # the systemd unit the probe runs in (a .service), when it is one
    cgroup: str | None = None  # the probe's cgroup (v2 path, or v1 name=systemd)
    cgroup_driver: str | None = None  # systemd | cgroupfs, when visible

    @property
    def label(self) -> str:
        return LABELS.get(self.kind, self.kind)

    @property
    def container(self) -> bool:
        return self.kind in ("lxc", "docker", "podman", "kubernetes")

    @property
    def oci(self) -> bool:
        """A container made by an OCI runtime (runc, crun) from device rules its engine wrote."""
        return self.kind in ("docker", "podman", "kubernetes")


def _text(d) -> str | None:
    return d.get("text") if isinstance(d, dict) else None


def own_cgroup(text: str | None) -> str | None:
    """The probe's cgroup from /proc/self/cgroup: the v2 line (0::PATH), else v1's name=systemd line."""
    v1 = None
    for ln in (text or "").splitlines():
        parts = ln.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            return parts[2].strip() or "/"
        if parts[1] == "name=systemd":
            v1 = parts[2].strip()
    return v1


def unit_of(cgroup: str | None) -> str | None:
    """The systemd service a cgroup path belongs to (…/sglang.service → sglang.service); scopes are not units we audit."""
    for part in reversed((cgroup or "").split("/")):
        if part.endswith(".service"):
            return part
    return None


def engine_of_cgroup(text: str | None) -> str | None:
    """podman or docker when a cgroup path names one of its containers (libpod-ID.scope, /libpod_parent/libpod-ID,
    docker-ID.scope, /docker/ID), else None."""
    t = text or ""
    if re.search(r"(^|/)libpod-[0-9a-f]{12,}(\.scope)?(/|$)", t, re.M):
        return "podman"
    if re.search(r"(^|/)docker-[0-9a-f]{12,}\.scope(/|$)|/docker/[0-9a-f]{12,}(/|$)", t, re.M):
        return "docker"
    return None


def driver_of(cgroup: str | None) -> str | None:
    """Docker/containerd/podman's cgroup driver as the container's cgroup path shows it (hidden by a cgroup namespace)."""
    c = cgroup or ""
    if re.search(r"/(docker|cri-containerd|crio|libpod)-[0-9a-f]{12,}\.scope$", c) or ".slice/" in c and "kubepods" in c:
        return "systemd"
    if re.search(r"^/(docker|kubepods|libpod_parent|machine)/", c) or re.search(r"/docker/[0-9a-f]{12,}$", c):
        return "cgroupfs"
    return None


def detect(facts: dict) -> Platform:
    """The platform the checker runs on: the host layer's container kind, refined by what the platform gather saw."""
    c = ((facts.get("host") or {}).get("container")) or {}
    kind, ev = c.get("kind") or "bare", list(c.get("evidence") or [])
    p = facts.get("platform") or {}
    name = None
    env = _text(p.get("containerenv"))
    if env is not None:  # podman writes /run/.containerenv into every container (engine="podman-4.3.1", name="…"
        # only when privileged: else it is empty, or "graphRootMounted=1"); no VM or bare host has it in its root
        m = re.search(r'^engine="([^"]*)"', env, re.M)
        if m and m.group(1).startswith("podman") or kind in ("bare", "docker", "vm"):
            if kind == "vm":
                ev.append("not a VM: the hypervisor flag shows through a container too")
            kind = "podman"
            ev.append("/run/.containerenv exists" + (f" (engine {m.group(1)})" if m else ""))
        if n := re.search(r'^name="([^"]*)"', env, re.M):
            name = n.group(1) or None
    cg = own_cgroup(_text(p.get("self_cgroup")))
    if kind in ("bare", "vm"):
        if engine := engine_of_cgroup(cg):
            kind = engine
            ev.append(f"this process's cgroup {cg} is a {engine} container's")
    k8s = p.get("kubernetes") or {}
    if k8s.get("serviceaccount") or k8s.get("env"):
        kind = "kubernetes"
        ev.append("a Kubernetes service account is mounted" if k8s.get("serviceaccount")
                  else "KUBERNETES_SERVICE_HOST is set")
    unit = unit_of(cg) if kind not in ("docker", "podman", "kubernetes", "lxc") else None
    return Platform(kind, ev, name, unit, cg, driver_of(cg))


def _major_words(major) -> str:
    return f"c {major}:*" if major is not None else "its major"


def nvidia_on_pci_bus(facts: dict) -> str | bool | None:
    """The NVIDIA display devices gpudoctor's sysfs probe listed (fabric facts): their addresses, False when it read
    sysfs (it listed the NUMA nodes beside /sys/bus/pci) and found none, None when it could not tell (no fabric
    facts, the probe failed, sysfs not there)."""
    fab = facts.get("fabric") or {}
    gpus = fab.get("gpus") or []
    if gpus:
        return ", ".join(str(g.get("bdf")) for g in gpus[:4]) + (" …" if len(gpus) > 4 else "")
    answered = "gpus" in fab and not fab.get("error") and not fab.get("timed_out")
    return False if answered and fab.get("numa_nodes") else None


def fix_text(facts: dict, problem: str, *, node: str | None = None, major: int | None = None,
             minor: int | None = None, plat: Platform | None = None) -> str:
    """What to do about a device-node problem on this platform. problem: denied | missing | stale | no_driver."""
    plat = plat or detect(facts)
    k = plat.kind
    node = node or "the node"
    if problem == "denied":
        if k == "lxc":
            return (f"Allow {_major_words(major)} in the container's lxc.cgroup2.devices.allow on the Proxmox host "
                    f"(`gpudoctor lxc fix`), or pass {node} with a devN: line, which follows the live major at every start.")
        if plat.oci:
            uvm = "nvidia-uvm" in node
            where = {"docker": "container", "podman": "container", "kubernetes": "pod"}[k]
            first = ("Restart the pod (delete it; its device rules are rebuilt)" if k == "kubernetes"
                     else f"Recreate the {where} (`{'podman' if k == 'podman' else 'docker'} rm -f` with its name or id, then run it again)")
            if uvm:
                return (f"The {where}'s device rules do not allow {_major_words(major)} ({node}): they were made without "
                        f"the uvm node or for an older uvm major (a stale CDI spec, a --device list without "
                        f"/dev/nvidia-uvm, or nvidia_uvm loaded after the {where} started). {first} with the GPUs "
                        f"requested as a whole (`--gpus all` or CDI `--device nvidia.com/gpu=all`), after regenerating "
                        f"the CDI spec (`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`).")
            return (f"The {where}'s device rules no longer allow {_major_words(major)} ({node}) although the node is "
                    f"there: the device-rule reset after `systemctl daemon-reload` under the systemd cgroup driver. "
                    + "; ".join(daemon_reload_fixes(k)) + ".")
        if plat.unit:
            return (f"{plat.unit}'s DevicePolicy=/DeviceAllow= does not allow {_major_words(major)}: add "
                    f"`DeviceAllow={node} rw` (or by its /proc/devices name, e.g. `char-nvidia-uvm rw`) in a drop-in "
                    f"(`systemctl edit {plat.unit}`), then `systemctl daemon-reload` and "
                    f"`systemctl restart {plat.unit}`.")
        return (f"A device cgroup denies {_major_words(major)} to this process although the node's mode allows it: find "
                f"its owner from `cat /proc/self/cgroup` (a systemd unit's DeviceAllow=, a container, a job scheduler's "
                f"cgroup) and allow the major there; `bpftool cgroup show /sys/fs/cgroup{plat.cgroup or '/'}` lists "
                f"the device programs{'' if plat.cgroup else ' (add the path /proc/self/cgroup names)'}.")
    if problem == "missing":
        if k == "lxc":
            return (f"Make {node} on the Proxmox host (`nvidia-modprobe -u -c 0`) and pass it with a devN: line or "
                    f"lxc.mount.entry; then restart the container.")
        if plat.oci:
            return (f"The runtime gives the container its nodes when it starts: make {node} on the host "
                    f"(`nvidia-modprobe -u -c 0` for the uvm nodes), regenerate the CDI spec if one is used "
                    f"(`nvidia-ctk cdi generate`), and recreate the {'pod' if k == 'kubernetes' else 'container'} "
                    f"with the GPUs requested (`--gpus all`, `--device nvidia.com/gpu=all`).")
        return (f"Create it: `nvidia-modprobe -u -c 0` (uvm nodes) or `nvidia-modprobe -c N` (GPU N), and make it run at "
                f"boot (the driver's udev rule or nvidia-persistenced).")
    if problem == "stale":
        mk = f"`mknod -m 666 {node} c {major} {minor}`" if major is not None and minor is not None else "`nvidia-modprobe -u -c 0`"
        if k == "lxc":
            return f"Fix the node on the Proxmox host ({mk} there) and its bind mount or devN: line; restart the container."
        if plat.oci:
            live = f"c {major}:{minor}" if major is not None else "the live number"
            return (f"{node} in this {'pod' if k == 'kubernetes' else 'container'} is not {live}: the runtime made it "
                    f"from a stale CDI spec or before the driver was reloaded, or it is bound from elsewhere. Now: "
                    f"{mk} where the container may make nodes; for good: regenerate the spec on the host (`nvidia-ctk "
                    f"cdi generate`) and recreate the "
                    f"{'pod' if k == 'kubernetes' else 'container'}.")
        return f"Recreate the node: {mk} (or `nvidia-modprobe -u -c 0`)."
    if problem == "no_driver":
        if k == "lxc":
            return "Load the NVIDIA driver on the Proxmox host (modprobe nvidia); an LXC guest shares the host's kernel."
        if plat.oci:
            return ("Load the NVIDIA driver on the host (modprobe nvidia, or the gpu-operator driver container); "
                    "a container shares the host's kernel.")
        seen = nvidia_on_pci_bus(facts)
        if seen is False:  # gpudoctor read the PCI vendor ids itself: no lspci to suggest (absent on a minbase)
            if k == "vm":
                return ("No NVIDIA device on this VM's PCI bus (/sys/bus/pci/devices has no vendor 10de display "
                        "device): pass the GPU through to the VM (Proxmox: a hostpciN: line), then load the driver.")
            return ("No NVIDIA device on the PCI bus (/sys/bus/pci/devices has no vendor 10de display device): no "
                    "driver can help until one is seated, powered and enabled in the firmware.")
        on_bus = f" (the GPU is on the PCI bus: {seen})" if seen else ""
        if k == "vm":
            return f"Install and load the NVIDIA driver in this VM (modprobe nvidia){on_bus}."
        return f"Install or load the NVIDIA driver (modprobe nvidia){on_bus}."
    raise ValueError(f"unknown problem {problem!r}")
