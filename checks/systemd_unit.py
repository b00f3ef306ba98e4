"""Boundary layer, systemd: a unit's DevicePolicy=/DeviceAllow= (as `systemctl show` reports them) against the live
majors. The unit the probe runs in (a gate in ExecStartPre= runs in the server's cgroup) and the units named with
`check --unit`. A node the policy leaves out opens with EPERM inside the unit whatever its mode.
"""

from gpudoctor.boundary import systemd_devices as SD
from gpudoctor.checkreg import check
from gpudoctor.boundary.nodes import expected_numbers
from gpudoctor.findings import Finding, Status

REMEDY = "systemd.device_allow"
NEEDED = ("/dev/nvidiactl", "/dev/nvidia-uvm")


def _needed(facts) -> list[str]:
    nodes = (facts.get("devices") or {}).get("nodes") or {}
    gpus = [p for p in nodes if p[len("/dev/nvidia"):].isdigit()]
    return [*NEEDED, *sorted(gpus)]


def gaps(facts, unit: str, show: dict) -> list[dict]:
    """Each needed node the unit's policy does not allow: {path, major, minor, source, rules}."""
    live = ((facts.get("host") or {}).get("proc_devices") or {}).get("char") or {}
    nodes = (facts.get("devices") or {}).get("nodes") or {}
    out = []
    for p in _needed(facts):
        maj, mi, source = expected_numbers(p, live)
        if maj is None:
            continue
        ok, rules = SD.allowed(show.get("DevicePolicy"), show.get("DeviceAllow") or [], maj, mi, live, nodes)
        if not ok:
            name = next((n for n, v in live.items() if v == maj and n in (source, "nvidia-frontend", "nvidiactl")),
                        source)
            out.append({"path": p, "major": maj, "minor": mi, "source": source, "group": name,
                        "rules": [f"DeviceAllow={r.spec} {r.access} → {r.why}" for r in rules]})
    return out


@check("boundary.systemd.device_allow", depends_on=("host.driver.loaded", "host.uvm.loaded"), remedy=REMEDY,
       summary="A systemd unit's DevicePolicy=/DeviceAllow= lets it open each NVIDIA node at its live major.")
def device_allow(facts):
    """DeviceAllow=/dev/char/510:0 after a driver update that moved uvm to 509, or no uvm line at all: EPERM."""
    units = (facts.get("platform") or {}).get("units") or {}
    if not units:
        return None
    out = []
    for unit, u in sorted(units.items()):
        show = u.get("show")
        probe = u.get("why") == "probe"
        if show is None:
            # The unit this probe runs in was found, not asked for: its own opens (devices.node.open) already show
            # what its policy does, so an unreadable policy is information there, and "could not probe" when named.
            # Why systemctl could not answer is its own story (no systemctl, no systemd as PID 1), never the driver's:
            # explained_by=() keeps it from being called a symptom of host.driver.loaded.
            why = " (systemctl is not installed here)" if u.get("rc") == 127 else ""
            out.append(Finding("boundary.systemd.device_allow", Status.INFO if probe else Status.UNKNOWN,
                               f"cannot read {unit}'s device policy{why}" + (" (the unit this check runs in; its "
                                                                             "device opens are checked directly)"
                                                                             if probe else ""),
                               subject=unit, evidence=[u.get("error") or "systemctl show failed"], explained_by=()))
            continue
        if show.get("LoadState") not in (None, "loaded"):
            out.append(Finding("boundary.systemd.device_allow", Status.WARN if not probe else Status.UNKNOWN,
                               f"{unit} is {show.get('LoadState')}", subject=unit,
                               evidence=[f"systemctl show {unit} → LoadState={show.get('LoadState')}"]))
            continue
        ev = [f"systemctl show {unit} → DevicePolicy={show.get('DevicePolicy') or 'auto'}"]
        ev += [f"DeviceAllow={v}" for v in show.get("DeviceAllow") or []]
        if show.get("NeedDaemonReload") == "yes":
            ev.append("NeedDaemonReload=yes: the unit files changed since the last daemon-reload")
        if not SD.restricted(show):
            out.append(Finding("boundary.systemd.device_allow", Status.OK, f"{unit} does not restrict devices",
                               subject=unit, evidence=ev))
            continue
        missing = gaps(facts, unit, show)
        if not missing:
            out.append(Finding("boundary.systemd.device_allow", Status.OK,
                               f"{unit}'s device policy allows the NVIDIA nodes", subject=unit, evidence=ev))
            continue
        groups = sorted({g["group"] for g in missing})
        drop = SD.dropin_path(unit)
        hint = (f"Add a drop-in {drop} with " + ", ".join(f"`DeviceAllow=char-{g} rw`" for g in groups)
                + f" — `gpudoctor fix --only {REMEDY}" + ("" if probe else f" --unit {unit}")
                + "` writes it after `systemd-analyze verify` — then "
                + f"`systemctl restart {unit}`.")
        for g in missing:
            detail = "; ".join(g["rules"]) or "no DeviceAllow= line"
            f_ev = ev + [f"{g['path']} is c {g['major']}:{g['minor']} ({g['source']} in /proc/devices): no rule "
                         f"allows it rw ({detail})"]
            out.append(Finding("boundary.systemd.device_allow", Status.FAIL,
                               f"{unit}: DevicePolicy={show.get('DevicePolicy') or 'auto'} does not allow {g['path']} "
                               f"(c {g['major']}:{g['minor']}); opening it there gives EPERM",
                               # the probe's own unit explains the probe's EPERM on that node: same subject
                               subject=g["path"] if probe else f"{unit}:{g['path']}", evidence=f_ev, hint=hint,
                               data={"unit": unit, "group": g["group"], "major": g["major"], "probe_unit": probe}))
    return out
