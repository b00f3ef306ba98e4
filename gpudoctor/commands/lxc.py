"""`gpudoctor lxc audit|fix`: a Proxmox container's GPU device boundary, on the Proxmox host or offline."""

from __future__ import annotations

import json

import click

from gpudoctor.commands.fix import FIX_EXIT_DOC, engine_options, make_engine, run_engine
from gpudoctor.errors import ConfigError, InputError

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
    `pct status`), or anywhere with --config/--devices files (offline, e.g. copies from the host).
    """


def _target(vmid, config_path):
    if (vmid is None) == (config_path is None):
        raise click.UsageError("give exactly one of VMID or --config PATH")


def _facts(vmid, config_path, devices_path, running_path) -> dict:
    """Boundary facts from this machine, validated: an unusable input is one line and exit 3."""
    from gpudoctor.gather.boundary import gather_lxc
    from gpudoctor.host.local import LocalHost
    from gpudoctor.proxmox.audit import vmid_from_path
    from gpudoctor.proxmox.config import read as read_config
    from gpudoctor.proxmox.devices import ProcDevices

    on_host = vmid is not None
    vm = vmid if on_host else vmid_from_path(config_path)
    b = gather_lxc(LocalHost(), vm, config=config_path, devices=devices_path or "/proc/devices",
                   running=running_path, ask_status=on_host, stat_nodes=on_host, read_running=on_host)
    conf = b["config"]
    if conf["text"] is None:
        raise ConfigError(f"cannot read it ({conf['error']})", path=conf["path"])
    read_config(conf["path"], conf["text"].encode("utf-8", "surrogateescape"))  # raises ConfigError if unusable
    pd = b["proc_devices"]
    if pd["text"] is None:
        raise InputError(f"cannot read it ({pd['error']})", path=pd["path"])
    if not ProcDevices.parse(pd["text"]).text_ok:
        raise InputError("not a /proc/devices file: no 'Character devices:' section with entries", path=pd["path"],
                         line=1)
    run = b.get("running")
    if run is not None and run["text"] is None:
        if running_path is not None:
            raise InputError(f"cannot read it ({run['error']})", path=run["path"])
        b["running"] = None  # never started since boot: there is no running config to compare
    return {"boundary": b}


@lxc.command("audit", epilog=AUDIT_EXIT_DOC)
@click.argument("vmid", type=int, required=False)
@click.option("--config", "config_path", metavar="PATH", help="The container config file (instead of VMID).")
@click.option("--devices", "devices_path", metavar="FILE", help="The host's /proc/devices (default: this machine's).")
@click.option("--running", "running_path", metavar="PATH",
              help="The running config LXC generated at start (default with VMID: /var/lib/lxc/VMID/config).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable findings.")
def audit(vmid, config_path, devices_path, running_path, as_json):
    """Check that every /dev/nvidia* node the container is given is allowed by its LIVE config section.

    For each node from lxc.mount.entry and devN: lines it looks up the node's live major in the host's
    /proc/devices and evaluates the allow/deny rules as LXC does. It reports missing majors, stale majors,
    malformed lines (e.g. a rule that lost its key), GPU lines stranded in a snapshot or [pve:pending], `lock:`,
    cgroup v1 keys, and a config edited since the container started.

    \b
    Examples:
      gpudoctor lxc audit 200                     on the Proxmox host
      gpudoctor lxc audit --config 200.conf --devices proc-devices.txt
      gpudoctor lxc audit 200 --json
    """
    from gpudoctor.findings import Status, exit_code, worst
    from gpudoctor.proxmox.audit import audit as run_audit
    from gpudoctor.proxmox.audit import input_from_facts

    _target(vmid, config_path)
    facts = _facts(vmid, config_path, devices_path, running_path)
    inp = input_from_facts(facts["boundary"])
    findings = run_audit(inp)
    verdict = worst(f.status for f in findings)
    code = exit_code(verdict)
    if as_json:
        click.echo(json.dumps({"schema": "gpudoctor.lxc-audit/1", "config": inp.cfg.path, "vmid": inp.vmid,
                               "verdict": verdict.value, "exit_code": code,
                               "findings": [f.to_json() for f in findings]}, indent=2, sort_keys=True))
        raise SystemExit(code)
    click.echo(f"{inp.label} ({inp.cfg.path}): {verdict.value.upper()}")
    order = {Status.FAIL: 0, Status.UNKNOWN: 1, Status.WARN: 2, Status.OK: 3, Status.INFO: 4}
    for f in sorted(findings, key=lambda f: order[f.status]):
        click.echo(f"{f.status.value.upper():7} {f.id}  {f.summary}")
        if f.bad:
            for e in f.evidence:
                click.echo(f"        {e}")
            if f.hint:
                click.echo(f"        fix: {f.hint}")
    raise SystemExit(code)


@lxc.command("fix", epilog=FIX_EXIT_DOC)
@click.argument("vmid", type=int, required=False)
@click.option("--config", "config_path", metavar="PATH", help="The container config file (instead of VMID).")
@click.option("--devices", "devices_path", metavar="FILE", help="The host's /proc/devices (default: this machine's).")
@click.option("--running", "running_path", metavar="PATH",
              help="The running config (default with VMID: /var/lib/lxc/VMID/config).")
@engine_options
def fix(vmid, config_path, devices_path, running_path, apply, reboot, backup_dir, audit_log, lock_dir, as_json):
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
      gpudoctor lxc fix 200 --apply --reboot      fix, then restart if no GPU job runs
      gpudoctor lxc fix --config 200.conf --devices proc-devices.txt --apply
    """
    from gpudoctor.host.local import LocalHost
    from gpudoctor.remedies.lxc_cgroup import LxcCgroupAllow

    _target(vmid, config_path)
    if reboot and not apply:
        raise click.UsageError("--reboot needs --apply")
    facts = _facts(vmid, config_path, devices_path, running_path)
    local = LocalHost()
    engine = make_engine([LxcCgroupAllow()], {local.name: local}, backup_dir=backup_dir, audit_log=audit_log,
                         lock_dir=lock_dir, reboot=reboot)
    raise SystemExit(run_engine(engine, facts, apply=apply, as_json=as_json))
