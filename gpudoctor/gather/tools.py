"""What the remedies need to plan without touching the host: tools on PATH, capabilities, bind mounts over the GPU
nodes, systemd units, the current text of the files gpudoctor manages, and every sysctl file that sets
kernel.numa_balancing. Read-only; one shell round trip plus a handful of reads.

facts["tools"] = {
  "commands": {"nvidia-modprobe": "/usr/bin/nvidia-modprobe" | None, ...},
  "caps": {"effective": "000001ffffffffff", "mknod": bool, "sys_admin": bool, "userns": bool} | {"error": ...},
  "dev_mounts": {"/dev/nvidia-uvm": {"root": "/null", "fstype": "devtmpfs", "source": "udev"}, ...},
  "proc_sys_readonly": bool | None,   # /proc/sys mounted read-only (a container): sysctl -w cannot work
  "systemd": bool,        # systemd runs as init (/run/systemd/system is a directory)
  "units": {"nvidia-persistenced.service": {"path": ..., "text": ..., "enabled": ..., "active": ...}},
  "files": {"/etc/sysctl.d/90-gpudoctor-numa.conf": {"text": ... | None, "error": "ENOENT" | None}, ...},
  "sysctl_numa": [{"path": ..., "line": N, "value": "1"}, ...],
}
"""

from __future__ import annotations

import re

from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host

COMMANDS = ["nvidia-modprobe", "nvidia-smi", "nvidia-persistenced", "systemctl", "sysctl", "setpci", "gpudoctor"]
PERSISTENCED_UNIT = "nvidia-persistenced.service"
UNITS = [PERSISTENCED_UNIT]
UNIT_DIRS = ["/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system", "/usr/lib/systemd/system",
             "/lib/systemd/system"]

# The files gpudoctor writes (remedies/sysctl.py, remedies/pcie.py): their current text makes the plan's diff.
SYSCTL_NUMA_FILE = "/etc/sysctl.d/90-gpudoctor-numa.conf"
PCIE_UNIT = "gpudoctor-pcie-mrrs.service"
PCIE_UNIT_FILE = f"/etc/systemd/system/{PCIE_UNIT}"
MANAGED_FILES = [SYSCTL_NUMA_FILE, PCIE_UNIT_FILE]

# systemd-sysctl reads these (sysctl.d(5)); files sort by name across directories, the last setting wins.
SYSCTL_DIRS = ["/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d", "/lib/sysctl.d"]
SYSCTL_CONF = "/etc/sysctl.conf"

CAP_MKNOD, CAP_SYS_ADMIN, CAP_SYS_MODULE = 27, 21, 16

# One round trip: where each tool is (sbin added: root's tools live there) and each unit's state when systemd runs.
_PROBE = r"""
PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
systemd=$1; shift
n=$1; shift
i=0
while [ "$i" -lt "$n" ]; do printf 'cmd\t%s\t%s\n' "$1" "$(command -v "$1")"; shift; i=$((i+1)); done
if [ "$systemd" = 1 ] && command -v systemctl >/dev/null 2>&1; then
  for u in "$@"; do
    printf 'unit\t%s\t%s\t%s\n' "$u" "$(systemctl is-enabled "$u" 2>/dev/null)" "$(systemctl is-active "$u" 2>/dev/null)"
  done
fi
"""


def parse_caps(status: str | None, uid_map: str | None) -> dict:
    """/proc/self/status CapEff + /proc/self/uid_map → what this user may do to device nodes."""
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)\s*$", status or "", re.M)
    if not m:
        return {"error": "no CapEff line in /proc/self/status"}
    eff = int(m.group(1), 16)
    # The initial user namespace maps all 2^32 ids onto themselves; anything else is a user namespace
    # (an unprivileged container), where mknod of a device is refused whatever the capabilities say.
    rows = [ln.split() for ln in (uid_map or "").splitlines() if ln.strip()]
    userns = None if uid_map is None else rows != [["0", "0", "4294967295"]]
    return {"effective": m.group(1), "mknod": bool(eff >> CAP_MKNOD & 1), "sys_admin": bool(eff >> CAP_SYS_ADMIN & 1),
            "sys_module": bool(eff >> CAP_SYS_MODULE & 1), "userns": userns}


def parse_dev_mounts(mountinfo: str | None) -> dict:
    """Mount points under /dev/nvidia* from /proc/self/mountinfo: a node there is a bind mount, not a node of ours."""
    out = {}
    for ln in (mountinfo or "").splitlines():
        left, sep, right = ln.partition(" - ")
        parts, rest = left.split(), right.split()
        if not sep or len(parts) < 5 or len(rest) < 2:
            continue
        target = parts[4].replace("\\040", " ")
        if target.startswith("/dev/nvidia"):
            out[target] = {"root": parts[3].replace("\\040", " "), "fstype": rest[0], "source": rest[1]}
    return out


_SYSCTL_LINE = re.compile(r"^\s*-?\s*kernel[./]numa_balancing\s*=\s*(\S+)\s*$")


def sysctl_settings(texts: dict[str, str]) -> list[dict]:
    """Every line that sets kernel.numa_balancing, as {path, line, value}."""
    out = []
    for path, text in texts.items():
        for no, ln in enumerate(text.splitlines(), 1):
            if m := _SYSCTL_LINE.match(ln):
                out.append({"path": path, "line": no, "value": m.group(1)})
    return out


def probe_argv(systemd: bool) -> list[str]:
    """The tool probe's command line (gather/prestart.py starts the same one at CLI entry)."""
    return ["sh", "-c", _PROBE, "sh", "1" if systemd else "0", str(len(COMMANDS)), *COMMANDS, *UNITS]


def gather(host: Host, ctx: GatherContext) -> dict:
    t = min(ctx.timeout, 3.0)
    # Three round trips: everything independent at once, the tool probe, then the files found by the first.
    unit_paths = {u: [f"{d_}/{u}" for d_ in UNIT_DIRS] for u in UNITS}
    first = host.batch([("read", "/proc/self/status", 64 << 10), ("read", "/proc/self/uid_map", 64 << 10),
                        ("read", "/proc/self/mountinfo", 4 << 20), ("stat", ["/run/systemd/system"]),
                        *(("stat", unit_paths[u]) for u in UNITS), *(("read", p, 1 << 20) for p in MANAGED_FILES),
                        *(("listdir", d_) for d_ in SYSCTL_DIRS), ("read", SYSCTL_CONF, 1 << 20),
                        ("statvfs", "/proc/sys")], t)
    status, uid_map, mi, run_stat = first[:4]
    found = dict(zip(UNITS, first[4:4 + len(UNITS)]))
    rest = first[4 + len(UNITS):]
    managed = dict(zip(MANAGED_FILES, rest[:len(MANAGED_FILES)]))
    listings = dict(zip(SYSCTL_DIRS, rest[len(MANAGED_FILES):len(MANAGED_FILES) + len(SYSCTL_DIRS)]))
    conf, ps = rest[-2:]
    caps = parse_caps(status.text, uid_map.text if uid_map.ok else None) if status.ok else {
        "error": f"/proc/self/status → {status.error}"}
    run_dir = run_stat["/run/systemd/system"]
    systemd = bool(run_dir.exists and run_dir.kind == "dir")
    res = host.run(probe_argv(systemd), timeout=ctx.timeout)
    commands: dict = {c: None for c in COMMANDS}
    units: dict = {u: {"path": None, "text": None, "enabled": None, "active": None} for u in UNITS}
    for ln in res.stdout.splitlines():
        f = ln.split("\t")
        if f[0] == "cmd" and len(f) == 3 and f[1] in commands:
            commands[f[1]] = f[2] or None
        elif f[0] == "unit" and len(f) == 4 and f[1] in units:
            units[f[1]].update(enabled=f[2] or None, active=f[3] or None)
    unit_file = {u: next((p for p in unit_paths[u] if found[u][p].exists and found[u][p].kind in ("file", "link")),
                         None) for u in UNITS}
    conf_files = [f"{d_}/{n}" for d_ in SYSCTL_DIRS for n in (listings[d_] if isinstance(listings[d_], list) else [])
                  if n.endswith(".conf")]
    wanted = [p for p in unit_file.values() if p] + conf_files
    second = dict(zip(wanted, host.batch([("read", p, 1 << 20) for p in wanted], t))) if wanted else {}
    for u, path in unit_file.items():
        if path:
            r = second[path]
            units[u].update(path=path, text=r.text if r.ok else None)
    files = {p: {"text": None if r.data is None else r.data.decode("utf-8", "surrogateescape"), "error": r.error}
             for p, r in managed.items()}
    texts = {p: second[p].text for p in conf_files if second[p].ok}
    if conf.ok:
        texts[SYSCTL_CONF] = conf.text
    out = {"commands": commands, "caps": caps, "dev_mounts": parse_dev_mounts(mi.text) if mi.ok else None,
           "proc_sys_readonly": ps.get("readonly"), "systemd": systemd, "units": units, "files": files, "sysctl_numa": sysctl_settings(texts)}
    if not res.ok:
        out["error"] = "tool probe " + res.describe()
    return out
