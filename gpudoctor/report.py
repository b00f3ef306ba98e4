"""Render a Diagnosis for humans (a table grouped by layer, root cause on top) or machines (JSON).

Every value that reaches the terminal goes through gpudoctor.term (the one rendering rule): `esc()` for a value in
rich markup, `line()` for a plain line, `console()` for a Console that escapes what it is given, `Styled` (check's
report, which does not import rich) for styled segments it escapes too. JSON escapes itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpudoctor.diagnose import Diagnosis
from gpudoctor.findings import LAYERS, Status
from gpudoctor.term import console, markup as esc, printable as line  # noqa: F401 - the renderers' rule, re-exported

_STYLE = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red", Status.UNKNOWN: "magenta",
          Status.INFO: "dim"}
_WORD = {Status.OK: "ok", Status.WARN: "WARN", Status.FAIL: "FAIL", Status.UNKNOWN: "UNKNOWN", Status.INFO: "info"}


def to_json(d: Diagnosis) -> str:
    return json.dumps(d.to_json(), indent=2, sort_keys=False)


@dataclass(frozen=True)
class Scope:
    """What a check looked at, as `gpudoctor fix` options: a printed remedy line, copied, acts on the same thing."""

    host: str | None = None  # --host NAME: the inventory host the check reached over SSH
    inventory: str | None = None  # --inventory FILE, when the check was given one
    units: tuple[str, ...] = ()  # --unit U: the systemd units whose device policy was audited
    models: tuple[str, ...] = ()  # --model PATH: model directories given on the command line (or recorded)
    snapshot_of: str | None = None  # check --snapshot: the live host the snapshot was taken of (fix cannot act
    #                                 on a snapshot: the line says to run the command there)


def remedy_command(remedy: str, scope: Scope | None = None) -> str:
    """`gpudoctor fix ... --only REMEDY` in `scope`, every value shell-quoted. The one place a remedy becomes a
    command line."""
    import shlex

    sc = scope or Scope()
    argv = ["gpudoctor", "fix"]
    if sc.inventory:
        argv += ["--inventory", sc.inventory]
    if sc.host:
        argv += ["--host", sc.host]
    for u in sc.units:
        argv += ["--unit", u]
    for m in sc.models:
        argv += ["--model", m]
    argv += ["--only", remedy]
    return " ".join(shlex.quote(a) for a in argv)


def remedy_line(remedy: str, scope: Scope | None = None) -> str:
    """The remedy line of a finding, in the scope it was found in (live host, --host, --unit, --model); for a
    snapshot, how to act on the live host it was taken of."""
    cmd = remedy_command(remedy, scope)
    if scope is not None and scope.snapshot_of:
        return (f"remedy: {cmd}   (run it on {scope.snapshot_of}, the live host of this snapshot: a snapshot "
                f"cannot be fixed)")
    return f"remedy: {cmd}   (dry run: shows the diff; add --apply to make the change)"


def render(d: Diagnosis, out, verbose: bool = False, host: str | None = None, scope: Scope | None = None) -> None:
    """Root cause and chain first, then one table per layer, written to `out` (a term.Styled: no rich, whose import
    alone was a fifth of a check on the H200). `verbose` also lists ok/info evidence. `scope`: what the check looked
    at, so the remedy line acts on the same thing (`host` alone: Scope(host=))."""
    scope = scope or Scope(host=host)

    verdict = d.verdict
    t = d.facts.get("meta", {}).get("timings", {}).get("total")
    took = f" in {t:.2f} s" if isinstance(t, (int, float)) else ""
    out.print(("gpudoctor check", "bold"), f" {line(d.host)}: ", (_WORD[verdict], _STYLE[verdict]),
              f" (exit {d.exit_code}){took}")
    if not getattr(d, "judged", True):
        out.print("no check could judge this host: every finding is unknown or there are none (exit 3)")
    rc = d.root_cause
    if rc:
        out.print()
        outside = ""
        if d.only_layers and rc.layer not in d.only_layers:
            outside = f" (layer {rc.layer}, outside --only {','.join(d.only_layers)})"
        out.print(("Root cause", _STYLE[rc.status]), " ", (line(rc.key), "bold"), f"{line(outside)}: {line(rc.summary)}")
        for e in rc.evidence:
            out.print(f"    evidence: {line(e)}")
        if rc.hint:
            out.print(f"    fix: {line(rc.hint)}")
        if rc.remedy:
            out.print(f"    {line(remedy_line(rc.remedy, scope))}", wrap_lines=False)  # one line to copy
        if len(d.chain) > 1:
            out.print("    chain: " + line(" → ".join(d.chain)))
        if len(d.root_causes) > 1:
            out.print("    also: " + line(", ".join(f.key for f in d.root_causes[1:])))
        others = [f.key for f in d.outside if f is not rc]
        if others:
            out.print("    outside the filter: " + line(", ".join(others)) + " (findings shown are their symptoms)")
    out.print()
    rows = []
    for layer in LAYERS:
        kept = [f for f in d.findings if f.layer == layer]
        if not verbose:
            # keep one ok line per check id so the reader sees what was verified
            seen, shown = set(), []
            for f in kept:
                if f.bad or f.id not in seen:
                    shown.append(f)
                seen.add(f.id)
            kept = shown
        for i, f in enumerate(kept):
            cell = [(line(f.summary), "")]
            if f.blocked_by:
                cell.append((f" (symptom of {line(f.blocked_by)})", "dim"))
            if verbose or f.bad:
                cell += [("\n" + line(e), "dim") for e in f.evidence[:3]]
            rows.append((layer if i == 0 else "", (_WORD[f.status], _STYLE[f.status]), line(f.key), cell))
    findings_table(out, rows)


_GAP = 2  # spaces between columns


def findings_table(out, rows) -> None:
    """The findings table: layer, status, check, finding, one row per finding (a finding's evidence on the lines
    under it). The first three columns are as wide as their longest cell, the finding column takes the rest of the
    width and folds there; where that leaves it narrower than 30 cells, the check column folds too. (rich's Table
    did this by measuring and wrapping every cell twice: 18-27 ms of a 0.25 s check on an H200, 2026-12-04.)
    `rows`: (layer, (word, style), key, [(text, style), ...]) with every value printable (one line each; a cell's
    own newlines start its evidence lines). `out`: a term.Styled."""
    from gpudoctor.term import cell_len, wrap

    heads = ("layer", "status", "check")
    w = [max([len(heads[0])] + [cell_len(r[0]) for r in rows]), max([len(heads[1])] + [len(r[1][0]) for r in rows]),
         max([len(heads[2])] + [cell_len(r[2]) for r in rows])]
    fw = out.width - sum(w) - 3 * _GAP
    if fw < 30:
        w[2] = max(len(heads[2]), w[2] - (30 - fw))
        fw = max(out.width - sum(w) - 3 * _GAP, 10)
    gap = " " * _GAP
    text = [out.styled([(f"{heads[0]:<{w[0]}}{gap}{heads[1]:<{w[1]}}{gap}{heads[2]:<{w[2]}}{gap}finding", "bold")])]
    for layer, (word, style), key, cell in rows:
        checks = wrap([(key, "")], w[2])
        lines = wrap(cell, fw)
        for i in range(max(len(checks), len(lines))):
            c = "".join(t for t, _ in checks[i]) if i < len(checks) else ""
            segs = [(f"{layer if i == 0 else '':<{w[0]}}{gap}", ""),
                    (f"{word:<{w[1]}}", style) if i == 0 else (" " * w[1], ""), (gap + c, "")]
            if i < len(lines):
                segs.append((" " * (w[2] - cell_len(c)) + gap, ""))
                segs += lines[i]
            text.append(out.styled(segs))
    out.write("\n".join(text) + "\n")


def _each_line_printable(fn):
    """The rendering rule for renderers that return lines: each one reaches the terminal as exactly one line, with
    every control character of its values (a newline or ESC in a host name, a diff, a reason) escaped."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs) -> list[str]:
        return [line(x) for x in fn(*args, **kwargs)]

    return wrapper


# --- fix (`gpudoctor fix`, `gpudoctor lxc fix`) -----------------------------------------------------------------

@_each_line_printable
def fix_plan_lines(run) -> list[str]:
    """The plan: each change (diff, commands, risk, restart), each refusal, and the bad findings left alone."""
    plan, lines = run.plan, []
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
        lines.append("nothing gpudoctor can change: a human must act (below)" if run.human else "nothing to fix")
    if plan.changes and not run.apply:
        lines.append("dry run: nothing was changed; re-run with --apply to make these changes")
    if run.before is not None:
        lines.extend(_unremedied_lines(run))
    return lines


def _unremedied_lines(run) -> list[str]:
    """The bad findings this run does not act on, and why: no remedy exists, or --only left it out."""
    from gpudoctor import remedies

    d, lines = run.before, []
    for rid in sorted({f.remedy for f in d.findings if f.bad and f.remedy and f.remedy not in remedies.REMEDIES}):
        lines.append(f"NO REMEDY  {rid} is named by a check but not available in this build")
    left_out = sorted({f.remedy for f in d.findings if f.bad and f.remedy in remedies.REMEDIES
                       and f.remedy not in run.chosen})
    if left_out:
        lines.append(f"left out by --only: {', '.join(left_out)}")
    human = [f for f in d.findings if f.bad and not f.blocked_by and not f.remedy]
    if human:
        lines.append(f"no remedy: {len(human)} other root cause(s) need a human (gpudoctor check): "
                     + ", ".join(f.key for f in human[:6]) + (" ..." if len(human) > 6 else ""))
    for f in run.human:
        if f.remedy:
            lines.append(f"NOT FIXED  {f.key}: {f.remedy} planned no change; a human must act: {f.summary}")
    return lines


@_each_line_printable
def fix_result_lines(run) -> list[str]:
    """What --apply did, then the re-checked verdict."""
    lines = []
    for o in run.outcomes:
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
    before, after = run.before, run.after
    if after is not None:
        if run.outcomes:
            lines.append(f"NEW VERDICT {after.host}: {after.verdict.value.upper()} (exit {after.exit_code}; was "
                         f"{before.verdict.value.upper()})")
        else:
            lines.append(f"VERDICT {after.host}: {after.verdict.value.upper()} (exit {after.exit_code}; nothing was "
                         f"changed)")
        rc = after.root_cause
        if rc:
            lines.append(f"      root cause: {rc.key}: {rc.summary}")
        still = [f for f in after.findings if f.bad]
        if still:
            lines.append(f"      still bad: {len(still)} finding(s): " + ", ".join(f.key for f in still[:8])
                         + (" ..." if len(still) > 8 else ""))
    elif run.apply and run.outcomes and before is not None:
        lines.append("planned from a snapshot: nothing was re-checked; run `gpudoctor check` on the host")
    return lines


def fix_json(run) -> str:
    """gpudoctor.fix/1: the plan and outcomes; with a diagnosis, the verdict before and after."""
    doc = {"schema": "gpudoctor.fix/1", "apply": run.apply, "plan": run.plan.to_json(),
           "outcomes": [o.to_json() for o in run.outcomes], "exit_code": run.exit_code}
    if run.before is not None:
        after = run.after
        doc.update(host=run.before.host,
                   before={"verdict": run.before.verdict.value, "exit_code": run.before.exit_code,
                           "root_cause": run.before.root_cause.key if run.before.root_cause else None,
                           "bad": {f.key: f.status.value for f in run.before.findings if f.bad}},
                   human=[f.key for f in run.human],
                   after=None if after is None else {
                       "verdict": after.verdict.value, "exit_code": after.exit_code,
                       "root_cause": after.root_cause.to_json() if after.root_cause else None,
                       "still_bad": [f.key for f in after.findings if f.bad]})
    return json.dumps(doc, indent=2, sort_keys=True)


# --- the daemon (`gpudoctor daemon --once`) ---------------------------------------------------------------------

@_each_line_printable
def daemon_cycle_lines(found: dict) -> list[str]:
    """One cycle of the daemon, per host: its verdict, what it found (root causes with evidence), what it did."""
    lines = []
    for name, r in found.items():
        lines.append(f"{name}: {r['verdict'].upper()}" + (f": {r['error']}" if r.get("error") else ""))
        for f in r.get("root_causes") or []:
            lines.append(f"  {_WORD[f.status]:7} {f.key}: {f.summary}")
            for e in f.evidence[:3]:
                lines.append(f"          {e}")
            if f.hint:
                lines.append(f"          fix: {f.hint}")
        for remedy, what in r.get("actions") or []:
            lines.append(f"  remedy {remedy}: {what}")
        if r.get("verification"):
            lines.append(f"  verification {r['verification']}")
        lad = r.get("ladder")
        if lad is not None:
            lines.append(f"  recovery: {lad.state}" + (f" ({lad.reason})" if lad.reason else ""))
    return lines


# --- `gpudoctor lxc audit` --------------------------------------------------------------------------------------

_ORDER = {Status.FAIL: 0, Status.UNKNOWN: 1, Status.WARN: 2, Status.OK: 3, Status.INFO: 4}


def lxc_audit_lines(d: Diagnosis, inp) -> list[str]:
    """The container's verdict, then every boundary finding worst first, with evidence and fix for the bad ones."""
    lines = [f"{inp.label} ({inp.cfg.path}): {d.verdict.value.upper()}"]
    for f in sorted(d.findings, key=lambda f: _ORDER[f.status]):
        lines.append(f"{f.status.value.upper():7} {f.id}  {f.summary}")
        if f.bad:
            lines.extend(f"        {e}" for e in f.evidence)
            if f.hint:
                lines.append(f"        fix: {f.hint}")
    return lines


def lxc_audit_json(d: Diagnosis, inp) -> str:
    return json.dumps({"schema": "gpudoctor.lxc-audit/1", "config": inp.cfg.path, "vmid": inp.vmid,
                       "verdict": d.verdict.value, "exit_code": d.exit_code,
                       "findings": [f.to_json() for f in d.findings]}, indent=2, sort_keys=True)


# --- fleet (`gpudoctor check --all`) and gate lines -------------------------------------------------------------

def fleet_table(result, console) -> None:
    """A summary table, worst hosts first, then the counts (rich console)."""
    from rich.table import Table

    from gpudoctor.fleet import RANK

    style = {"ok": "green", "warn": "yellow", "fail": "red", "unknown": "magenta", "unreachable": "magenta",
             "error": "magenta"}
    table = Table(title=f"{len(result.records)} hosts, {result.wall_s:.2f} s at parallel {result.parallel}",
                  show_lines=False)
    table.add_column("host")
    table.add_column("status")
    table.add_column("root cause / error", overflow="fold")
    table.add_column("s", justify="right")
    for r in sorted(result.records, key=lambda r: (-RANK[r.status], r.host)):
        table.add_row(esc(r.host), f"[{style[r.status]}]{r.status}[/]", esc(r.headline), f"{r.duration_s:.2f}")
    console.print(table)
    counts = ", ".join(f"{n} {s}" for s, n in result.counts().items() if n)
    console.print(f"summary: {counts}")


def gate_lines(result, action=None, verdict=None) -> list[tuple[str, bool]]:
    """`gpudoctor gate`: only what blocks, one line each; (line, to_stderr). A ready ladder is one stderr line."""
    lines = []
    if result.error:
        lines.append((f"BLOCK {result.host}: could not check: {result.error}", False))
    lines += [(f"BLOCK {b.line()}", False) for b in result.blockers]
    if verdict is not None and verdict.ready:
        lines.append((f"recovery: {verdict.host} ready (verified; ladder moved by the {verdict.moved_by})", True))
    if action is not None and action.action != "none":
        lines.append((f"slurm: {action.detail}", action.action != "failed"))
    return [(line(text), err) for text, err in lines]  # the rendering rule: one line each, input escaped
