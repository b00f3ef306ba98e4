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
from gpudoctor.platform import daemon_reload_fixes, detect, fix_text

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
                             "fixes": list(daemon_reload_fixes(plat.kind)) if reset else []})
    summary = (f"the {where}'s device cgroup denies {', '.join(paths)} (c {', '.join(map(str, majors))}) although the "
               f"nodes are there with mode 0666: it was made without a rule for the live major")
    hint = fix_text(facts, "denied", node=paths[0], major=majors[0], plat=plat)
    return Finding("boundary.container.device_rules", Status.FAIL, summary, evidence=ev, hint=hint,
                   data={**data, "signature": None})
