"""Device-node facts: every /dev/nvidia* node's type, major:minor, mode, and the errno of a real open() made the way
the node's consumer opens it (CUDA opens its nodes read-write; a capability node is opened read-only: the driver
grants a capability to whoever may read its node), plus who the probe runs as, so a refusal can be judged against
what that user needs."""

from __future__ import annotations

import re

from gpudoctor.gather.cgroup import device_cgroup
from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host
from gpudoctor.host.replay import NOT_RECORDED_OPEN

# Nodes CUDA needs even when absent from /dev (so absence is seen).
EXPECTED = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
# Capability node directories: nvidia-capN (MIG config/monitor/instances), IMEX channels.
CAP_DIRS = ["/dev/nvidia-caps", "/dev/nvidia-caps-imex-channels"]
# The driver names each capability and its node's minor here ("DeviceFileMinor: N").
CAP_PROC = {"mig-config": "/proc/driver/nvidia/capabilities/mig/config",
            "mig-monitor": "/proc/driver/nvidia/capabilities/mig/monitor"}


def is_capability(path: str) -> bool:
    return any(path.startswith(d + "/") for d in CAP_DIRS)


def access_for(path: str) -> str:
    """How the node's consumer opens it: "r" for capability nodes, "rw" for the rest."""
    return "r" if is_capability(path) else "rw"


def parse_identity(status: str | None) -> dict | None:
    """/proc/self/status Uid/Gid/Groups → the effective uid, gid and supplementary groups of the probe."""
    if not status:
        return None
    def ids(key):
        m = re.search(rf"^{key}:[ \t]*(.*)$", status, re.M)
        return [int(x) for x in m.group(1).split()] if m else []
    uid, gid = ids("Uid"), ids("Gid")
    if len(uid) < 2 or len(gid) < 2:
        return None
    return {"uid": uid[1], "gid": gid[1], "groups": ids("Groups")}


def parse_cap_minor(text: str | None) -> int | None:
    m = re.search(r"DeviceFileMinor:\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def gather(host: Host, ctx: GatherContext) -> dict:
    t = min(ctx.timeout, 5.0)
    first = host.batch([("listdir", "/dev"), ("read", "/proc/self/status", 64 << 10),
                        *(("read", p, 4096) for p in CAP_PROC.values())], t)
    dev, status, cap_reads = first[0], first[1], first[2:]
    names = [n for n in dev if n.startswith("nvidia")] if isinstance(dev, list) else []
    paths = sorted({*(f"/dev/{n}" for n in names), *EXPECTED})
    dirs = [d for d in CAP_DIRS if d.rsplit("/", 1)[-1] in names]
    listings = host.batch([("listdir", d) for d in dirs], t) if dirs else []
    for d, entries in zip(dirs, listings):
        if isinstance(entries, list):
            paths += [f"{d}/{n}" for n in entries]
    stats = host.stat_many(paths, t)
    nodes = [p for p, s in stats.items() if s.kind == "char"]
    # Opening /dev/nvidiaN can take seconds without persistence mode (GPU init): give it the full deadline.
    ops = [("open", [p for p in nodes if access_for(p) == a], a) if a == "r" else ("open", [p for p in nodes
           if access_for(p) == a]) for a in ("rw", "r")]
    ops = [op for op in ops if op[1]]
    opens: dict = {}
    for res in (host.batch(ops, ctx.timeout) if ops else []):
        opens.update(res)
    access = {p: access_for(p) for p in stats}
    older = [p for p, r in opens.items() if r == NOT_RECORDED_OPEN]  # a snapshot that opened every node O_RDWR
    if older:
        opens.update(host.try_open_many(older, ctx.timeout))
        access.update({p: "rw" for p in older})
    # An EPERM is the device cgroup's answer: name the cgroup and what enforces it there (read only then).
    cgroup = device_cgroup(host, t) if "EPERM" in opens.values() else None
    caps = {}
    for name, r in zip(CAP_PROC, cap_reads):
        minor = parse_cap_minor(r.text if r.ok else None)
        if minor is not None:
            caps[minor] = name
    return {
        "listdir_error": dev if isinstance(dev, str) else None,
        "identity": parse_identity(status.text if status.ok else None),
        "capabilities": {str(k): v for k, v in sorted(caps.items())},
        **({"cgroup": cgroup} if cgroup is not None else {}),
        "nodes": {p: {**s.to_json(), "open": opens.get(p), "access": access[p]} for p, s in stats.items()},
    }
