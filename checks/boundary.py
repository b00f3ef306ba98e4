"""Boundary layer: an LXC guest's Proxmox config (live section) against the host's live device majors.

Pure checks over facts["boundary"] (gpudoctor/gather/boundary.py); the LXC semantics live in gpudoctor.proxmox.audit,
and `gpudoctor lxc audit` is the diagnosis of these checks alone. boundary.lxc.cgroup_allow (subject: the node as the guest
sees it, e.g. /dev/nvidia-uvm) is the root cause of a devices-layer open() EPERM and of cuInit 999.
"""

from gpudoctor.checkreg import check
from gpudoctor.errors import ConfigError
from gpudoctor.findings import Finding, Status
from gpudoctor.proxmox import audit as A

_CONFIG = ("boundary.lxc.config",)


def _input(facts) -> "A.AuditInput | None":
    b = facts.get("boundary")
    if not b or not b.get("applicable") or b.get("error"):
        return None
    if (b.get("config") or {}).get("text") is None or (b.get("proc_devices") or {}).get("text") is None:
        return None
    try:
        return A.input_from_facts(b)
    except ConfigError:
        return None


@check("boundary.lxc.config", summary="The guest's Proxmox container config and the host's /proc/devices were read.")
def config_read(facts):
    """Reading the Proxmox side needs the Proxmox host (inventory `lxc: {vmid, proxmox}`); without it: info only."""
    b = facts.get("boundary")
    if b is None:
        return None
    if not b.get("applicable"):
        kind = (((facts.get("host") or {}).get("container")) or {}).get("kind")
        if kind != "lxc":
            return None
        return Finding("boundary.lxc.config", Status.INFO,
                       "LXC guest, but its Proxmox config was not checked: no Proxmox host is configured",
                       evidence=[b.get("reason") or "no Proxmox host in the context"],
                       hint="give the inventory entry `lxc: {vmid: N, proxmox: HOST}` so gpudoctor reads "
                            "/etc/pve/lxc/N.conf and the host's /proc/devices over SSH")
    if b.get("error"):
        return Finding("boundary.lxc.config", Status.UNKNOWN, b["error"], evidence=[b["error"]])
    conf, pd = b.get("config") or {}, b.get("proc_devices") or {}
    where = b.get("proxmox") or "the Proxmox host"
    for what in (conf, pd):
        if what.get("text") is None:
            return Finding("boundary.lxc.config", Status.UNKNOWN,
                           f"cannot read {what.get('path')} on {where} ({what.get('error')})",
                           subject=what.get("path"), evidence=[f"read {what.get('path')} on {where} → {what.get('error')}"])
    try:
        inp = A.input_from_facts(b)
    except ConfigError as exc:
        return Finding("boundary.lxc.config", Status.UNKNOWN, exc.one_line(), evidence=[exc.one_line()])
    if not inp.procdev.text_ok:
        return Finding("boundary.lxc.config", Status.UNKNOWN,
                       f"{pd.get('path')} on {where} has no 'Character devices:' entries",
                       evidence=[f"{pd.get('path')}: {len(pd.get('text') or '')} bytes, no character devices"])
    st = (b.get("status") or {})
    return Finding("boundary.lxc.config", Status.OK,
                   f"read {inp.cfg.path} on {where} ({len(inp.cfg.lines)} lines, sections: "
                   f"{', '.join(s or 'live' for s in inp.cfg.sections)})",
                   evidence=[f"read {inp.cfg.path} and {pd.get('path')} on {where}",
                             st.get("evidence") or "pct status not asked",
                             f"cgroup layout: {inp.layout or 'unknown (read as cgroup v2)'}"
                             + (f": {inp.layout_evidence}" if inp.layout else "")],
                   data={"vmid": inp.vmid, "status": st.get("status"), "vmid_source": b.get("vmid_source"),
                         "cgroup_layout": inp.layout})


# The container-config checks: (id, the audit function over an AuditInput, its remedy, purpose, why it matters).
# Each is registered like any other check; `gpudoctor lxc audit` is the diagnosis restricted to this layer.
LXC_CHECKS = (
    (A.NODE_DRIVER, A.check_node_driver, None,
     "The NVIDIA driver is loaded on the Proxmox node (its /proc/devices lists an NVIDIA device).",
     "Without it no GPU node works in any container on the node; the majors an allow-list needs are unknown."),
    ("boundary.lxc.cgroup_allow", A.check_cgroup_allow, A.REMEDY_ID,
     "Each /dev/nvidia* node the container is given is allowed (live major:minor) by its live config.",
     "A node whose live major is not allowed opens with EPERM in the guest, whatever its mode: cuInit then 999."),
    ("boundary.lxc.mount_entry", A.check_mount_sources, None,
     "The GPU nodes the config passes (lxc.mount.entry, devN:) exist on the Proxmox host.",
     "An `optional` bind mount of a missing host node is skipped silently: the node is just absent in the guest."),
    ("boundary.lxc.stale_allow", A.check_stale, None,
     "No allow rule names a dynamic major that no NVIDIA driver holds now.",
     "After a driver update the old uvm major stays allowed; the kernel may hand it to another driver."),
    ("boundary.lxc.malformed", A.check_malformed, A.REMEDY_ID,
     "Every line of the container config parses (e.g. no rule that lost its key).",
     "Proxmox ignores unparsable lines with a warning; a bad rule or devN value stops the container starting."),
    ("boundary.lxc.misplaced", A.check_misplaced, A.REMEDY_ID,
     "No GPU line sits only in a snapshot or [pve:pending] section.",
     "Everything after a [section] header belongs to it: `echo … >> N.conf` lands in the last snapshot."),
    ("boundary.lxc.cgroup_v1", A.check_cgroup_v1, None,
     "No deprecated lxc.cgroup.* (cgroup v1) device keys in the live config.",
     "LXC ignores cgroup v1 settings on a pure cgroup2 host (PVE 9); pve-container warns they will be an error."),
    ("boundary.lxc.lock", A.check_lock, None,
     "The container config is not locked (lock:).",
     "A `lock:` means a backup, migration or snapshot is running or was interrupted; nobody should edit then."),
    ("boundary.lxc.restart_pending", A.check_restart_pending, None,
     "The device rules in the config are the ones the running container started with.",
     "LXC builds the device cgroup at start: an edit to /etc/pve/lxc/N.conf needs a container restart."),
)


def _register(cid: str, audit_fn, remedy: str | None, summary: str, why: str) -> None:
    def run(facts):
        inp = _input(facts)
        return None if inp is None else audit_fn(inp)

    run.__name__, run.__doc__ = cid.rsplit(".", 1)[1], why
    check(cid, depends_on=_CONFIG, remedy=remedy, summary=summary)(run)


for _row in LXC_CHECKS:
    _register(*_row)
