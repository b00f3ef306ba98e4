"""Fabric facts: PCIe config space of each NVIDIA function, NUMA placement, numa_balancing, topology, NCCL env."""

from __future__ import annotations

import json
import re

from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host
from gpudoctor.host.childpy import python_argv


# One program on the target scans sysfs (one round trip over SSH, one key in a snapshot).
PROBE = r"""
import json, os, re
base = "/sys/bus/pci/devices"
def rd(p, n=4096, binary=False):
    try:
        with open(p, "rb") as f:
            d = f.read(n)
        return d if binary else d.decode("utf-8", "replace").strip()
    except OSError as e:
        return None
gpus = []
try:
    entries = sorted(os.listdir(base))
except OSError:
    entries = []
for b in entries:
    p = os.path.join(base, b)
    if rd(p + "/vendor") != "0x10de":
        continue
    cls = rd(p + "/class") or ""
    if not cls.startswith("0x03"):
        continue
    d = {"bdf": b, "class": cls, "device": rd(p + "/device")}
    for f in ("numa_node", "local_cpulist", "current_link_speed", "current_link_width", "max_link_speed", "max_link_width"):
        d[f] = rd(p + "/" + f)
    cfg = rd(p + "/config", 4096, binary=True)
    d["config_hex"] = cfg.hex() if cfg is not None else None
    gpus.append(d)
nodes = {}
try:
    for n in sorted(os.listdir("/sys/devices/system/node")):
        if re.match(r"node\d+$", n):
            nodes[n] = rd("/sys/devices/system/node/%s/cpulist" % n)
except OSError:
    pass
secret = re.compile(r"TOKEN|KEY|SECRET|PASS", re.I)
env = {k: ("<redacted>" if secret.search(k) else v) for k, v in os.environ.items()
       if k.startswith(("NCCL_", "CUDA_VISIBLE", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE"))}
print(json.dumps({"gpus": gpus, "numa_nodes": nodes, "numa_balancing": rd("/proc/sys/kernel/numa_balancing"), "env": env}))
"""


def decode_pcie(config: bytes) -> dict:
    """Decode the PCI Express capability from config space: MPS, MRRS, link speed/width. < 256 bytes is unreadable."""
    if config is None or len(config) < 256:
        return {"readable": False, "bytes": 0 if config is None else len(config)}
    if not (config[0x06] & 0x10):  # status register: capabilities list present
        return {"readable": True, "found": False}
    ptr, seen = config[0x34] & 0xFC, set()
    while ptr and ptr not in seen and ptr + 0x14 <= len(config):
        seen.add(ptr)
        if config[ptr] == 0x10:  # CAP_EXP
            dev_cap = int.from_bytes(config[ptr + 4:ptr + 8], "little")
            dev_ctl = int.from_bytes(config[ptr + 8:ptr + 10], "little")
            lnk_cap = int.from_bytes(config[ptr + 0x0C:ptr + 0x10], "little")
            lnk_sta = int.from_bytes(config[ptr + 0x12:ptr + 0x14], "little")
            return {
                "readable": True, "found": True, "cap_offset": ptr,
                "mps_supported": 128 << (dev_cap & 0x7),
                "mps": 128 << ((dev_ctl >> 5) & 0x7),
                "mrrs": 128 << ((dev_ctl >> 12) & 0x7),
                "devctl": dev_ctl,
                "link_speed_max": lnk_cap & 0xF, "link_width_max": (lnk_cap >> 4) & 0x3F,
                "link_speed": lnk_sta & 0xF, "link_width": (lnk_sta >> 4) & 0x3F,
            }
        ptr = config[ptr + 1] & 0xFC
    return {"readable": True, "found": False}


def parse_topo(text: str) -> dict:
    """`nvidia-smi topo -m` → GPU names and the link type of each GPU pair (X, SYS, NODE, PHB, PXB, PIX, NV#)."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in text.splitlines()]
    header = next((ln for ln in lines if re.match(r"^\s+GPU0\b", ln)), None)
    if header is None:
        return {"gpus": [], "pairs": {}}
    cols = header.split("\t") if "\t" in header else header.split()
    cols = [c.strip() for c in cols if c.strip()]
    gpus = [c for c in cols if re.match(r"^GPU\d+$", c)]
    pairs, affinity = {}, {}
    for ln in lines:
        cells = [c.strip() for c in (ln.split("\t") if "\t" in ln else ln.split())]
        cells = [c for c in cells if c != ""]
        if not cells or not re.match(r"^GPU\d+$", cells[0]):
            continue
        row = cells[0]
        for i, g in enumerate(gpus):
            if i + 1 < len(cells) and g != row:
                pairs[f"{row}-{g}"] = cells[i + 1]
        rest = cells[1 + len(gpus):]
        if rest:
            affinity[row] = {"cpus": rest[0], "numa": rest[1] if len(rest) > 1 else None}
    return {"gpus": gpus, "pairs": pairs, "affinity": affinity}


# Link types from best to worst (nvidia-smi topo -m legend); NV# is NVLink with # links.
_LINK_RANK = {"X": 0, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 5, "SYS": 6}


def _link_rank(v: str) -> int:
    return 1 if v.startswith("NV") else _LINK_RANK.get(v, 7)


def tp_groups(topo: dict, size: int) -> list[dict]:
    """Disjoint GPU sets of `size` with the best worst-link, packed by NUMA node first (greedy, deterministic)."""
    gpus = topo.get("gpus") or []
    pairs = topo.get("pairs") or {}
    aff = topo.get("affinity") or {}

    def link(a, b):
        return pairs.get(f"{a}-{b}") or pairs.get(f"{b}-{a}") or "SYS"

    order = sorted(gpus, key=lambda g: (str((aff.get(g) or {}).get("numa")), int(g[3:])))
    groups = []
    for i in range(0, len(order) - size + 1, size):
        members = order[i:i + size]
        worst = max((link(a, b) for j, a in enumerate(members) for b in members[j + 1:]), key=_link_rank, default="X")
        numas = sorted({str((aff.get(g) or {}).get("numa")) for g in members})
        groups.append({"gpus": members, "worst_link": worst, "numa_nodes": numas})
    return groups


def probe_argv(python: list[str], ctx: GatherContext) -> list[str]:
    """The sysfs probe's command line (gather/prestart.py starts the same one at CLI entry)."""
    return python_argv(python, "-c", PROBE, site=False)


def gather(host: Host, ctx: GatherContext) -> dict:
    res = host.run(probe_argv(host.python, ctx), timeout=ctx.timeout)
    out: dict = {"timed_out": res.timed_out}
    if res.ok:
        try:
            data = json.loads(res.stdout)
        except ValueError:
            data = {}
        for g in data.get("gpus", []):
            raw = g.pop("config_hex")
            g["config_bytes"] = None if raw is None else len(raw) // 2
            g["pcie"] = decode_pcie(bytes.fromhex(raw) if raw is not None else None)
        out.update(data)
    else:
        out["error"] = "sysfs probe " + res.describe()
    if res.ok and len(out.get("gpus") or []) == 1:
        # One NVIDIA GPU in sysfs: no pairs to place, and no third GPU-driver client contending with cuInit and
        # nvidia-smi -q -x for the driver's lock (on the H200 that contention alone adds ~45 ms to a check).
        out["topo"] = {"gpus": ["GPU0"], "pairs": {}, "affinity": {},
                       "skipped": f"one NVIDIA GPU in sysfs ({out['gpus'][0]['bdf']}): nvidia-smi topo -m not run"}
        return out
    topo = host.run(["nvidia-smi", "topo", "-m"], timeout=ctx.timeout)
    out["topo"] = parse_topo(topo.stdout) if topo.ok else {"error": topo.describe()}
    if len(out["topo"].get("gpus") or []) > 1:  # peer-to-peer read status of every GPU pair (same table shape)
        p2p = host.run(["nvidia-smi", "topo", "-p2p", "r"], timeout=ctx.timeout)
        out["p2p_read"] = parse_topo(p2p.stdout)["pairs"] if p2p.ok else {"error": p2p.describe()}
    return out
