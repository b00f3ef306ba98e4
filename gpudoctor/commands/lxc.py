"""`gpudoctor lxc audit|fix`: a Proxmox container's GPU device boundary, on the Proxmox host or offline."""

from __future__ import annotations

import click

from gpudoctor.commands.fix import FIX_EXIT_DOC, engine_options, run_fix
from gpudoctor.errors import ConfigError, InputError
from gpudoctor.options import Count
from gpudoctor.conventions import settings

AUDIT_EXIT_DOC = """\b
Exit codes:
  0  healthy
  1  warnings (stale or misplaced rules, lock, cgroup v1 keys, restart pending)
  2  failure (a GPU node the container needs is not allowed, or a line breaks the start)
  3  bad input (unreadable or unusable file), or a major that could not be determined"""


@click.group("lxc")
def lxc():
    """Audit and fix a Proxmox LXC container's GPU device boundary.

    Run on the Proxmox host with a VMID (reads /etc/pve/lxc/VMID.conf, /proc/devices, the running config and
    `pct status`), from anywhere over SSH with --host (an inventory guest, or a Proxmox host and a VMID), or
    anywhere with --config/--devices files (offline, e.g. copies from the host).
    """


def _check_args(vmid, config_path, host_name=None, devices_path=None, running_path=None):
    if host_name is not None:
        if config_path or devices_path or running_path:
            raise click.UsageError("--host reads the Proxmox host's own files: --config, --devices and --running "
                                   "cannot be combined with it")
        return
    if (vmid is None) == (config_path is None):
        raise click.UsageError("give exactly one of VMID or --config PATH (or --host NAME)")


def _facts(vmid, config_path, devices_path, running_path, cgroup_layout=None) -> dict:
    """Boundary facts from this machine, validated: an unusable input is one line and exit 3. With VMID (on the
    Proxmox host) the cgroup layout is this machine's; for a --config file it is --cgroup-layout (default: v2)."""
    from gpudoctor.gather.boundary import gather_lxc
    from gpudoctor.proxmox.audit import vmid_from_path
    from gpudoctor.target import local_host

    on_host = vmid is not None
    host = local_host()
    node = _is_proxmox_node(host)
    if not on_host and not devices_path and not node:
        raise InputError(f"--config {config_path} without --devices: this machine is not a Proxmox node (no "
                         f"{PVE_DIR}), so there is no node /proc/devices here to judge the majors against; give a "
                         f"copy of the node's with --devices FILE, or ask the node itself over SSH with --host NODE "
                         f"VMID (or --host GUEST)")
    vm = vmid if on_host else vmid_from_path(config_path)
    b = gather_lxc(host, vm, config=config_path, devices=devices_path or "/proc/devices",
                   running=running_path, ask_status=on_host, stat_nodes=on_host, read_running=on_host,
                   read_layout=on_host and cgroup_layout is None)
    if on_host and not node and b["config"]["text"] is None:
        raise ConfigError(f"cannot read it ({b['config']['error']}): this machine is not a Proxmox node (no "
                          f"{PVE_DIR}); reach the node from here over SSH with --host NODE {vmid} (or --host "
                          f"GUEST), or offline with --config FILE --devices FILE (copies of the node's files)",
                          path=b["config"]["path"])
    if cgroup_layout is not None:
        b["cgroup"] = {"path": None, "error": None, "layout": cgroup_layout, "evidence": "given with --cgroup-layout"}
    if not on_host:  # offline: the audit's hints name the same files (and say when /proc/devices is not the node's)
        b["offline"] = {"config": config_path, "devices": devices_path}
    return {"meta": {"host": b["proxmox"]}, "boundary": _validated(b, running_given=running_path is not None)}


PVE_DIR = "/etc/pve"  # pmxcfs, mounted on every Proxmox VE node: where container configs and the node's files are


def _is_proxmox_node(host) -> bool:
    """This machine is a Proxmox VE node: its /proc/devices is the one its containers' majors live in."""
    return host.stat(PVE_DIR).kind == "dir"


def _validated(b: dict, *, running_given: bool, where: str = "") -> dict:
    """An unusable config or /proc/devices is one line naming the file (on `where`, a remote host) and exit 3."""
    from gpudoctor.proxmox.config import read as read_config
    from gpudoctor.proxmox.devices import ProcDevices

    conf = b["config"]
    if conf["text"] is None:
        raise ConfigError(f"cannot read it ({conf['error']})", path=where + conf["path"])
    try:
        read_config(conf["path"], conf["text"].encode("utf-8", "surrogateescape"))  # raises ConfigError if unusable
    except ConfigError as exc:
        if where:
            exc.path = where + (exc.path or conf["path"])
        raise
    pd = b["proc_devices"]
    if pd["text"] is None:
        raise InputError(f"cannot read it ({pd['error']})", path=where + pd["path"])
    if not ProcDevices.parse(pd["text"]).text_ok:
        raise InputError("not a /proc/devices file: no 'Character devices:' section with entries",
                         path=where + pd["path"], line=1)
    run = b.get("running")
    if run is not None and run["text"] is None:
        if running_given:
            raise InputError(f"cannot read it ({run['error']})", path=where + run["path"])
        b["running"] = None  # never started since boot: there is no running config to compare
    return b


def _remote(host_name: str, inventory, vmid: int | None, timeout: float = 10.0):
    """(facts, Target) for --host: an inventory LXC guest (its Proxmox node; its VMID from the inventory, the
    VMID argument, or `pct list` by its name) or an inventory Proxmox host with a VMID. Connects before reading."""
    from gpudoctor.errors import InventoryError
    from gpudoctor.gather.boundary import gather_lxc
    from gpudoctor.inventory import load_inventory
    from gpudoctor.proxmox import pct
    from gpudoctor.target import open_target

    from gpudoctor.commands import say_inventory

    inv = load_inventory(inventory)
    say_inventory(inv)
    if host_name not in inv.hosts and host_name not in inv.proxmox:
        known = ", ".join(sorted([*inv.hosts, *inv.proxmox])) or "none"
        raise InventoryError(f"no host or proxmox host named {host_name!r} (known: {known})", path=inv.path)
    t = open_target(host_name, inv, timeout=timeout)
    pxe, guest = t.proxmox_entry, None
    if t.entry is not pxe:  # an inventory guest
        if pxe is None:
            raise InventoryError(f"host {host_name} is not an LXC guest (it has no lxc: {{proxmox: NAME}}); give its "
                                 f"Proxmox host and the VMID instead: --host PROXMOX VMID", path=inv.path,
                                 line=t.entry.line or None)
        guest = t.name
        vmid = vmid if vmid is not None else t.vmid
    elif vmid is None:
        raise click.UsageError(f"{host_name} is a Proxmox host: give the container's VMID too")
    px = t.proxmox
    try:
        connect = getattr(px, "connect", None)
        if connect is not None:
            connect()  # an unknown host key refuses here, before anything runs
        if vmid is None:
            vmid, ev = pct.find_vmid(px, guest, timeout, cmd=pxe.pct)
            if vmid is None:
                raise InputError(f"cannot find the VMID of {guest} on {pxe.name}: {ev}; put lxc: {{vmid: N}} in the "
                                 f"inventory or pass the VMID", path=inv.path)
        b = gather_lxc(px, int(vmid), name=guest, timeout=timeout, config_dir=pxe.config_dir, pct_cmd=pxe.pct)
        return {"meta": {"host": pxe.name}, "boundary": _validated(b, running_given=False, where=f"{pxe.name}:")}, t
    except BaseException:
        t.close()
        raise


_host_options = [
    click.option("--host", "host_name", metavar="NAME",
                 help="Over SSH: an inventory LXC guest (its Proxmox host and VMID come from the inventory, or "
                      "`pct list`), or an inventory Proxmox host together with VMID."),
    click.option("--inventory", type=click.Path(dir_okay=False), envvar="GPUDOCTOR_INVENTORY",
                 help="Inventory file for --host (default: ./inventory.yaml, then ~/.config/gpudoctor/inventory.yaml)."),
]


def host_options(f):
    for o in reversed(_host_options):
        f = o(f)
    return f


@lxc.command("audit", epilog=AUDIT_EXIT_DOC)
@click.argument("vmid", type=Count(100, 999999999), required=False)
@click.option("--config", "config_path", metavar="PATH", help="The container config file (instead of VMID).")
@click.option("--devices", "devices_path", metavar="FILE",
              help="The Proxmox node's /proc/devices (default: this machine's, on a node only).")
@click.option("--running", "running_path", metavar="PATH",
              help="The running config LXC generated at start (default with VMID: /var/lib/lxc/VMID/config).")
@click.option("--cgroup-layout", type=click.Choice(["unified", "hybrid", "legacy"]), default=None,
              help="The host's cgroup layout (default: read from its mount table with VMID or --host; unified for a "
                   "--config file). On hybrid/legacy hosts LXC ignores lxc.cgroup2 rules and applies lxc.cgroup.*.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable findings.")
@click.option("--verbose-findings", "-a", "show_all", is_flag=True,
              help="List every subject of a healthy check, with its evidence (as `check -a`).")
@host_options
def audit(vmid, config_path, devices_path, running_path, cgroup_layout, as_json, host_name, inventory,
          show_all=False):
    """Check that every /dev/nvidia* node the container is given is allowed by its LIVE config section.

    For each node from lxc.mount.entry and devN: lines it looks up the node's live major in the host's
    /proc/devices and evaluates the allow/deny rules as LXC does. It reports missing majors, stale majors,
    malformed lines (e.g. a rule that lost its key), GPU lines stranded in a snapshot or [pve:pending], `lock:`,
    cgroup v1 keys, and a config edited since the container started. On a host with the hybrid or legacy cgroup
    layout it evaluates the lxc.cgroup.devices.* (v1) rules instead: LXC ignores lxc.cgroup2.* there.

    \b
    Examples:
      gpudoctor lxc audit 200                     on the Proxmox host
      gpudoctor lxc audit --host ct200            from anywhere, over SSH (inventory)
      gpudoctor lxc audit --host kpro6 200        the same, naming the Proxmox host
      gpudoctor lxc audit --config 200.conf --devices proc-devices.txt
      gpudoctor lxc audit 200 --json
    """
    from gpudoctor import report
    from gpudoctor.diagnose import diagnose
    from gpudoctor.proxmox.audit import input_from_facts

    _check_args(vmid, config_path, host_name, devices_path, running_path)
    if host_name:
        facts, t = _remote(host_name, inventory, vmid)
        t.close()
        if cgroup_layout is not None:
            facts["boundary"]["cgroup"] = {"path": None, "error": None, "layout": cgroup_layout,
                                           "evidence": "given with --cgroup-layout"}
    else:
        facts = _facts(vmid, config_path, devices_path, running_path, cgroup_layout)
    d = diagnose(facts, {"boundary"})  # the registered boundary checks, nothing else
    inp = input_from_facts(facts["boundary"])
    if as_json:
        click.echo(report.lxc_audit_json(d, inp))
    else:
        report.lxc_audit(report.writer(), d, inp, verbose=show_all, quiet=settings().quiet)
    raise SystemExit(d.exit_code)


@lxc.command("fix", epilog=FIX_EXIT_DOC)
@click.argument("vmid", type=Count(100, 999999999), required=False)
@click.option("--config", "config_path", metavar="PATH", help="The container config file (instead of VMID).")
@click.option("--devices", "devices_path", metavar="FILE",
              help="The Proxmox node's /proc/devices (default: this machine's, on a node only).")
@click.option("--running", "running_path", metavar="PATH",
              help="The running config (default with VMID: /var/lib/lxc/VMID/config).")
@engine_options
@host_options
@click.option("--yes", "-y", is_flag=True, help="With --apply: do not ask for confirmation (needed without a TTY).")
def fix(vmid, config_path, devices_path, running_path, apply, reboot, backup_dir, audit_log, lock_dir, as_json,
        host_name, inventory, yes):
    """Add the missing allow rules to the container's live config section; dry run unless --apply.

    Inserts `lxc.cgroup2.devices.allow: c MAJOR:* rwm` for each GPU node whose live major is not allowed, before
    the first [snapshot]/[pve:pending] header (never into a snapshot), and removes keyless rule lines such as
    `c 511:* rwm`. Every other byte stays as it was. It refuses when the config is locked (`lock:`) or its
    filesystem is read-only. --apply writes a dated backup outside /etc/pve, a temp file beside the config, and
    renames it over the config in one step; it then re-reads and re-audits the file (rolling back on failure) and
    logs to the audit log. A second run changes nothing.

    With --reboot the container is restarted (pct reboot) only if it runs and `nvidia-smi` inside it lists no
    compute process; otherwise the restart is left pending and the reason printed.

    \b
    Examples:
      gpudoctor lxc fix 200                       show the plan and diff
      gpudoctor lxc fix 200 --apply --reboot      fix (asks first; --yes without a terminal), then restart
      gpudoctor lxc fix --host ct200 --apply      from anywhere, over SSH to ct200's Proxmox host
      gpudoctor lxc fix --config 200.conf --devices proc-devices.txt --apply

    Over SSH (--host) the backup is written on the Proxmox host (--backup-dir is a path there); the audit log
    and the lock stay on this machine.
    """
    from gpudoctor.remedies.lxc_cgroup import LxcCgroupAllow

    _check_args(vmid, config_path, host_name, devices_path, running_path)
    if reboot and not apply:
        raise click.UsageError("--reboot needs --apply")
    if host_name:
        facts, target = _remote(host_name, inventory, vmid)
    else:
        from gpudoctor.target import open_target

        facts, target = _facts(vmid, config_path, devices_path, running_path), open_target("local", search=False)
    with target:
        # the edit goes to the Proxmox node: it is the one host of this run
        target.host = target.proxmox or target.host
        code = run_fix(target, [LxcCgroupAllow()], facts=facts, apply=apply, as_json=as_json, backup_dir=backup_dir,
                       audit_log=audit_log, lock_dir=lock_dir, reboot=reboot, yes=yes)
    raise SystemExit(code)
