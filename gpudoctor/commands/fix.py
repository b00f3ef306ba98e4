"""`gpudoctor fix`: plan guarded fixes for failing checks (dry run), apply them with --apply; the options and the
flow wrapper that `gpudoctor lxc fix` shares. The flow is gpudoctor.remedy.fix, the text gpudoctor.report."""

from __future__ import annotations

import sys

import click

from gpudoctor.conventions import alias
from gpudoctor.errors import InputError
from gpudoctor.options import seconds

FIX_EXIT_DOC = """\b
Exit codes:
  0  nothing to do, or every change applied and verified
  1  changes planned but not applied (dry run), or a reboot is still pending
  2  a remedy refused, failed, or was rolled back after a failed verification; or the lock is held
  3  bad input (unreadable or malformed file, bad flag)"""


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


def run_fix(target, remedies, *, apply, as_json, yes, backup_dir, audit_log, lock_dir, reboot, timeout=10.0,
            options=None, facts=None) -> int:
    """The remedy engine's fix flow on a Target, rendered; returns the exit code (shared by `fix` and `lxc fix`)."""
    from gpudoctor import report
    from gpudoctor.remedy import AuditLog, RemedyContext
    from gpudoctor.remedy import fix as fix_flow

    rctx = RemedyContext(backup_dir=backup_dir, reboot=reboot, timeout=timeout, options=options or {})
    out = None if as_json else report.writer()
    show = None if as_json else (lambda run: report.emit_fix_lines(out, report.fix_plan_lines(run)))
    run = fix_flow(target, remedies, rctx, apply=apply, facts=facts, on_plan=show, audit_log=AuditLog(audit_log),
                   lock_dir=lock_dir, confirm=lambda plan: _confirm(plan, yes))
    if run.declined:
        click.echo("nothing was changed", err=as_json)
    elif as_json:
        click.echo(report.fix_json(run))
    else:
        report.emit_fix_lines(out, report.fix_result_lines(run))
    return run.exit_code


GPUDOCTOR_FIX_EXIT_DOC = """\b
Exit codes, dry run (like `terraform plan -detailed-exitcode`, in gpudoctor's Nagios numbering):
  0  nothing to change: no failing or warning finding has a remedy that would act
  1  changes are planned (drift gpudoctor can repair): re-run with --apply to make them
  2  a remedy refused, or the host fails and nothing can be changed (reasons printed): a human must act
  3  bad input (flag, inventory, snapshot), or the host could not be reached

\b
Exit codes with --apply: the verdict of `gpudoctor check` re-run after the changes:
  0 ok, 1 warning (e.g. a container restart still pending), 2 failure (also whenever a change failed or was rolled
  back), 3 unknown or bad input. --apply with --snapshot is refused (exit 3): a replay changes nothing."""

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


def _confirm(plan, yes: bool) -> bool:
    from gpudoctor.conventions import confirm_change

    names = sorted({c.host for c in plan.changes})
    return confirm_change(f"Apply {len(plan.changes)} change(s) to {', '.join(names)}?", yes)


@click.command("fix", epilog=GPUDOCTOR_FIX_EXIT_DOC)
@click.option("--host", "host_name", metavar="NAME",
              help="Inventory host to fix over SSH (an LXC guest's Proxmox node too). Default: this machine.")
@click.option("--inventory", type=click.Path(dir_okay=False), envvar="GPUDOCTOR_INVENTORY",
              help="Inventory file (default: ./inventory.yaml, then ~/.config/gpudoctor/inventory.yaml).")
@alias("--snapshot", "--facts", "facts_path", hidden_aliases=["--facts"], metavar="FILE",
       type=click.Path(dir_okay=False), help="Plan from a snapshot (gpudoctor snapshot) instead of gathering: a dry "
                                             "run only (a replay changes nothing; --apply with it is refused).")
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
@click.option("--timeout", type=seconds(0.1, 600), default=10.0, show_default=True,
              help="Deadline in seconds for each command or read while gathering and changing.")
@click.option("--unit", "units", multiple=True, metavar="UNIT",
              help="Also audit (and fix: systemd.device_allow) this systemd unit's device policy (repeatable).")
@engine_options
def fix(host_name, inventory, facts_path, only, yes, allow, models, model_sources, mrrs, timeout, apply, reboot,
        backup_dir, audit_log, lock_dir, as_json, units=()):
    """Plan guarded fixes for what the checks found; change nothing unless --apply.

    Gathers the host's facts (as `gpudoctor check` does), asks every remedy for a plan and shows each change with its
    diff, commands, risk and whether a restart is needed — and every refusal with its reason. With --apply (and a
    confirmation, or --yes) each change is made under a per-host lock in a safe order (host-side config, device
    nodes, modes, persistence, sysctl, PCIe, model), verified by re-running its check, rolled back if that fails and
    written to the audit log; then the whole check runs again and its verdict is printed and returned.

    \b
    Remedies: lxc.cgroup_allow, cdi.spec, systemd.device_allow (--unit),
              devices.node.create, devices.node.mode, driver.persistence,
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
      gpudoctor fix --snapshot snap.json          plan from a saved snapshot
    """
    from gpudoctor.target import open_target

    if reboot and not apply:
        raise click.UsageError("--reboot needs --apply")
    chosen = select_remedies(only)
    options = {"allow": list(allow), "model_sources": _model_sources(model_sources)}
    # a snapshot names its host: its plan applies to this machine only as "localhost", elsewhere with --host
    with open_target(host_name or ("local" if facts_path else None), inventory,
                     snapshot=_load_facts(facts_path, apply) if facts_path else None,
                     models=() if facts_path else models,
                     timeout=timeout, units=units,
                     mrrs=int(mrrs) if mrrs else None) as target:
        from gpudoctor.commands import say_inventory

        say_inventory(target)
        code = run_fix(target, chosen, apply=apply, as_json=as_json, yes=yes, backup_dir=backup_dir,
                       audit_log=audit_log, lock_dir=lock_dir, reboot=reboot, timeout=timeout, options=options)
    raise SystemExit(code)


def _load_facts(path: str, apply: bool = False) -> dict:
    """A snapshot document from a file that holds one or a bare facts document, validated before anything plans
    (fix plans from a part of the facts too, e.g. a boundary-only document). With --apply as root it must be root's
    own before it is read at all (the apply itself is then refused: a replay cannot act, gpudoctor.target.live)."""
    from gpudoctor import snapshot

    return snapshot.load_document(path, require=(), obeyed=apply)  # as root, applied facts are root's (#40, #47)
