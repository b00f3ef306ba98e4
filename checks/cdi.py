"""Boundary layer, CDI: the specs container engines (Docker >= 25, podman, containerd, CRI-O, Kubernetes) inject GPUs
from, audited against the live majors. A deviceNodes entry with an old major gives every container started from it a
dead node (cuInit 999 for nvidia-uvm); inside such a container that entry is the root cause of the node's EPERM/ENXIO.

Pure checks over facts["cdi"] (gather/cdi.py) and the live /proc/devices (facts["host"]).
"""

from gpudoctor.boundary import cdi
from gpudoctor.checkreg import check
from gpudoctor.checks.devices import _ESSENTIAL
from gpudoctor.findings import Finding, Status
from gpudoctor.boundary.platform import detect

REMEDY = "cdi.spec"


def _live(facts) -> dict:
    return ((facts.get("host") or {}).get("proc_devices") or {}).get("char") or {}


def parsed(facts) -> tuple[list[cdi.Spec], list[tuple[dict, cdi.SpecError]]]:
    """The readable specs, parsed; and the unreadable ones with their error."""
    good, bad = [], []
    for s in (facts.get("cdi") or {}).get("specs") or []:
        if s.get("text") is None:
            continue
        try:
            good.append(cdi.parse(s["path"], s["text"]))
        except cdi.SpecError as exc:
            bad.append((s, exc))
    return good, bad


def stale_entries(facts) -> list[cdi.Stale]:
    specs, _ = parsed(facts)
    return cdi.audit(specs, _live(facts), (facts.get("cdi") or {}).get("host_nodes") or {})[0]


@check("boundary.cdi.specs", summary="Every CDI spec in /etc/cdi and /var/run/cdi parses, with a known cdiVersion.")
def specs(facts):
    """A spec the engine cannot parse is skipped by it: its devices are then unknown names (`unresolvable CDI devices`)."""
    c = facts.get("cdi")
    if not c or not c.get("specs"):
        return None
    out = []
    good, bad = parsed(facts)
    for s in c["specs"]:
        if s.get("text") is None:
            out.append(Finding("boundary.cdi.specs", Status.UNKNOWN, f"cannot read the CDI spec {s['path']} ({s['error']})",
                               subject=s["path"], evidence=[f"read {s['path']} → {s['error']}"]))
    for s, exc in bad:
        where = f"{s['path']}:{exc.line}" if exc.line else s["path"]
        out.append(Finding("boundary.cdi.specs", Status.WARN, f"{where}: not a valid CDI spec: {exc}", subject=s["path"],
                           evidence=[f"{where}: {exc}"],
                           hint="Container engines skip a spec they cannot parse; regenerate it "
                                "(`nvidia-ctk cdi generate --output=" + s["path"] + "`) or fix the line."))
    for sp in good:
        ev = [f"{sp.path}: cdiVersion {sp.version}, kind {sp.kind}, devices {', '.join(sp.devices) or 'none'}, "
              f"{len(sp.entries)} device node entr{'y' if len(sp.entries) == 1 else 'ies'}"]
        if not sp.version_known:
            out.append(Finding("boundary.cdi.specs", Status.WARN, f"{sp.path}: cdiVersion {sp.version} is not a "
                               f"released CDI version ({', '.join(cdi.KNOWN_VERSIONS)})", subject=sp.path, evidence=ev,
                               data={"version": sp.version, "kind": sp.kind}))
            continue
        out.append(Finding("boundary.cdi.specs", Status.OK, f"{sp.path}: CDI {sp.version}, {sp.kind}", subject=sp.path,
                           evidence=ev, data={"version": sp.version, "kind": sp.kind, "devices": sp.devices}))
    return out


@check("boundary.cdi.device_nodes", depends_on=("host.driver.loaded", "host.uvm.loaded"), remedy=REMEDY,
       summary="Each CDI deviceNodes entry gives containers the live major:minor of its NVIDIA node.")
def device_nodes(facts):
    """The runtime makes the node and allows its cgroup rule from the spec's numbers: an old major is a dead node."""
    c = facts.get("cdi")
    if not c or not c.get("specs"):
        return None
    live = _live(facts)
    if not live:
        return None
    good_specs, _ = parsed(facts)
    stale, good, notes = cdi.audit(good_specs, live, c.get("host_nodes") or {})
    inside = detect(facts).oci
    if inside:  # a container's /dev is not the host's: a node missing here says nothing about the spec
        stale = [s for s in stale if not (s.by == "node" and s.have == "missing")]
    by_path: dict[str, list] = {}
    for s in stale:
        by_path.setdefault(s.entry.path, []).append(s)
    out = []
    for path, items in sorted(by_path.items()):
        first = items[0]
        ev = []
        for s in items:
            e = s.entry
            if s.by == "spec":
                ev.append(f"{e.spec}:{e.line} {e.where}: path {e.path}, major {e.major}, minor {e.minor}")
            else:
                ev.append(f"{e.spec}:{e.line} {e.where}: path {e.path} gives no numbers; the runtime stats "
                          f"{e.node} → {s.have}")
        ev.append(f"/proc/devices: {first.want.split(':')[0]} {first.source} → expected {first.want}")
        if first.by == "spec":
            e = first.entry
            summary = (f"{path}: the CDI spec {e.spec} ({e.where}) says major {e.major}, but the kernel's {first.source} "
                       f"major is {first.want.split(':')[0]}; containers started from it get a dead {path}"
                       + (" (cuInit 999)" if first.source == "nvidia-uvm" else ""))
            hint = (f"Regenerate the spec on the host: `nvidia-ctk cdi generate --output={e.spec}` (or `gpudoctor fix "
                    f"--only {REMEDY}` there, which shows the diff first), then recreate the containers that use it.")
            if inside:
                hint += " This container was made from it: recreate it after the spec is fixed."
        else:
            e = first.entry
            summary = (f"{path}: the CDI spec {e.spec} ({e.where}) takes its numbers from {e.node}, which is "
                       f"{first.have}; the live {first.source} device is {first.want}")
            hint = (f"Fix the host node first (`nvidia-modprobe -u -c 0`, or `gpudoctor fix --only devices.node.create` on "
                    f"the host), then recreate the containers.")
        status = Status.FAIL if _ESSENTIAL.match(path) else Status.WARN  # uvm-tools, modeset: profilers, not CUDA
        out.append(Finding("boundary.cdi.device_nodes", status, summary, subject=path, evidence=ev, hint=hint,
                           data={"stale": [s.to_json() for s in items]}))
    for e in good:
        if e.path in by_path:
            continue
        by_path[e.path] = []
        nums = f"{e.major}:{e.minor}" if e.major is not None else f"from {e.node}"
        out.append(Finding("boundary.cdi.device_nodes", Status.OK, f"{e.path}: CDI entries match the live numbers",
                           subject=e.path, evidence=[f"{e.spec}:{e.line} {e.where}: {nums}"]))
    for e, n in notes:
        out.append(Finding("boundary.cdi.device_nodes", Status.INFO, n, subject=f"{e.spec}:{e.line}", evidence=[n]))
    return out
