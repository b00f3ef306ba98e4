"""A GPU host in a temp directory: real files and real mknod'ed nodes under a root that LocalHost(root=...) maps,
stand-in tools (tests/remedies/standins) first on PATH acting on the same root, and the facts gathered from it.

    r = HostRoot(tmp_path, uvm_major=511)
    r.node("/dev/nvidia-uvm", 509, 0)        # a stale node
    facts = r.facts()                       # host + devices + tools (+ driver, fabric when asked)
    r.calls()                               # every stand-in call, argv lists
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from gpudoctor.gather import gather
from gpudoctor.gather.context import GatherContext
from gpudoctor.host.local import LocalHost

HERE = Path(__file__).resolve().parent
STANDINS = HERE / "standins"
CAPTURES = HERE.parent / "fixtures" / "captures"
NAME = "gpu1"
BDF = "0000:00:06.0"


def capture(host: str, name: str) -> str:
    lines = (CAPTURES / host / name).read_text().splitlines()
    return "\n".join(lines[1:-1]) + "\n"


def proc_devices(uvm_major: int | None) -> str:
    text = capture("h200-healthy", "proc-devices.txt")
    if uvm_major is None:
        return text.replace("238 nvidia-uvm\n", "")
    return text.replace("238 nvidia-uvm", f"{uvm_major} nvidia-uvm")


def config_space() -> bytes:
    """The H200's 4096 bytes of PCI config space (PCIe capability at 0x60, DevCtl 0x5134: MRRS 4096)."""
    text = (CAPTURES / "h200-healthy" / f"pci-{BDF}.config.hex").read_text()  # `od -An -tx1` output
    data = bytes.fromhex("".join(text.split()))
    assert len(data) == 4096
    return data


class HostRoot:
    def __init__(self, tmp_path: Path, uvm_major: int | None = 511, *, container: str = "bare", mknod: bool = True,
                 userns: bool = False, gpus: int = 1, without: tuple[str, ...] = ()):
        self.root = tmp_path / "root"
        # The stand-ins on this host's PATH (symlinks; `without` leaves some out, e.g. nvidia-modprobe).
        self.bin = tmp_path / "bin"
        self.bin.mkdir(exist_ok=True)
        (self.bin / ".standin-root").write_text(str(self.root))
        for tool in STANDINS.iterdir():
            if not tool.name.startswith("_") and tool.name not in without and not (self.bin / tool.name).exists():
                (self.bin / tool.name).symlink_to(tool)
        for d in ("dev", "proc/driver/nvidia", "proc/self", "proc/sys/kernel", "etc/sysctl.d", "etc/systemd/system",
                  "var/lib", "standin-faults"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.write("/proc/devices", proc_devices(uvm_major))
        mods = "nvidia 14299136 - - Live 0x0 (O)\n" + ("nvidia_uvm 1830912 - - Live 0x0 (O)\n" if uvm_major else "")
        self.write("/proc/modules", mods)
        self.write("/proc/driver/nvidia/version", capture("h200-healthy", "driver-version.txt"))
        self.caps(mknod=mknod, userns=userns)
        self.mountinfo = ["24 1 0:6 / /dev rw,relatime - devtmpfs udev rw,mode=755"]
        self._mountinfo()
        self.container(container)
        self.gpus = gpus
        self.env = {"GPUDOCTOR_STANDIN_ROOT": str(self.root)}  # the stand-ins act under this root (conftest sets it)

    # --- building the host ---------------------------------------------------------------------------
    def path(self, p: str) -> Path:
        return self.root / p.lstrip("/")

    def write(self, p: str, text: str | bytes, mode: int | None = None) -> Path:
        f = self.path(p)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(text.encode() if isinstance(text, str) else text)
        if mode is not None:
            os.chmod(f, mode)
        return f

    def read(self, p: str) -> str:
        return self.path(p).read_text()

    def node(self, p: str, major: int, minor: int, mode: int = 0o666) -> Path:
        from tests import needs

        needs.root()  # mknod
        f = self.path(p)
        if f.exists() or f.is_symlink():
            f.unlink()
        os.mknod(f, stat.S_IFCHR | mode, os.makedev(major, minor))
        os.chmod(f, mode)
        return f

    def healthy_nodes(self, uvm_major: int = 511) -> "HostRoot":
        self.node("/dev/nvidiactl", 195, 255)
        for i in range(self.gpus):
            self.node(f"/dev/nvidia{i}", 195, i)
        self.node("/dev/nvidia-uvm", uvm_major, 0)
        self.node("/dev/nvidia-uvm-tools", uvm_major, 1)
        return self

    def stat(self, p: str):
        st = os.lstat(self.path(p))
        return (stat.S_IFMT(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode))

    def caps(self, mknod: bool = True, userns: bool = False) -> None:
        eff = 0x000001FFFFFFFFFF if mknod else 0x000001FFFFFFFFFF & ~(1 << 27)
        self.write("/proc/self/status", f"Name:\tpython3\nCapInh:\t0000000000000000\nCapEff:\t{eff:016x}\n")
        self.write("/proc/self/uid_map", "         0     100000      65536\n" if userns else
                   "         0          0 4294967295\n")

    def bind_mount(self, target: str, source: str = "/dev/mapper/pve-root", root: str = "/dev/nvidia-uvm",
                   fstype: str = "devtmpfs") -> None:
        self.mountinfo.append(f"{30 + len(self.mountinfo)} 24 0:6 {root} {target} rw,nosuid - {fstype} {source} rw")
        self._mountinfo()

    def _mountinfo(self) -> None:
        self.write("/proc/self/mountinfo", "\n".join(self.mountinfo) + "\n")

    def container(self, kind: str) -> None:
        if kind == "lxc":
            self.write("/proc/1/environ", "container=lxc\0PATH=/usr/bin\0")
        elif kind == "docker":
            self.write("/run/systemd/container", "docker\n")

    def fault(self, name: str) -> None:
        self.write(f"/standin-faults/{name}", "")

    # --- using it ------------------------------------------------------------------------------------
    def host(self) -> LocalHost:
        return LocalHost(name=NAME, root=str(self.root), path_prepend=[str(self.bin)])

    def facts(self, only=("host", "devices", "tools"), policy: dict | None = None) -> dict:
        ctx = GatherContext(name=NAME, timeout=5, policy=policy or {})
        facts = gather(self.host(), ctx, only=set(only) - {"fabric"})
        if "fabric" in only:
            facts["fabric"] = self.fabric_facts()
        facts.setdefault("driver", {"rc": 0, "gpus": [{"minor": i, "bus_id": f"00000000:00:0{6 + i}.0"}
                                                      for i in range(self.gpus)]})
        return facts

    def pci(self, bdf: str = BDF, config: bytes | None = None) -> None:
        """An NVIDIA function in sysfs with the H200's config space (root can read all 4096 bytes)."""
        self.write(f"/sys/bus/pci/devices/{bdf}/config", config if config is not None else config_space())
        self.write(f"/sys/bus/pci/devices/{bdf}/vendor", "0x10de\n")

    def fabric_facts(self, numa_nodes: int = 2) -> dict:
        """facts["fabric"] as gather.fabric would give on this host: its probe runs a program that reads the real
        /sys and /proc (not the temp root), so the tests read the root's files with the same decoder."""
        from gpudoctor.gather.fabric import decode_pcie

        gpus = []
        base = self.path("/sys/bus/pci/devices")
        for bdf in sorted(os.listdir(base)) if base.exists() else []:
            cfg = (base / bdf / "config").read_bytes()
            gpus.append({"bdf": bdf, "config_bytes": len(cfg), "pcie": decode_pcie(cfg), "numa_node": "-1"})
        nb = self.path("/proc/sys/kernel/numa_balancing")
        return {"gpus": gpus, "numa_balancing": nb.read_text().strip() if nb.exists() else None,
                "numa_nodes": {f"node{i}": f"{8 * i}-{8 * i + 7}" for i in range(numa_nodes)}, "env": {}}

    def calls(self, tool: str | None = None) -> list[list[str]]:
        f = self.root / "standin-calls.jsonl"
        rows = [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []
        return [r for r in rows if tool is None or r[0] == tool]
