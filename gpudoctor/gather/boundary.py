"""Boundary facts for an LXC guest, read from its Proxmox host: the container config, the host's /proc/devices,
the running config LXC generated at start, `pct status`, a stat of each GPU node the config passes, and the
host's cgroup layout (from its /proc/self/mountinfo: on a hybrid/legacy host LXC applies other device keys).

Facts are plain JSON (the snapshot format); texts keep undecodable bytes as surrogate escapes so that a config
round-trips byte-for-byte from a snapshot too.
"""

from __future__ import annotations

import os

from gpudoctor.errors import HostUnreachable
from gpudoctor.proxmox import pct
from gpudoctor.proxmox.audit import cgroup_layout
from gpudoctor.proxmox.config import parse as parse_config

CONFIG_DIR = "/etc/pve/lxc"
PROC_DEVICES = "/proc/devices"
MOUNTINFO = "/proc/self/mountinfo"


def config_path(vmid: int, config_dir: str = CONFIG_DIR) -> str:
    return f"{config_dir.rstrip('/') or ''}/{int(vmid)}.conf"


def running_path(vmid: int) -> str:
    return f"/var/lib/lxc/{vmid}/config"


def _read(host, path: str, timeout: float, max_bytes: int = (1 << 20) + 1) -> dict:
    r = host.read_file(path, timeout=timeout, max_bytes=max_bytes)
    return {"path": path, "error": r.error,
            "text": None if r.data is None else r.data.decode("utf-8", "surrogateescape")}


def gather_lxc(px, vmid: int | None, *, config: str | None = None, devices: str = PROC_DEVICES,
               running: str | None = None, name: str | None = None, timeout: float = 10.0,
               ask_status: bool = True, stat_nodes: bool = True, read_running: bool = True, read_layout: bool | None = None,
               config_dir: str = CONFIG_DIR, pct_cmd=pct.PCT) -> dict:
    """Everything the boundary checks and the LXC remedy need, from the Proxmox host `px`. The host's cgroup layout
    is read (read_layout, default: unless `config` names a file, which may come from another host)."""
    cpath = config or config_path(vmid, config_dir)
    out: dict = {"kind": "lxc", "applicable": True, "proxmox": px.name, "vmid": vmid, "name": name,
                 "pct": list(pct_cmd),
                 "config": _read(px, cpath, timeout), "proc_devices": _read(px, devices, timeout, 1 << 20)}
    if read_layout if read_layout is not None else config is None:
        mi = _read(px, MOUNTINFO, timeout, 1 << 20)
        layout, why = cgroup_layout(mi["text"])
        out["cgroup"] = {"path": MOUNTINFO, "error": mi["error"], "layout": layout, "evidence": why}
    else:
        out["cgroup"] = {"path": None, "error": None, "layout": None, "evidence": "not read (a config file)"}
    rpath = running or (running_path(vmid) if vmid is not None and read_running else None)
    out["running"] = _read(px, rpath, timeout) if rpath else None
    sv = px.statvfs(os.path.dirname(cpath) or ".", timeout)
    out["config"]["readonly"] = sv.get("readonly")
    if ask_status and vmid is not None:
        st, res = pct.status(px, vmid, timeout, cmd=pct_cmd)
        out["status"] = {"status": st, "evidence": res.describe()}
    else:
        out["status"] = {"status": None, "evidence": "not asked"}
    out["host_nodes"] = None
    if stat_nodes and out["config"]["text"] is not None:
        from gpudoctor.proxmox.audit import needed_nodes

        cfg = parse_config(out["config"]["text"], cpath)
        paths = [n.node.path for n in needed_nodes(cfg)]
        if paths:
            out["host_nodes"] = {p: s.to_json() for p, s in px.stat_many(paths, timeout).items()}
    return out


def gather(host, ctx) -> dict:
    """facts["boundary"]: for a guest with a Proxmox host in its context; otherwise says why it does not apply."""
    px = getattr(ctx, "proxmox", None)
    if px is None:
        return {"kind": None, "applicable": False,
                "reason": "no Proxmox host is configured for this target (inventory: lxc: {vmid, proxmox})"}
    try:
        return _gather_from(px, ctx)
    except HostUnreachable as exc:  # the guest's own layers are still checked; this one could not be probed
        return {"kind": "lxc", "applicable": True, "proxmox": px.name, "vmid": getattr(ctx, "vmid", None),
                "name": ctx.name, "error": f"cannot reach the Proxmox host: {exc.one_line()}"}


def _gather_from(px, ctx) -> dict:
    vmid, source = getattr(ctx, "vmid", None), "inventory"
    pct_cmd = tuple(getattr(ctx, "pct", None) or pct.PCT)
    config_dir = getattr(ctx, "lxc_config_dir", None) or CONFIG_DIR
    if vmid is None:
        vmid, ev = pct.find_vmid(px, ctx.name, ctx.timeout, cmd=pct_cmd)
        source = ev
        if vmid is None:
            return {"kind": "lxc", "applicable": True, "proxmox": px.name, "vmid": None, "name": ctx.name,
                    "error": f"cannot find the container's VMID on {px.name}: {ev}"}
    out = gather_lxc(px, int(vmid), name=ctx.name, timeout=ctx.timeout, config_dir=config_dir, pct_cmd=pct_cmd)
    out["vmid_source"] = source
    return out
