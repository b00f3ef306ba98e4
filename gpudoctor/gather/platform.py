"""Platform facts beyond the host layer's container kind: podman's /run/.containerenv, the probe's own cgroup, the marks
of a Kubernetes pod, the Docker daemon's cgroup driver, the NVIDIA device plugin and gpu-operator's validations on a
node, and the device policy of the systemd units that matter (the one the probe runs in, and those named).

facts["platform"] = {
  "containerenv": {"text"|None, "error"},          # /run/.containerenv (podman writes it into every container)
  "self_cgroup": {"text"|None, "error"},           # /proc/self/cgroup: the probe's cgroup, hence its unit
  "kubernetes": {"serviceaccount": bool, "env": bool, "hosts_managed": bool},
  "docker_daemon": {"text"|None, "error"},         # /etc/docker/daemon.json (exec-opts native.cgroupdriver)
  "device_plugin": {"dir": [...] | "ENOENT", "validations": {name: text} | "ENOENT", ...},
  "units": {"sglang.service": {"why": "probe"|"named", "show": {key: value|[values]}, "rc": 0, "error": None}},
}
Reads never include an environment of ours (secrets): a pod is known by its service account mount and /etc/hosts.
"""

from __future__ import annotations

from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host
from gpudoctor.boundary.platform import own_cgroup, unit_of

SERVICEACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
VALIDATIONS_DIR = "/run/nvidia/validations"  # gpu-operator's validator writes <component>-ready files here
DOCKER_DAEMON = "/etc/docker/daemon.json"
CHECKPOINT = "kubelet_internal_checkpoint"  # the kubelet's record of each plugin's registered devices and allocations


def registered_devices(text: str | None) -> dict:
    """The kubelet checkpoint → {"registered": {resource: [device ids]}, "allocated": {resource: [ids]}} (the
    plugin registers only the devices it judges healthy) or {"error": ...}."""
    import json

    try:
        data = (json.loads(text or "") or {}).get("Data") or {}
    except ValueError:
        return {"error": "not JSON"}
    alloc: dict = {}
    for e in data.get("PodDeviceEntries") or []:
        ids = e.get("DeviceIDs") or []
        ids = [i for v in ids.values() for i in v] if isinstance(ids, dict) else list(ids)
        alloc.setdefault(e.get("ResourceName") or "?", []).extend(ids)
    return {"registered": {k: list(v or []) for k, v in (data.get("RegisteredDevices") or {}).items()},
            "allocated": alloc}

# What `systemctl show` must tell about a unit's device boundary (one round trip per unit).
SHOW_PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "FragmentPath", "DropInPaths", "DevicePolicy",
                   "DeviceAllow", "ControlGroup", "ExecMainPID", "NeedDaemonReload")
_MULTI = {"DeviceAllow"}  # printed once per entry


def parse_show(text: str) -> dict:
    """`systemctl show` output (KEY=VALUE lines; DeviceAllow= once per entry) → {key: value | [values]}."""
    out: dict = {k: [] for k in _MULTI}
    for ln in (text or "").splitlines():
        key, sep, val = ln.partition("=")
        if not sep:
            continue
        if key in _MULTI:
            if val.strip():
                out[key].append(val.strip())
        else:
            out[key] = val
    return out


def _read(r) -> dict:
    return {"text": r.text if r.ok else None, "error": r.error}


def gather(host: Host, ctx: GatherContext) -> dict:
    t = min(ctx.timeout, 3.0)
    env, cg, hosts, dd, sa, dp, val = host.batch([
        ("read", "/run/.containerenv", 64 << 10), ("read", "/proc/self/cgroup", 64 << 10),
        ("read", "/etc/hosts", 64 << 10), ("read", DOCKER_DAEMON, 1 << 20), ("stat", [SERVICEACCOUNT]),
        ("listdir", DEVICE_PLUGIN_DIR), ("listdir", VALIDATIONS_DIR)], t)
    sa_st = sa[SERVICEACCOUNT]
    out: dict = {
        "containerenv": _read(env), "self_cgroup": _read(cg), "docker_daemon": _read(dd),
        "kubernetes": {"serviceaccount": bool(sa_st.exists and sa_st.kind in ("dir", "link")),
                       "hosts_managed": "Kubernetes-managed hosts file" in (hosts.text or "")[:200]},
        "device_plugin": {"dir": dp, "validations": val},
    }
    if isinstance(val, list) and val:
        reads = host.batch([("read", f"{VALIDATIONS_DIR}/{n}", 4096) for n in val], t)
        out["device_plugin"]["validations"] = {n: (r.text if r.ok else None) for n, r in zip(val, reads)}
    if isinstance(dp, list) and CHECKPOINT in dp:
        out["device_plugin"]["checkpoint"] = registered_devices(
            host.read_file(f"{DEVICE_PLUGIN_DIR}/{CHECKPOINT}", timeout=t, max_bytes=4 << 20).text)
    units = {u: "named" for u in (getattr(ctx, "units", None) or [])}
    probe_unit = unit_of(own_cgroup(out["self_cgroup"]["text"]))
    if probe_unit and probe_unit not in units:
        units[probe_unit] = "probe"
    out["units"] = {u: {"why": why, **show_unit(host, u, ctx.timeout)} for u, why in units.items()}
    if units:
        res = host.run(["sh", "-c", _WHICH], timeout=t)
        out["systemd_analyze"] = (res.stdout.strip().splitlines() or [None])[0] if res.ok else None
    return out


_WHICH = 'PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"; command -v systemd-analyze || true'


def show_unit(host: Host, unit: str, timeout: float) -> dict:
    """One unit's device boundary as systemd sees it now (after the last daemon-reload), with the text of its unit
    file and of gpudoctor's drop-in (what a remedy verifies and diffs against)."""
    from gpudoctor.boundary.systemd_devices import dropin_path

    res = host.run(["systemctl", "show", unit, "--property=" + ",".join(SHOW_PROPERTIES)], timeout=timeout)
    if not res.ok:
        return {"show": None, "rc": res.rc, "error": res.describe()}
    show = parse_show(res.stdout)
    frag, drop = show.get("FragmentPath") or None, dropin_path(unit)
    reads = host.batch([("read", p, 1 << 20) for p in ([frag] if frag else []) + [drop]], min(timeout, 3.0))
    fr = reads[0] if frag else None
    return {"show": show, "rc": 0, "error": None,
            "fragment": {"path": frag, "text": fr.text if fr is not None and fr.ok else None,
                         "error": fr.error if fr is not None else "no FragmentPath"},
            "dropin": {"path": drop, "text": reads[-1].text if reads[-1].ok else None, "error": reads[-1].error}}
