"""`gpudoctor fix`: plan guarded fixes for failing checks (dry run), apply them with --apply. Also the renderers
that `gpudoctor lxc fix` shares."""

from __future__ import annotations

import json
import socket

import click

from gpudoctor.errors import EXIT_FAIL, EXIT_OK, EXIT_WARN, InputError

FIX_EXIT_DOC = """\b
Exit codes:
  0  nothing to do, or every change applied and verified
  1  changes planned but not applied (dry run), or a reboot is still pending
  2  a remedy refused, failed, or was rolled back after a failed verification; or the lock is held
  3  bad input (unreadable or malformed file, bad flag)"""


def render_plan(plan, *, apply: bool) -> str:
    lines = []
    for c in plan.changes:
        lines.append(f"PLAN  {c.remedy} on {c.host}: {c.summary}")
        lines.append(f"      risk {c.risk}" + ("; needs a restart to take effect" if c.needs_reboot else ""))
        for cmd in c.commands:
            lines.append(f"      then: {cmd}")
        if c.diff:
            lines.append("")
            lines.extend("      " + ln if ln else "" for ln in c.diff.rstrip("\n").split("\n"))
            lines.append("")
    for r in plan.refusals:
        lines.append(f"REFUSED  {r.remedy}: {r.reason}")
    if not plan.changes and not plan.refusals:
        lines.append("nothing to fix")
    if plan.changes and not apply:
        lines.append("dry run: nothing was changed; re-run with --apply to make these changes")
    return "\n".join(lines)


def render_outcomes(outcomes) -> str:
    lines = []
    for o in outcomes:
        tag = {"applied": "APPLIED", "unchanged": "UNCHANGED", "rolled_back": "ROLLED BACK",
               "rollback_failed": "ROLLBACK FAILED", "failed": "FAILED"}[o.result]
        lines.append(f"{tag}  {o.change.remedy} on {o.change.host}: {o.detail}")
        if o.applied.get("backup"):
            lines.append(f"      backup: {o.applied['backup']}")
        if o.reboot is not None:
            lines.append(("      restarted: " if o.reboot.done else "      not restarted: ") + o.reboot.message)
        elif o.ok and o.change.needs_reboot:
            cmd = next((c for c in o.change.commands if "reboot" in c), "a restart")
            lines.append(f"      restart pending: {cmd} (or re-run with --reboot)")
    return "\n".join(lines)


def exit_code_for(plan, outcomes, *, apply: bool) -> int:
    if plan.refusals or any(not o.ok for o in outcomes):
        return EXIT_FAIL
    if not apply:
        return EXIT_WARN if plan.changes else EXIT_OK
    if any(o.change.needs_reboot and not (o.reboot and o.reboot.done) for o in outcomes):
        return EXIT_WARN
    return EXIT_OK


def run_engine(engine, facts: dict, *, apply: bool, as_json: bool) -> int:
    """Plan, show, apply when asked, show outcomes; return the exit code (shared by `fix` and `lxc fix`)."""
    plan = engine.plan(facts)
    outcomes = engine.apply(plan) if apply and plan.changes else []
    if as_json:
        click.echo(json.dumps({"schema": "gpudoctor.fix/1", "apply": apply, "plan": plan.to_json(),
                               "outcomes": [o.to_json() for o in outcomes],
                               "exit_code": exit_code_for(plan, outcomes, apply=apply)}, indent=2, sort_keys=True))
    else:
        click.echo(render_plan(plan, apply=apply))
        if outcomes:
            click.echo(render_outcomes(outcomes))
    return exit_code_for(plan, outcomes, apply=apply)


def engine_options(f):
    """--apply/--reboot/--backup-dir/--audit-log/--lock-dir/--json, shared by `fix` and `lxc fix`."""
    from gpudoctor.remedy import default_paths

    paths = default_paths()
    opts = [
        click.option("--apply", is_flag=True, help="Make the changes (default: dry run, show the plan and diff)."),
        click.option("--reboot", is_flag=True,
                     help="With --apply: restart what must restart, only when that is safe (no GPU job running)."),
        click.option("--backup-dir", default=paths["backup_dir"], show_default=True, metavar="DIR",
                     help="Where dated backups of edited files go, on the edited host (never beside the file)."),
        click.option("--audit-log", default=paths["audit_log"], show_default=True, metavar="FILE",
                     help="JSONL audit log of every applied change (on this machine)."),
        click.option("--lock-dir", default=paths["lock_dir"], show_default=True, metavar="DIR",
                     help="Per-host lock files, so two gpudoctor runs never edit one host at once."),
        click.option("--json", "as_json", is_flag=True, help="Machine-readable plan and outcomes."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def make_engine(remedies, hosts: dict, *, backup_dir, audit_log, lock_dir, reboot: bool):
    from gpudoctor.remedy import AuditLog, Engine, RemedyContext

    ctx = RemedyContext(hosts=hosts, backup_dir=backup_dir, reboot=reboot)
    return Engine(remedies, ctx, audit_log=AuditLog(audit_log), lock_dir=lock_dir)


@click.command("fix", epilog=FIX_EXIT_DOC)
@click.option("--facts", "facts_path", metavar="FILE", type=click.Path(dir_okay=False),
              help="Plan from a facts snapshot (gpudoctor snapshot) instead of gathering this host's facts.")
@click.option("--only", multiple=True, metavar="REMEDY", help="Only this remedy id (repeatable).")
@click.option("--host", "host_name", metavar="NAME",
              help="Inventory host to fix over SSH; an LXC guest's config is fixed on its Proxmox host.")
@click.option("--inventory", type=click.Path(dir_okay=False), envvar="GPUDOCTOR_INVENTORY",
              help="Inventory file for --host (default: ./inventory.yaml, then ~/.config/gpudoctor/inventory.yaml).")
@engine_options
def fix(facts_path, only, host_name, inventory, apply, reboot, backup_dir, audit_log, lock_dir, as_json):
    """Plan guarded fixes for what the checks found; change nothing unless --apply.

    Every change is shown as a plan with its unified diff first. With --apply each change is made under a per-host
    lock, verified by re-running its check, rolled back if that fails, and written to the audit log.

    \b
    Examples:
      gpudoctor fix                          dry run on this host's facts
      gpudoctor fix --apply                  make the changes, verify, log
      gpudoctor fix --facts snap.json        plan from a saved snapshot (gpudoctor snapshot)
      gpudoctor fix --only lxc.cgroup_allow --apply --reboot
      gpudoctor fix --host ct200 --apply     over SSH: ct200 and (for its LXC config) its Proxmox host
    """
    from gpudoctor import remedies
    from gpudoctor.host.local import LocalHost

    try:
        chosen = remedies.all_remedies(list(only) if only else None)
    except KeyError as exc:
        raise InputError(str(exc.args[0])) from None
    if only and len(chosen) != len(set(only)):
        unknown = sorted(set(only) - {r.id for r in chosen})
        raise InputError(f"unknown remedy {', '.join(unknown)}; known: {', '.join(sorted(remedies.REMEDIES))}")
    if host_name and facts_path:
        raise click.UsageError("give --host or --facts, not both")
    if host_name and host_name not in ("local", "localhost"):
        raise SystemExit(_fix_remote(host_name, inventory, chosen, apply=apply, reboot=reboot, backup_dir=backup_dir,
                                     audit_log=audit_log, lock_dir=lock_dir, as_json=as_json))
    local = LocalHost()
    if facts_path:
        facts = _load_facts(facts_path)
    else:
        facts = _gather_local(local)
    hosts = {"localhost": local, socket.gethostname(): local}
    engine = make_engine(chosen, hosts, backup_dir=backup_dir, audit_log=audit_log, lock_dir=lock_dir,
                         reboot=reboot)
    raise SystemExit(run_engine(engine, facts, apply=apply, as_json=as_json))


def _fix_remote(host_name, inventory, chosen, *, apply, reboot, backup_dir, audit_log, lock_dir, as_json) -> int:
    """Gather the inventory host's facts over SSH (with its Proxmox host's, for an LXC guest), then plan and apply;
    each change runs on the host it names. Both connections open first: an unknown host key runs nothing."""
    from gpudoctor.gather import gather
    from gpudoctor.host.factory import open_target

    with open_target(host_name, inventory) as target:
        target.connect()
        facts = gather(target.host, target.gather_context())
        hosts = {target.host.name: target.host}
        if target.proxmox is not None:
            hosts[target.proxmox.name] = target.proxmox
        engine = make_engine(chosen, hosts, backup_dir=backup_dir, audit_log=audit_log, lock_dir=lock_dir,
                             reboot=reboot)
        return run_engine(engine, facts, apply=apply, as_json=as_json)


def _load_facts(path: str) -> dict:
    """Facts from a snapshot file (gpudoctor snapshot) or a bare facts document."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise InputError(f"cannot read it: {exc.strerror}", path=path) from None
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise InputError(f"not JSON: {getattr(exc, 'msg', exc)}", path=path, line=getattr(exc, "lineno", None)) from None
    schema = str(doc.get("schema", "")) if isinstance(doc, dict) else ""
    if schema.startswith("gpudoctor.snapshot/") and isinstance(doc.get("facts"), dict):
        return doc["facts"]
    if schema.startswith("gpudoctor.facts/"):
        return doc
    raise InputError("not a gpudoctor snapshot or facts document (no \"schema\": \"gpudoctor.snapshot/1\")",
                     path=path, line=1)


def _gather_local(host) -> dict:
    try:
        from gpudoctor.gather import gather
        from gpudoctor.gather.context import GatherContext
    except ImportError:
        raise InputError("this build cannot gather facts yet; pass --facts FILE") from None
    return gather(host, GatherContext(name=socket.gethostname()))
