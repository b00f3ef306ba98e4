"""`gpudoctor fix`: plan guarded fixes for failing checks (dry run), apply them with --apply. Also the renderers
that `gpudoctor lxc fix` shares."""

from __future__ import annotations

import json
import socket
import sys

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
        for why in (c.data or {}).get("skipped") or []:
            lines.append(f"      not touching: {why}")
        for cmd in (c.data or {}).get("preview") or []:
            lines.append(f"      preview (writes nothing; --apply runs it first): {cmd}")
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


GPUDOCTOR_FIX_EXIT_DOC = """\b
Exit codes, dry run (like `terraform plan -detailed-exitcode`, in gpudoctor's Nagios numbering):
  0  nothing to change: no failing or warning finding has a remedy that would act
  1  changes are planned (drift gpudoctor can repair): re-run with --apply to make them
  2  a remedy refused (its reason is printed): a human has to act
  3  bad input (flag, inventory, snapshot), or the host could not be reached
\b
Exit codes with --apply: the verdict of `gpudoctor check` re-run after the changes:
  0 ok, 1 warning (e.g. a container restart still pending), 2 failure (also whenever a change failed or was rolled
  back), 3 unknown or bad input. With --facts (a snapshot, nothing to re-check): 0 applied and verified, 1 a restart
  pending, 2 a change failed, refused or was rolled back."""

# What --allow can permit: remedies that would otherwise refuse a less durable or riskier way.
ALLOWS = {"nvidia-smi-pm": "driver.persistence may run `nvidia-smi -pm 1` (resets at reboot) where "
                           "nvidia-persistenced cannot be enabled"}
MRRS_SIZES = ("128", "256", "512", "1024", "2048", "4096")


def select_remedies(only) -> list:
    """Fresh remedies in registry order (the safe apply order); --only takes ids or fnmatch patterns."""
    import fnmatch

    from gpudoctor import remedies

    if not only:
        return remedies.all_remedies()
    ids = list(remedies.REMEDIES)
    unknown = [o for o in only if not any(fnmatch.fnmatchcase(i, o) for i in ids)]
    if unknown:
        raise InputError(f"unknown remedy {', '.join(unknown)}; known: {', '.join(ids)}")
    return [remedies.get(i) for i in ids if any(fnmatch.fnmatchcase(i, o) for o in only)]


def _model_sources(values) -> dict:
    out = {}
    for v in values:
        dst, sep, src = v.partition("=")
        if not sep:
            dst, src = "*", v
        if not src.startswith("/") or (dst != "*" and not dst.startswith("/")):
            raise InputError(f"--model-source {v!r}: give SRC or DST=SRC, absolute paths")
        out[dst] = src
    return out


def _open_target(host_name, inventory, models, timeout, mrrs):
    """(Host, {name: Host}, GatherContext) for this machine or an inventory host (and its Proxmox node)."""
    from gpudoctor.gather.context import GatherContext, policy_from_inventory

    if host_name and host_name not in ("local", "localhost"):
        from gpudoctor.host.factory import open_target
        from gpudoctor.inventory import load_inventory

        inv = load_inventory(inventory)
        t = open_target(host_name, inv)
        ctx = t.gather_context(policy=policy_from_inventory(inv.policy, mrrs=mrrs), timeout=timeout)
        hosts = {t.name: t.host}
        if t.proxmox is not None:
            hosts[t.proxmox.name] = t.proxmox
        host = t.host
    else:
        from gpudoctor.host.local import LocalHost

        inv_policy = None
        if inventory:
            from gpudoctor.inventory import load_inventory

            inv_policy = load_inventory(inventory).policy
        host = LocalHost()
        name = socket.gethostname()
        ctx = GatherContext(name=name, policy=policy_from_inventory(inv_policy, mrrs=mrrs), timeout=timeout)
        hosts = {"localhost": host, name: host}
    if models:
        ctx.model_paths = list(models)
    return host, hosts, ctx


def _close(hosts: dict) -> None:
    for h in {id(h): h for h in hosts.values()}.values():
        try:
            h.close()
        except Exception:  # noqa: BLE001 - closing must not hide the result
            pass


def _confirm(n: int, names: list[str], yes: bool) -> bool:
    if yes:
        return True
    if not sys.stdin.isatty():
        raise InputError("--apply without --yes asks for confirmation, but stdin is not a terminal: add --yes to "
                         "apply unattended (nothing was changed)")
    return click.confirm(f"Apply {n} change(s) to {', '.join(names)}?", default=False, err=True)  # stdout: --json


def render_unremedied(d, plan, chosen_ids) -> list[str]:
    """The bad findings this run does not act on, and why: no remedy exists, or --only left it out."""
    from gpudoctor import remedies

    lines = []
    unknown = sorted({f.remedy for f in d.findings if f.bad and f.remedy and f.remedy not in remedies.REMEDIES})
    for rid in unknown:
        lines.append(f"NO REMEDY  {rid} is named by a check but not available in this build")
    left_out = sorted({f.remedy for f in d.findings if f.bad and f.remedy in remedies.REMEDIES
                       and f.remedy not in chosen_ids})
    if left_out:
        lines.append(f"left out by --only: {', '.join(left_out)}")
    human = [f for f in d.findings if f.bad and not f.blocked_by and not f.remedy]
    if human:
        lines.append(f"no remedy: {len(human)} other root cause(s) need a human (gpudoctor check): "
                     + ", ".join(f.key for f in human[:6]) + (" ..." if len(human) > 6 else ""))
    return lines


def render_verdict(before, after, *, changed: bool) -> list[str]:
    if changed:
        lines = [f"NEW VERDICT {after.host}: {after.verdict.value.upper()} (exit {after.exit_code}; was "
                 f"{before.verdict.value.upper()})"]
    else:
        lines = [f"VERDICT {after.host}: {after.verdict.value.upper()} (exit {after.exit_code}; nothing was changed)"]
    rc = after.root_cause
    if rc:
        lines.append(f"      root cause: {rc.key}: {rc.summary}")
    still = [f for f in after.findings if f.bad]
    if still:
        lines.append(f"      still bad: {len(still)} finding(s): " + ", ".join(f.key for f in still[:8])
                     + (" ..." if len(still) > 8 else ""))
    return lines


@click.command("fix", epilog=GPUDOCTOR_FIX_EXIT_DOC)
@click.option("--host", "host_name", metavar="NAME",
              help="Inventory host to fix over SSH (an LXC guest's Proxmox node too). Default: this machine.")
@click.option("--inventory", type=click.Path(dir_okay=False), envvar="GPUDOCTOR_INVENTORY",
              help="Inventory file (default: ./inventory.yaml, then ~/.config/gpudoctor/inventory.yaml).")
@click.option("--facts", "facts_path", metavar="SNAPSHOT", type=click.Path(dir_okay=False),
              help="Plan from a snapshot (gpudoctor snapshot) instead of gathering; --apply then acts on this "
                   "machine or --host.")
@click.option("--only", multiple=True, metavar="ID",
              help="Only this remedy (an id from the list above, or a pattern like 'devices.*'; repeatable).")
@click.option("--yes", "-y", is_flag=True, help="With --apply: do not ask for confirmation (needed without a TTY).")
@click.option("--allow", multiple=True, type=click.Choice(sorted(ALLOWS)),
              help="Permit a fallback a remedy refuses by default: nvidia-smi-pm = set persistence with "
                   "`nvidia-smi -pm 1` (resets at reboot) when nvidia-persistenced cannot be enabled.")
@click.option("--model", "models", multiple=True, metavar="PATH",
              help="Model directory that must be complete (repeatable; default: the inventory's model_paths).")
@click.option("--model-source", "model_sources", multiple=True, metavar="[DST=]SRC",
              help="Where model.stage copies a model from (default: the source its last stage recorded).")
@click.option("--mrrs", type=click.Choice(MRRS_SIZES), help="PCIe MaxReadReq policy in bytes for fabric.pcie.mrrs "
              "(default: the inventory's policy.checks.fabric.pcie.mrrs.expect; without one, MRRS is only reported).")
@click.option("--timeout", type=click.FloatRange(0.1, 600), default=10.0, show_default=True,
              help="Deadline in seconds for each command or read while gathering and changing.")
@engine_options
def fix(host_name, inventory, facts_path, only, yes, allow, models, model_sources, mrrs, timeout, apply, reboot,
        backup_dir, audit_log, lock_dir, as_json):
    """Plan guarded fixes for what the checks found; change nothing unless --apply.

    Gathers the host's facts (as `gpudoctor check` does), asks every remedy for a plan and shows each change with its
    diff, commands, risk and whether a restart is needed — and every refusal with its reason. With --apply (and a
    confirmation, or --yes) each change is made under a per-host lock in a safe order (host-side config, device
    nodes, modes, persistence, sysctl, PCIe, model), verified by re-running its check, rolled back if that fails and
    written to the audit log; then the whole check runs again and its verdict is printed and returned.

    \b
    Remedies: lxc.cgroup_allow, devices.node.create, devices.node.mode, driver.persistence,
              fabric.numa.balancing, fabric.pcie.mrrs (only with a policy), model.stage,
              workload.bench.orphan (stops only servers gpudoctor's bench left running)
    \b
    Examples:
      gpudoctor fix                               dry run on this machine: plan and diffs
      gpudoctor fix --apply                       make the changes (asks first on a terminal)
      gpudoctor fix --host ct200 --apply --yes    an inventory host; its Proxmox node for the LXC config
      gpudoctor fix --only 'devices.*' --json     one subsystem, machine-readable
      gpudoctor fix --allow nvidia-smi-pm --apply persistence without nvidia-persistenced
      gpudoctor fix --model /dev/shm/Qwen3 --model-source /data/models/Qwen3 --apply
      gpudoctor fix --facts snap.json             plan from a saved snapshot
    """
    from gpudoctor.diagnose import diagnose
    from gpudoctor.remedy import AuditLog, Engine, RemedyContext

    if reboot and not apply:
        raise click.UsageError("--reboot needs --apply")
    chosen = select_remedies(only)
    options = {"allow": list(allow), "model_sources": _model_sources(model_sources)}
    if facts_path:
        facts = _load_facts(facts_path)
        if host_name:
            host, hosts, _ = _open_target(host_name, inventory, (), timeout, None)
        else:
            from gpudoctor.host.local import LocalHost

            host = LocalHost()
            hosts = {"localhost": host}  # a snapshot names its host: applying to this machine takes --host
        ctx = None
    else:
        host, hosts, ctx = _open_target(host_name, inventory, models, timeout, int(mrrs) if mrrs else None)
    try:
        if host_name and host_name not in ("local", "localhost"):
            from gpudoctor.host.factory import connect_all

            # both connections first: an unknown or changed host key refuses the run before anything runs anywhere
            connect_all(host, next((h for h in hosts.values() if h is not host), None))
        if ctx is not None:
            from gpudoctor.gather import gather

            facts = gather(host, ctx)
            b = facts.get("boundary") or {}
            if b.get("proxmox") and ctx.proxmox is not None:
                hosts.setdefault(b["proxmox"], ctx.proxmox)
        before = diagnose(facts)
        rctx = RemedyContext(hosts=hosts, backup_dir=backup_dir, reboot=reboot, timeout=timeout, options=options)
        engine = Engine(chosen, rctx, audit_log=AuditLog(audit_log), lock_dir=lock_dir)
        plan = engine.plan(facts)
        if not as_json:
            click.echo(render_plan(plan, apply=apply))
            for ln in render_unremedied(before, plan, {r.id for r in chosen}):
                click.echo(ln)
        outcomes, after = [], None
        if apply and plan.changes:
            missing = sorted({c.host for c in plan.changes if c.host not in hosts})
            if missing:
                raise InputError(f"the plan changes {', '.join(missing)}, which this run cannot reach (a snapshot of "
                                 f"another machine?): re-run with --host {missing[0]}; nothing was changed")
            if not _confirm(len(plan.changes), sorted({c.host for c in plan.changes}), yes):
                click.echo("nothing was changed", err=as_json)
                raise SystemExit(EXIT_WARN)
            outcomes = engine.apply(plan)
            if ctx is not None:
                from gpudoctor.gather import gather

                after = diagnose(gather(host, ctx))
        elif apply and ctx is not None:
            after = before  # nothing to change: the verdict stands
        code = fix_exit_code(plan, outcomes, after, apply=apply)
        if as_json:
            click.echo(json.dumps({
                "schema": "gpudoctor.fix/1", "host": before.host, "apply": apply,
                "before": {"verdict": before.verdict.value, "exit_code": before.exit_code},
                "plan": plan.to_json(), "outcomes": [o.to_json() for o in outcomes],
                "after": None if after is None else {
                    "verdict": after.verdict.value, "exit_code": after.exit_code,
                    "root_cause": after.root_cause.to_json() if after.root_cause else None,
                    "still_bad": [f.key for f in after.findings if f.bad]},
                "exit_code": code}, indent=2, sort_keys=True))
        else:
            if outcomes:
                click.echo(render_outcomes(outcomes))
            if after is not None:
                click.echo("\n".join(render_verdict(before, after, changed=bool(outcomes))))
            elif apply and outcomes:
                click.echo("planned from a snapshot: nothing was re-checked; run `gpudoctor check` on the host")
        raise SystemExit(code)
    finally:
        _close(hosts)


def fix_exit_code(plan, outcomes, after, *, apply: bool) -> int:
    """Dry run: 0 nothing to do, 1 changes planned, 2 a refusal. --apply: the re-checked verdict (at least 2 when a
    change failed or was rolled back); --apply from a snapshot (no re-check): the outcomes' code."""
    if not apply or after is None:
        return exit_code_for(plan, outcomes, apply=apply)
    code = after.exit_code
    if any(not o.ok for o in outcomes) and code < EXIT_FAIL:
        code = EXIT_FAIL
    return code


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
    if schema.startswith("gpudoctor.snapshot/") and isinstance(doc.get("transcript"), dict):
        from gpudoctor import snapshot

        return snapshot.facts_of(doc)  # re-gathered from its raw reads through today's code, as `check --snapshot`
    if schema.startswith("gpudoctor.snapshot/") and isinstance(doc.get("facts"), dict):
        return doc["facts"]
    if schema.startswith("gpudoctor.facts/"):
        return doc
    raise InputError("not a gpudoctor snapshot or facts document (no \"schema\": \"gpudoctor.snapshot/1\")",
                     path=path, line=1)
