"""Boundary layer, Docker/podman/Kubernetes: inside an OCI container, the device cgroup its engine wrote.

Nodes present, mode 0666, and open() → EPERM: only the device cgroup refuses that way. On /dev/nvidiactl and
/dev/nvidiaN (major 195) it is the signature of the rule reset Docker and containerd containers suffer after
`systemctl daemon-reload` under the systemd cgroup driver (NVIDIA/nvidia-container-toolkit#251, #1227;
NVIDIA/nvidia-docker#1671, #1730): nvidia-smi then says "Failed to initialize NVML: Unknown Error". On the uvm node
alone it is a container made without (or before) the uvm rule. Pure, over facts["devices"], facts["host"] and
facts["platform"].
"""

from gpudoctor.checkreg import check
from gpudoctor.findings import Finding, Status
from gpudoctor.gather.cgroup import evidence as cgroup_evidence
from gpudoctor.boundary.platform import daemon_reload_fixes, detect, fix_text

_FRONT = ("nvidia", "nvidiactl", "nvidia-frontend")


def _denied(facts) -> list[tuple[str, dict]]:
    nodes = (facts.get("devices") or {}).get("nodes") or {}
    return [(p, n) for p, n in sorted(nodes.items())
            if n.get("kind") == "char" and n.get("open") == "EPERM" and (n.get("mode") or 0) & 0o006 == 0o006]


@check("boundary.container.device_rules", depends_on=("host.driver.loaded", "devices.node.present"),
       summary="Inside a Docker/podman container or pod, the engine's device rules allow every NVIDIA node it was given.")
def device_rules(facts):
    """EPERM at mode 0666 inside a container is its device cgroup; on major 195 that is the daemon-reload reset."""
    plat = detect(facts)
    if not plat.oci or "devices" not in facts:
        return None
    nodes = (facts.get("devices") or {}).get("nodes") or {}
    opened = [p for p, n in nodes.items() if n.get("kind") == "char" and n.get("open")]
    if not opened:
        return None
    live = ((facts.get("host") or {}).get("proc_devices") or {}).get("char") or {}
    front = {live[n] for n in _FRONT if n in live} or {195}
    denied = _denied(facts)
    ev = [f"platform: {plat.label}" + (f" ({'; '.join(plat.evidence)})" if plat.evidence else "")]
    if plat.cgroup:
        ev.append(f"/proc/self/cgroup → {plat.cgroup}" + (f" (cgroup driver {plat.cgroup_driver})" if plat.cgroup_driver
                                                          else " (the cgroup driver is not visible from inside)"))
    if not denied:
        return Finding("boundary.container.device_rules", Status.OK,
                       f"the {plat.label.split(' ', 1)[1]}'s device rules allow the NVIDIA nodes it has",
                       evidence=ev + [f"open({p}) → {nodes[p].get('open')}" for p in sorted(opened)])
    ev += [f"open({p}) → EPERM although it is c {n.get('major')}:{n.get('minor')} mode {n.get('mode', 0):04o}"
           for p, n in denied]
    ev += cgroup_evidence((facts.get("devices") or {}).get("cgroup"))  # the probe's cgroup and its device programs
    majors = sorted({n.get("major") for _p, n in denied})
    paths = [p for p, _n in denied]
    data = {"platform": plat.kind, "cgroup": plat.cgroup, "cgroup_driver": plat.cgroup_driver, "denied": paths,
            "majors": majors}
    where = "pod" if plat.kind == "kubernetes" else "container"
    if any(m in front for m in majors):
        reset = plat.cgroup_driver != "cgroupfs"
        summary = (f"the {where}'s device cgroup denies {', '.join(paths)} (c {', '.join(map(str, majors))}) although the "
                   f"nodes are there with mode 0666" + (": the device-rule reset after `systemctl daemon-reload` under "
                                                         "the systemd cgroup driver" if reset else ""))
        ev.append("signature: EPERM on the major-195 nodes, nodes present, mode 0666 — nvidia-smi says "
                  "\"Failed to initialize NVML: Unknown Error\" (nvidia-container-toolkit#251, nvidia-docker#1730)")
        if plat.cgroup_driver == "cgroupfs":
            ev.append("the cgroupfs driver is in use, so it is not systemd's reset: the container was made without these rules")
        hint = fix_text(facts, "denied", node=paths[0], major=majors[0], plat=plat)
        return Finding("boundary.container.device_rules", Status.FAIL, summary, evidence=ev, hint=hint,
                       data={**data, "signature": "daemon-reload" if reset else None,
                             "fixes": list(daemon_reload_fixes(plat.kind)) if reset else []},
                       explained_by=())  # an EPERM on a present node follows from no missing node or module
    summary = (f"the {where}'s device cgroup denies {', '.join(paths)} (c {', '.join(map(str, majors))}) although the "
               f"nodes are there with mode 0666: it was made without a rule for the live major")
    hint = fix_text(facts, "denied", node=paths[0], major=majors[0], plat=plat)
    return Finding("boundary.container.device_rules", Status.FAIL, summary, evidence=ev, hint=hint,
                   data={**data, "signature": None}, explained_by=())


def _rule_allows(rules: list[dict], major: int, minor: int) -> bool:
    """runc's reading of linux.resources.devices: in order, the last rule matching c major:minor (rw) decides."""
    allowed = False
    for r in rules:
        if r.get("type") not in (None, "a", "c"):
            continue
        if r.get("major") not in (None, -1, major) or r.get("minor") not in (None, -1, minor):
            continue
        acc = r.get("access") or "rwm"
        if r.get("allow"):
            allowed = allowed or ("r" in acc and "w" in acc)
        elif "r" in acc or "w" in acc:
            allowed = False
    return allowed


def _v1_allows(lines: list[str], major: int, minor: int) -> bool:
    """A cgroup v1 devices.list (`c 195:0 rwm`, `a *:* rwm`) lets c major:minor be opened read-write."""
    for ln in lines:
        parts = ln.split()
        if len(parts) != 3 or parts[0] not in ("a", "c"):
            continue
        ma, _, mi = parts[1].partition(":")
        if ma in ("*", str(major)) and mi in ("*", str(minor)) and "r" in parts[2] and "w" in parts[2]:
            return True
    return False


@check("boundary.container.oci_rules", depends_on=("host.driver.loaded", "host.uvm.loaded"),
       summary="On the host: each running container's NVIDIA nodes and device rules (runtime config.json, live cgroup) "
               "match the live majors.")
def oci_rules(facts):
    """A container made from a stale spec keeps its dead node; a daemon-reload reset shows as rules the cgroup lost."""
    from gpudoctor.boundary.nodes import expected_numbers

    oci = facts.get("oci") or {}
    live = ((facts.get("host") or {}).get("proc_devices") or {}).get("char") or {}
    if oci.get("error"):
        return Finding("boundary.container.oci_rules", Status.UNKNOWN, oci["error"], evidence=[oci["error"]])
    out = []
    for c in oci.get("containers") or []:
        gpu = [d for d in c.get("devices") or [] if str(d.get("path") or "").startswith("/dev/nvidia")]
        if not gpu or c.get("running") is False or not live:
            continue
        who = c.get("name") or c["id"][:12]
        label = f"{c.get('engine')} container {who}" + (f" (pod {c['pod']})" if c.get("pod") else "")
        ev = [f"{c['config']}: linux.devices " + ", ".join(f"{d['path']} c {d.get('major')}:{d.get('minor')}" for d in gpu)]
        problems, recreate, reset = [], False, []
        for d in gpu:
            want_major, want_minor, source = expected_numbers(d["path"], live)
            if want_major is not None and (d.get("major"), d.get("minor")) != (want_major, want_minor):
                problems.append(f"{d['path']} was made as c {d.get('major')}:{d.get('minor')}, the live {source} is "
                                f"c {want_major}:{want_minor}")
                recreate = True
            elif not _rule_allows(c.get("rules") or [], d.get("major"), d.get("minor")):
                problems.append(f"its rules (linux.resources.devices) do not allow {d['path']} c {d.get('major')}:"
                                f"{d.get('minor')}")
                recreate = True
            elif c.get("live_rules") is not None and not _v1_allows(c["live_rules"], d.get("major"), d.get("minor")):
                reset.append(d["path"])
        if c.get("live_rules") is not None:
            ev.append(f"{c.get('cgroup')}: devices.list " + ", ".join(x for x in c["live_rules"] if x.strip()))
        elif c.get("live_error"):
            ev.append(f"{c.get('cgroup')}: {c['live_error']}")
        if reset:
            problems.append(f"its cgroup no longer allows {', '.join(reset)} although its config does: the device-rule "
                            f"reset (systemctl daemon-reload under the systemd cgroup driver)")
        if not problems:
            out.append(Finding("boundary.container.oci_rules", Status.OK, f"{label}: NVIDIA nodes and rules match the "
                               f"live majors", subject=who, evidence=ev))
            continue
        kind = {"docker": "docker", "podman": "podman", "kubernetes": "kubernetes"}.get(c.get("engine"), "docker")
        hint = ("Recreate it (its nodes and rules are fixed when it is made); regenerate the CDI spec it came from "
                "first (`gpudoctor fix --only cdi.spec`)." if recreate else "; ".join(daemon_reload_fixes(kind)) + ".")
        out.append(Finding("boundary.container.oci_rules", Status.WARN, f"{label}: " + "; ".join(problems),
                           subject=who, evidence=ev, hint=hint,
                           data={"id": c["id"], "engine": c.get("engine"), "reset": reset, "recreate": recreate}))
    return out
