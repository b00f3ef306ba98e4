"""Device layer: every /dev/nvidia* node present, a character device, major:minor equal to the live /proc/devices, usable."""

import re

from gpudoctor.checkreg import check
from gpudoctor.findings import Finding, Status
from gpudoctor.boundary.nodes import expected_numbers
from gpudoctor.boundary.platform import fix_text

# open() errno → which layer refused (FIELD_NOTES).
ERRNO_MEANING = {
    "EPERM": "the device cgroup denies it (even with mode 0666)",
    "EACCES": "file mode or ownership denies it",
    "ENXIO": "no driver answers for this node",
    "ENODEV": "no such device behind the node",
    "ENOENT": "the node is missing",
    "TIMEOUT": "open() did not answer within its deadline",
}

_ESSENTIAL = re.compile(r"^/dev/(nvidiactl|nvidia\d+|nvidia-uvm)$")


def _nodes(facts):
    d = facts.get("devices")
    return None if not d or "nodes" not in d else d["nodes"]


def _live(facts):
    return ((facts.get("host") or {}).get("proc_devices") or {}).get("char") or {}


def _required(facts) -> list[str]:
    gpus = ((facts.get("driver") or {}).get("gpus")) or []
    req = ["/dev/nvidiactl", "/dev/nvidia-uvm"]
    req += [f"/dev/nvidia{g['minor']}" for g in gpus if g.get("minor") is not None]
    return req


def _owner(live: dict, major: int) -> str | None:
    return next((n for n, m in live.items() if m == major), None)


_HOST_DEPS = ("host.driver.loaded", "host.uvm.loaded")


def _module_deps(path: str) -> tuple[str, ...]:
    """The host findings that can explain a problem with this node: nvidia_uvm only explains the uvm nodes; in an
    LXC guest, the Proxmox node without the NVIDIA driver explains them all (the guest shares the node's kernel)."""
    return (_HOST_DEPS if path.startswith("/dev/nvidia-uvm") else ("host.driver.loaded",)) + ("boundary.lxc.node_driver",)


# What each open() errno can follow from (devices.node.open's evidence): the kernel checks the mode (EACCES), the
# device cgroup (EPERM), then asks the driver (ENXIO/ENODEV); ENOENT is a missing node.
def _open_causes(errno: str, path: str) -> tuple[str, ...]:
    if errno == "EPERM":
        return ("boundary.*",)  # an allow-list (subject: this node) or another device boundary
    if errno == "EACCES":
        return ("devices.node.mode",)
    if errno in ("ENXIO", "ENODEV"):
        return ("devices.node.major",) + _module_deps(path)
    if errno == "ENOENT":
        return ("devices.node.present", "boundary.lxc.mount_entry")
    return ()


@check("devices.node.present", summary="Each node CUDA needs exists and is a character device.", depends_on=_HOST_DEPS,
       remedy="devices.node.create")
def present(facts):
    """Missing /dev/nvidia-uvm is the classic "nvidia-smi works, CUDA does not"."""
    nodes = _nodes(facts)
    if nodes is None:
        return None
    out = []
    for p in _required(facts) + ["/dev/nvidia-uvm-tools"]:
        n = nodes.get(p) or {"exists": False, "error": "ENOENT"}
        essential = bool(_ESSENTIAL.match(p))
        if not n.get("exists"):
            if n.get("error") == "TIMEOUT":
                out.append(Finding("devices.node.present", Status.UNKNOWN, f"{p}: stat() did not answer", subject=p,
                                   evidence=[f"stat {p} → TIMEOUT"]))
                continue
            cuda_ok = ((facts.get("cuda") or {}).get("cuinit")) == 0
            if essential and cuda_ok:
                # libcuda runs the setuid nvidia-modprobe to create missing nodes where it may (not in an LXC guest).
                out.append(Finding("devices.node.present", Status.WARN, f"{p} was missing when probed; cuInit still "
                                   "succeeded (libcuda's nvidia-modprobe can recreate it where mknod is allowed)",
                                   subject=p, evidence=[f"stat {p} → {n.get('error', 'ENOENT')}", "cuInit(0) → 0"],
                                   hint="Create the nodes at boot (`nvidia-modprobe -u -c 0`) so every process finds them."))
                continue
            out.append(Finding("devices.node.present", Status.FAIL if essential else Status.WARN, f"{p} is missing",
                               subject=p, evidence=[f"stat {p} → {n.get('error', 'ENOENT')}"],
                               hint=fix_text(facts, "missing", node=p),
                               explained_by=_module_deps(p) + ("boundary.lxc.mount_entry", "boundary.cdi.*")))
        elif n.get("kind") != "char":
            out.append(Finding("devices.node.present", Status.FAIL if essential else Status.WARN,
                               f"{p} is a {n.get('kind')}, not a character device", subject=p,
                               evidence=[f"stat {p} → type {n.get('kind')}"],
                               hint="Remove it and recreate the node (a bind mount of a missing source creates a file).",
                               explained_by=("boundary.lxc.mount_entry",)))
        else:
            out.append(Finding("devices.node.present", Status.OK, f"{p} present", subject=p,
                               evidence=[f"stat {p} → char {n.get('major')}:{n.get('minor')}"]))
    return out


@check("devices.node.major", summary="Each node's major:minor equals the live number in /proc/devices.",
       depends_on=_HOST_DEPS + ("devices.node.present", "boundary.cdi.*"), remedy="devices.node.create")
def major(facts):
    """Dynamic majors (nvidia-uvm, nvidia-caps) drift with driver reinstalls: a node made for the old one is dead."""
    nodes = _nodes(facts)
    if nodes is None:
        return None
    live = _live(facts)
    out = []
    for p, n in sorted(nodes.items()):
        if n.get("kind") != "char":
            continue
        want_major, want_minor, source = expected_numbers(p, live)
        if want_major is None:
            if source:  # the driver registers no such device here
                out.append(Finding("devices.node.major", Status.WARN, f"{p} exists but /proc/devices has no {source}",
                                   subject=p, evidence=[f"{p} is {n['major']}:{n['minor']}", f"/proc/devices: no {source}"],
                                   explained_by=_module_deps(p)))
            continue
        have = f"{n['major']}:{n['minor']}"
        want = f"{want_major}:{want_minor}"
        if have != want:
            other = _owner(live, n["major"])
            ev = [f"stat {p} → {have}" + (f" (major {n['major']} is '{other}' in /proc/devices)" if other else
                                          f" (major {n['major']} is not in /proc/devices)"),
                  f"/proc/devices: {want_major} {source} → expected {want}"]
            essential = bool(_ESSENTIAL.match(p))
            out.append(Finding("devices.node.major", Status.FAIL if essential else Status.WARN,
                               f"{p} is {have}, but the live {source} device is {want}", subject=p, evidence=ev,
                               hint=fix_text(facts, "stale", node=p, major=want_major, minor=want_minor),
                               data={"have": have, "want": want},
                               explained_by=("boundary.cdi.*",)))  # a node made for another major (a stale CDI spec)
        else:
            out.append(Finding("devices.node.major", Status.OK, f"{p} is {have}, as /proc/devices says", subject=p,
                               evidence=[f"stat {p} → {have}", f"/proc/devices: {want_major} {source}"]))
    return out


@check("devices.node.mode", summary="CUDA's nodes are read-write for everyone (mode 0666) as the driver creates them.",
       depends_on=("devices.node.present",), remedy="devices.node.mode")
def mode(facts):
    """A node with mode 000 (seen on nvidia-uvm-tools) breaks profilers and non-root users."""
    nodes = _nodes(facts)
    if nodes is None:
        return None
    out = []
    for p, n in sorted(nodes.items()):
        if n.get("kind") != "char" or p.startswith("/dev/nvidia-caps/"):
            continue  # capability nodes are 0400/0444 by design
        m = n.get("mode", 0)
        if m & 0o006 != 0o006:
            out.append(Finding("devices.node.mode", Status.WARN, f"{p} has mode {m:04o}: users other than "
                               f"{'root' if n.get('uid') == 0 else n.get('uid')} cannot open it", subject=p,
                               evidence=[f"stat {p} → mode {m:04o}, expected 0666"],
                               hint=f"chmod 0666 {p}", data={"mode": m},
                               explained_by=()))
        else:
            out.append(Finding("devices.node.mode", Status.OK, f"{p} mode {m:04o}", subject=p,
                               evidence=[f"stat {p} → mode {m:04o}"]))
    return out


def _cgroup_proof(facts, errno_name: str) -> dict:
    """For an EPERM: the cgroup the probe ran in and the device programs (or v1 devices.list) in effect there."""
    from gpudoctor.gather.cgroup import evidence

    cg = (facts.get("devices") or {}).get("cgroup") if errno_name == "EPERM" else None
    if not cg:
        return {"evidence": [], "data": None}
    v2, v1 = cg.get("v2") or {}, cg.get("v1") or {}
    data = {"v2_path": v2.get("path"), "device_programs": v2.get("effective"),
            "attached": v2.get("levels") or [], "v1_path": v1.get("path"), "v1_list": v1.get("list"),
            "error": cg.get("error") or v2.get("error")}
    return {"evidence": evidence(cg), "data": data}


def mode_grants(identity: dict | None, node: dict, access: str) -> bool | None:
    """Whether the node's mode bits let this user open it with `access` ("r" or "rw"); None when the user is unknown.
    Root passes (CAP_DAC_OVERRIDE); otherwise the owner, group or other bits apply, as the kernel checks them."""
    if not identity:
        return None
    if identity.get("uid") == 0:
        return True
    m = node.get("mode") or 0
    if identity.get("uid") == node.get("uid"):
        bits = (m >> 6) & 7
    elif node.get("gid") == identity.get("gid") or node.get("gid") in (identity.get("groups") or []):
        bits = (m >> 3) & 7
    else:
        bits = m & 7
    need = 4 if access == "r" else 6
    return bits & need == need


_CAP_ROLE = {"mig-config": ("MIG config", "create or destroy MIG instances, which is root's job"),
             "mig-monitor": ("MIG monitor", "read MIG instance state (nvidia-smi mig -lgi)")}


def _cap_role(facts, path: str, node: dict) -> tuple[str, str]:
    """What a capability node grants, from the driver's /proc/driver/nvidia/capabilities (its minor), else by dir."""
    caps = (facts.get("devices") or {}).get("capabilities") or {}
    name = caps.get(str(node.get("minor")))
    if name in _CAP_ROLE:
        return _CAP_ROLE[name]
    if path.startswith("/dev/nvidia-caps-imex-channels/"):
        return "IMEX channel", "share memory across nodes through IMEX"
    if node.get("minor") in (1, 2) and path.startswith("/dev/nvidia-caps/"):
        return _CAP_ROLE["mig-config" if node["minor"] == 1 else "mig-monitor"]
    return "GPU capability", "use this capability (MIG instances)"


def _eacces_why(facts, p: str, n: dict, access: str) -> str:
    """EACCES names the file mode only where the mode refuses this user: where it grants the access (root, or 0666),
    the refusal comes from the mount (`nodev`: no device node there ever opens) or a security module."""
    ident = (facts.get("devices") or {}).get("identity")
    if mode_grants(ident, n, access) is not True:
        return ERRNO_MEANING["EACCES"]
    return (f"not the file mode (mode {n.get('mode', 0):04o} grants {_who(ident)} {access}): the filesystem holding "
            f"{p} is mounted nodev (no device node there opens), or a security module (AppArmor, SELinux) denies it")


def _who(identity: dict | None) -> str:
    if not identity:
        return "this user"
    return "root" if identity.get("uid") == 0 else f"uid {identity.get('uid')}"


def _capability_open(facts, p: str, n: dict) -> Finding:
    """A capability node is opened read-only by its consumer; EACCES where the mode does not grant this user read is
    the driver's design (nvidia-cap1, MIG config, is 0400 root), not a fault."""
    r, acc = n.get("open"), n.get("access") or "rw"
    flag = "O_RDONLY" if acc == "r" else "O_RDWR"
    ident = (facts.get("devices") or {}).get("identity")
    role, needed_for = _cap_role(facts, p, n)
    ev = [f"open({p}, {flag}) → {'ok' if r == 'OK' else r}", f"node {n.get('major')}:{n.get('minor')} mode "
          f"{n.get('mode', 0):04o} owner {n.get('uid')}:{n.get('gid')}"]
    if r == "OK":
        return Finding("devices.node.open", Status.OK, f"open({p}) ok: {_who(ident)} holds the {role} capability",
                       subject=p, evidence=ev)
    grants = mode_grants(ident, n, "r")
    if r == "EACCES" and (grants is False or (acc == "rw" and mode_grants(ident, n, "rw") is False)):
        if acc == "rw" and grants is not False:
            ev.append("recorded with an O_RDWR open; the driver's consumers open capability nodes read-only")
        else:
            ev.append(f"mode {n.get('mode', 0):04o} grants {_who(ident)} no read access: by the driver's design")
        held = "does not hold" if grants is False else "was probed read-write on"
        return Finding("devices.node.open", Status.INFO,
                       f"{p} is the {role} capability: {_who(ident)} {held} it (needed only to {needed_for})",
                       subject=p, evidence=ev, data={"errno": r, "access": acc, "by_design": True})
    why = _eacces_why(facts, p, n, acc) if r == "EACCES" else ERRNO_MEANING.get(r, "refused")
    return Finding("devices.node.open", Status.WARN, f"open({p}) → {r}: {why} ({role} capability)", subject=p,
                   evidence=ev, data={"errno": r, "access": acc})


@check("devices.node.open", summary="A real open() of each node succeeds; the errno names the layer that refuses.",
       depends_on=_HOST_DEPS + ("devices.node.present", "devices.node.major", "devices.node.mode", "boundary.*"))
def opened(facts):
    """EPERM = device cgroup (mode 0666 does not help; in an LXC guest boundary.lxc.cgroup_allow for this node is its
    cause), EACCES = mode/owner (devices.node.mode), ENXIO = no driver answers (a stale major, devices.node.major, or
    a live major whose device is absent), ENOENT = missing (devices.node.present).
    Capability nodes (nvidia-caps) are opened read-only, as their consumers do, and judged against what this user
    needs: an ordinary user without the MIG config capability is healthy."""
    nodes = _nodes(facts)
    if nodes is None:
        return None
    live = _live(facts)
    out = []
    for p, n in sorted(nodes.items()):
        if n.get("kind") != "char":
            continue
        r = n.get("open")
        essential = bool(_ESSENTIAL.match(p))
        if r and p.startswith(("/dev/nvidia-caps/", "/dev/nvidia-caps-imex-channels/")) and r != "TIMEOUT":
            out.append(_capability_open(facts, p, n))
            continue
        if r == "OK":
            out.append(Finding("devices.node.open", Status.OK, f"open({p}) ok", subject=p, evidence=[f"open({p}, O_RDWR) → ok"]))
        elif r == "TIMEOUT":
            out.append(Finding("devices.node.open", Status.UNKNOWN, f"open({p}) did not answer", subject=p,
                               evidence=[f"open({p}, O_RDWR) → no answer within the deadline"]))
        elif r:
            why = ERRNO_MEANING.get(r, "refused")
            if r == "EACCES":
                why = _eacces_why(facts, p, n, "rw")
            extra = f" although its mode is {n.get('mode', 0):04o}" if r == "EPERM" else ""
            cg = _cgroup_proof(facts, r)
            ev = [f"open({p}, O_RDWR) → {r}{extra}", f"node {n.get('major')}:{n.get('minor')}", *cg["evidence"]]
            if r == "ENXIO":
                want_major, _minor, source = expected_numbers(p, live)
                if want_major is not None and n.get("major") == want_major:
                    why = (f"no driver answers for this node (its major {want_major} is the live {source} major in "
                           f"/proc/devices: the device behind it is not there or not initialised)")
                    ev.append(f"/proc/devices: {want_major} {source}")
                elif want_major is not None:
                    why = f"no driver answers major {n.get('major')}: the node is stale (the live {source} major is " \
                          f"{want_major})"
                    ev.append(f"/proc/devices: {want_major} {source}")
            out.append(Finding("devices.node.open", Status.FAIL if essential else Status.WARN,
                               f"open({p}) → {r}{extra}: {why}", subject=p, evidence=ev,
                               hint=(fix_text(facts, "denied", node=p, major=n.get("major"))
                                     if r == "EPERM" else None),
                               data={"errno": r, **({"cgroup": cg["data"]} if cg["data"] else {})},
                               explained_by=_open_causes(r, p)))
    return out
