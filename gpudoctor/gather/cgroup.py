"""The device cgroup the probes run in: its path, and what enforces device access there — the cgroup2 eBPF device
programs in effect (BPF_PROG_QUERY, BPF_CGROUP_DEVICE: the ids attached to each level from this cgroup up to the
hierarchy's root) or the cgroup v1 `devices.list`. Read only when an open() saw EPERM at a mode that allows it, so
that finding names the mechanism that refused, not a guess.

device_cgroup(host) = {
  "v2": {"path": "/sys/fs/cgroup/unified/cgdev-deny-x1", "cgroup": "/cgdev-deny-x1",
         "effective": [41], "levels": [{"path": ..., "ids": [41]}], "error": None | "EPERM (...)"},
  "v1": {"path": "/sys/fs/cgroup/devices/lxc/200", "cgroup": "/lxc/200", "list": ["c 195:* rwm", ...],
         "error": None},
}
"""

from __future__ import annotations

import json

from gpudoctor.host.childpy import python_argv
from gpudoctor.host import Host

# BPF_PROG_QUERY needs CAP_NET_ADMIN; an ordinary user gets EPERM (said so in the facts).
_PY_CGROUP = r"""
import ctypes, errno, json, os, platform, struct
out = {"v2": None, "v1": None}
def en(e):
    return errno.errorcode.get(e, str(e))
try:
    lines = open("/proc/self/cgroup").read().splitlines()
except OSError as e:
    print(json.dumps({"error": "/proc/self/cgroup: " + en(e.errno)}))
    raise SystemExit(0)
mounts = []
try:
    for ln in open("/proc/self/mountinfo"):
        left, _, right = ln.partition(" - ")
        a, b = left.split(), right.split()
        if len(a) >= 5 and len(b) >= 3:
            mounts.append((a[3], a[4].replace("\\040", " "), b[0], b[2]))
except OSError:
    pass
def place(cg, fstype, opt=None):
    for root, mp, fs, sopts in mounts:
        if fs != fstype or (opt and opt not in sopts.split(",")):
            continue
        if root == "/" or cg == root or cg.startswith(root.rstrip("/") + "/"):
            rel = cg[len(root.rstrip("/")):] if root != "/" else cg
            return mp, (mp.rstrip("/") + rel.rstrip("/")) or "/"
    return None, None
nr = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}.get(platform.machine())
libc = ctypes.CDLL(None, use_errno=True)
def query(path, flags):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        ids = (ctypes.c_uint32 * 64)()
        attr = ctypes.create_string_buffer(struct.pack("<IIIIQI", fd, 6, flags, 0, ctypes.addressof(ids), 64), 128)
        if libc.syscall(nr, 16, attr, 128) < 0:  # BPF_PROG_QUERY, attach type BPF_CGROUP_DEVICE
            return None, ctypes.get_errno()
        cnt = struct.unpack_from("<I", attr.raw, 24)[0]
        return [int(ids[i]) for i in range(min(cnt, 64))], 0
    finally:
        os.close(fd)
for ln in lines:
    hid, _, rest = ln.partition(":")
    ctrl, _, cg = rest.partition(":")
    if hid == "0" and ctrl == "":
        mp, path = place(cg, "cgroup2")
        v2 = {"cgroup": cg, "path": path, "effective": None, "levels": [], "error": None}
        out["v2"] = v2
        if path is None:
            v2["error"] = "no cgroup2 mount holds this cgroup"
        elif nr is None:
            v2["error"] = "bpf(2) number unknown on " + platform.machine()
        else:
            try:
                ids, err = query(path, 1)  # BPF_F_QUERY_EFFECTIVE: every program that applies here
                if err:
                    v2["error"] = en(err) + (" (BPF_PROG_QUERY needs CAP_NET_ADMIN)" if err == errno.EPERM else "")
                else:
                    v2["effective"] = ids
                    p = path
                    while True:
                        got, e2 = query(p, 0)
                        if got:
                            v2["levels"].append({"path": p, "ids": got})
                        if p.rstrip("/") == mp.rstrip("/") or "/" not in p.strip("/"):
                            break
                        p = os.path.dirname(p.rstrip("/"))
            except OSError as e:
                v2["error"] = en(e.errno)
    elif "devices" in ctrl.split(","):
        mp, path = place(cg, "cgroup", "devices")
        v1 = {"cgroup": cg, "path": path, "list": None, "error": None}
        out["v1"] = v1
        if path:
            try:
                v1["list"] = open(os.path.join(path, "devices.list")).read().split("\n")[:64]
                v1["list"] = [x for x in v1["list"] if x]
            except OSError as e:
                v1["error"] = en(e.errno)
        else:
            v1["error"] = "no devices controller mount holds this cgroup"
print(json.dumps(out))
"""


def device_cgroup(host: Host, timeout: float = 3.0) -> dict:
    """The probe's device cgroup (see the module doc); {"error": ...} when the probe itself failed."""
    res = host.run(python_argv(host.python, "-c", _PY_CGROUP, site=False), timeout=timeout)
    try:
        return json.loads(res.stdout) if res.ok else {"error": "cgroup probe " + res.describe()}
    except ValueError:
        return {"error": "cgroup probe printed no JSON: " + res.describe()}


def denies_everything(v1_list: list[str] | None) -> bool:
    """A v1 devices.list of `a *:* rwm` allows everything (no restriction)."""
    return not (v1_list and v1_list != ["a *:* rwm"])


def evidence(cg: dict | None) -> list[str]:
    """Evidence lines naming the cgroup and what enforces device access in it."""
    if not cg:
        return []
    if cg.get("error"):
        return [f"device cgroup: could not be read ({cg['error']})"]
    out = []
    v2 = cg.get("v2") or {}
    if v2.get("path"):
        if v2.get("error"):
            out.append(f"cgroup2 {v2['path']}: device programs unknown ({v2['error']})")
        elif v2.get("effective"):
            where = "; ".join(f"{lv['path']}: {', '.join(map(str, lv['ids']))}" for lv in v2.get("levels") or [])
            out.append(f"cgroup2 {v2['path']}: BPF_CGROUP_DEVICE program id(s) "
                       f"{', '.join(map(str, v2['effective']))} in effect" + (f" (attached at {where})" if where else ""))
        else:
            out.append(f"cgroup2 {v2['path']}: no device program attached")
    v1 = cg.get("v1") or {}
    if v1.get("path"):
        if v1.get("error"):
            out.append(f"cgroup v1 devices {v1['path']}: devices.list not readable ({v1['error']})")
        elif denies_everything(v1.get("list")):
            out.append(f"cgroup v1 devices {v1['path']}: devices.list allows everything (a *:* rwm)")
        else:
            shown = ", ".join(v1["list"][:8]) + (" …" if len(v1["list"]) > 8 else "")
            out.append(f"cgroup v1 devices {v1['path']}: devices.list = {shown}")
    return out
