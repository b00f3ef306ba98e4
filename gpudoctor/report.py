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


LIST_HINT = "-a lists them"  # how a reader gets every subject of a healthy row (the CLI's verbose flag)
EVIDENCE_SHOWN = 3  # evidence lines a finding shows by default; the rest are counted: "+N more evidence lines (HINT)"
DAEMON_LIST_HINT = "`gpudoctor check -a` lists them"  # the daemon has no verbose flag of its own


def evidence_lines(f, limit: int | None, hint: str) -> list[str]:
    """A finding's evidence, printable: all of it (`limit` None), or the first `limit` lines and one that counts the
    rest and says how to see them, never a silent cut."""
    ev = [line(e) for e in f.evidence]
    if limit is None or len(ev) <= limit:
        return ev
    return ev[:limit] + [f"+{len(ev) - limit} more evidence lines ({hint})"]
# Checks whose findings are figures, not subjects: each is its own row by default (H2D, D2H, device copy, GEMM, P2P,
# NCCL all-reduce), never counted into one.
FIGURES = ("fabric.deep.figure", "fabric.nccl.allreduce")


def writer(*, stderr: bool = False, color: bool | None = None, width: int | None = None):
    """The one writer of every findings command (check, gate, fix, daemon --once, lxc audit): a term.Styled. color
    and width: the CLI's settings (None: decided by the stream, docs/cli.md (Rendering))."""
    from gpudoctor.term import Styled

    return Styled(stderr=stderr, color=color, width=width)


def status_word(status: Status) -> tuple[str, str]:
    """A status as the word every command prints and its style: FAIL in bold red wherever it appears."""
    return _WORD[status], _STYLE[status]


def duration_words(facts: dict) -> str:
    """" in 0.17 s" of a live check; for a replayed snapshot both: " (recorded in 9.61 s; replayed in 0.20 s)"."""
    meta = facts.get("meta") or {}
    t = (meta.get("timings") or {}).get("total")
    if meta.get("replayed_from") is not None:
        t = (meta.get("recorded_timings") or {}).get("total")
        r = (meta.get("replay_timings") or {}).get("total")
        parts = ([f"recorded in {t:.2f} s"] if isinstance(t, (int, float)) else []) + \
                ([f"replayed in {r:.2f} s"] if isinstance(r, (int, float)) else [])
        return f" ({'; '.join(parts)})" if parts else ""
    return f" in {t:.2f} s" if isinstance(t, (int, float)) else ""


def render(d: Diagnosis, out, verbose: bool = False, host: str | None = None, scope: Scope | None = None, *,
           quiet: bool = False, triage=None, list_hint: str = LIST_HINT) -> None:
    """Root cause and chain first, then the findings table, written to `out` (a term.Styled: no rich, whose import
    alone was a fifth of a check on the H200). `verbose` lists every subject of a healthy row with its evidence;
    `quiet` shows only what is not ok, plus the verdict. `scope`: what the check looked at, so the remedy line acts
    on the same thing (`host` alone: Scope(host=)). `triage`: what `gpudoctor fix` would do about each root cause
    (gpudoctor.remedy.triage): the remedy line is printed only where fix would act, else why it cannot."""
    scope = scope or Scope(host=host)

    verdict = d.verdict
    took = duration_words(d.facts)
    out.print(("gpudoctor check", "bold"), f" {line(d.host)}: ", status_word(verdict), f" (exit {d.exit_code}){took}")
    if not getattr(d, "judged", True):
        out.print("no check could judge this host: every finding is unknown or there are none (exit 3)")
    rc = d.root_cause
    if rc:
        out.print()
        outside = ""
        if d.only_layers and rc.layer not in d.only_layers:
            outside = f" (layer {rc.layer}, outside --only {','.join(d.only_layers)})"
        cause_block(out, rc, ("Root cause", _STYLE[rc.status]), note=outside, evidence=None)
        if rc.remedy:
            remedy_block(out, rc, scope, triage)
        if len(d.chain) > 1:
            out.print("    chain: " + line(" → ".join(d.chain)))
        if len(d.root_causes) > 1:
            others = d.root_causes[1:]
            out.print(f"    also: {len(others)} other root cause(s): " + line(", ".join(f.key for f in others)))
        if triage is not None and triage.human:
            out.print(f"    {triage.human_line()}")
        others = [f.key for f in d.outside if f is not rc]
        if others:
            out.print("    outside the filter: " + line(", ".join(others)) + " (findings shown are their symptoms)")
    rows = finding_rows(d.findings, verbose=verbose, quiet=quiet, list_hint=list_hint)
    if rows:
        out.print()
        findings_table(out, rows)


def cause_block(out, f, head, *, lead: str = "", indent: str = "    ", note: str = "",
                evidence: int | None = EVIDENCE_SHOWN, list_hint: str = LIST_HINT) -> None:
    """One finding as a block: `head` (a word and its style) KEY: summary, then its evidence (`evidence` lines, the
    rest counted; None: all) and fix, indented. The root cause of `check` and of `lxc audit`, each root cause of
    `daemon --once`."""
    out.print(lead, head, " ", (line(f.key), "bold"), f"{line(note)}: {line(f.summary)}")
    for e in evidence_lines(f, evidence, list_hint):
        out.print(f"{indent}evidence: {e}")
    if f.hint:
        out.print(f"{indent}fix: {line(f.hint)}")


def remedy_block(out, f, scope: Scope, triage=None) -> None:
    """The remedy line of a root cause: the command fix would run (one line to copy), or why fix cannot act."""
    why = triage.refusal_for(f) if triage is not None else None
    if why is None:
        out.print(f"    {line(remedy_line(f.remedy, scope))}", wrap_lines=False)  # one line to copy
    else:
        out.print(f"    no remedy here: {line(why)}")


def _noun(subjects: list[str]) -> str:
    """What a healthy row's subjects are, in a word: "5 nodes", "8 GPUs", else "subjects"."""
    if all(s.startswith("/dev/") for s in subjects):
        return "nodes"
    if all(s.startswith("GPU ") for s in subjects):
        return "GPUs"
    return "subjects"


def _common(group) -> str | None:
    """What every finding of a healthy row says once its subject is taken out ("mode 0666"), or None where they
    differ (each names its own numbers)."""
    texts = {(g.summary.replace(g.subject, "", 1) if g.subject else g.summary).strip(" :") for g in group}
    return texts.pop() if len(texts) == 1 else None


def finding_rows(findings, *, verbose: bool = False, quiet: bool = False, list_hint: str = LIST_HINT) -> list:
    """The rows of the findings table, by layer. Every finding that is not ok is its own row, with its evidence; a
    healthy check (ok or info) is one row that says how many subjects it covers ("7 nodes: /dev/nvidia0, …", and what
    they all say where it is the same), or with `verbose` one row per subject with its evidence; information that
    differs by subject (a value per GPU) and the deep tier's figures (FIGURES) are each a row. `quiet`: only what is
    not ok."""
    rows = []
    for layer in LAYERS:
        kept = [f for f in findings if f.layer == layer and (f.bad or not quiet)]
        shown: list = []  # a finding, or a list of healthy findings of one check and status
        groups: dict = {}
        for f in kept:
            if verbose or f.bad or f.id in FIGURES or f.subject is None:
                shown.append(f)
                continue
            k = (f.id, f.status)
            if k not in groups:
                groups[k] = []
                shown.append(groups[k])
            groups[k].append(f)
        shown = [x for item in shown for x in (
            item if isinstance(item, list) and item[0].status == Status.INFO and _common(item) is None else [item])]
        for i, item in enumerate(shown):
            if isinstance(item, list) and len(item) == 1:
                item = item[0]
            if isinstance(item, list):
                f, subjects, same = item[0], [g.subject for g in item], _common(item)
                head = ", ".join(line(s) for s in subjects[:3])
                cell = [(f"{len(item)} {_noun(subjects)}: {head}" + (", …" if len(item) > 3 else "")
                         + (f" — {line(same)}" if same else "") + (f" ({list_hint})" if len(item) > 3 else ""), "")]
                key = line(f.id)
            else:
                f = item
                cell = [(line(f.summary), "")]
                if f.blocked_by:
                    cell.append((f" (symptom of {line(f.blocked_by)})", "dim"))
                if verbose or f.bad:  # verbose: every evidence line; else the first few and a count of the rest
                    cell += [("\n" + e, "dim") for e in evidence_lines(f, None if verbose else EVIDENCE_SHOWN,
                                                                        list_hint)]
                key = line(f.key)
            rows.append((layer if i == 0 else "", status_word(f.status), key, cell))
    return rows


_GAP = 2  # spaces between columns


def findings_table(out, rows, heads=("layer", "status", "check")) -> None:
    """The findings table: layer, status, check, finding, one row per finding (a finding's evidence on the lines
    under it). The first three columns are as wide as their longest cell, the finding column takes the rest of a
    terminal's width and folds there, at spaces only; where that leaves it narrower than 30 cells, the check column
    narrows too and a longer key is printed whole, its finding starting on the line below. To a pipe or file nothing
    folds: each finding is one line (`grep CHECK_ID`). (rich's Table measured and wrapped every cell twice: 18-27 ms
    of a 0.25 s check on an H200, 2026-12-04.) `rows`: (layer, (word, style), key, [(text, style), ...]) with every
    value printable (one line each; a cell's own newlines start its evidence lines). `out`: a term.Styled."""
    from gpudoctor.term import cell_len, wrap

    w = [max([len(heads[0])] + [cell_len(r[0]) for r in rows]), max([len(heads[1])] + [len(r[1][0]) for r in rows]),
         max([len(heads[2])] + [cell_len(r[2]) for r in rows])]
    width = out.width or (1 << 30)
    fw = width - sum(w) - 3 * _GAP
    if fw < 30:
        w[2] = max(len(heads[2]), w[2] - (30 - fw))
        fw = max(width - sum(w) - 3 * _GAP, 10)
    gap = " " * _GAP
    text = [out.styled([(f"{heads[0]:<{w[0]}}{gap}{heads[1]:<{w[1]}}{gap}{heads[2]:<{w[2]}}{gap}finding", "bold")])]
    pad = " " * (w[0] + w[1] + w[2] + 3 * _GAP)
    for layer, (word, style), key, cell in rows:
        lines = wrap(cell, fw)
        head = [(f"{layer:<{w[0]}}{gap}", ""), (f"{word:<{w[1]}}", style), (gap + key, "")]
        if cell_len(key) > w[2]:  # a key wider than its column stays whole; its finding starts below
            text.append(out.styled(head))
            text += [out.styled([(pad, "")] + ln) for ln in lines if ln]
            continue
        for i, ln in enumerate(lines):
            segs = head + [(" " * (w[2] - cell_len(key)) + gap, "")] if i == 0 else [(pad, "")]
            text.append(out.styled(segs + ln))
    out.write("\n".join(text) + "\n")


# The leading words of the line renderers (gate, fix) and their styles: the same colours as the table's statuses.
_LEAD = {"ROLLBACK FAILED": _STYLE[Status.FAIL], "ROLLED BACK": _STYLE[Status.FAIL], "NOT FIXED": _STYLE[Status.FAIL],
         "NO REMEDY": _STYLE[Status.FAIL], "REFUSED": _STYLE[Status.FAIL], "FAILED": _STYLE[Status.FAIL],
         "BLOCK": _STYLE[Status.FAIL], "FAIL": _STYLE[Status.FAIL], "UNKNOWN": _STYLE[Status.UNKNOWN],
         "WARN": _STYLE[Status.WARN], "APPLIED": _STYLE[Status.OK], "UNCHANGED": _STYLE[Status.OK], "PLAN": "bold"}
# fix's lines that are not prose: a diff, a command to copy; they never fold
_PROSE = ("risk ", "not touching:", "root cause:", "still bad:", "restart", "not restarted:", "backup:")


def emit(out, text: str, *, fold: bool = True) -> None:
    """One line of a line renderer (gate_lines, fix_plan_lines, ...) through `out` (a term.Styled): its leading
    status word (BLOCK, FAIL, REFUSED, ...) coloured as everywhere, folded on a terminal unless `fold` is False."""
    for word, style in _LEAD.items():
        if text.startswith(word) and text[len(word):len(word) + 1] in ("", " ", ":"):
            out.print((word, style), text[len(word):], wrap_lines=fold)
            return
    out.print(text, wrap_lines=fold)


def emit_fix_lines(out, lines: list[str]) -> None:
    """fix's plan or result lines: prose folds on a terminal; a diff line or a command stays one line."""
    for text in lines:
        emit(out, text, fold=not text.startswith("      ") or text.lstrip().startswith(_PROSE))


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
    from gpudoctor.remedy import triage

    d, lines = run.before, []
    for rid in sorted({f.remedy for f in d.findings if f.bad and f.remedy and f.remedy not in remedies.REMEDIES}):
        lines.append(f"NO REMEDY  {rid} is named by a check but not available in this build")
    left_out = sorted({f.remedy for f in d.findings if f.bad and f.remedy in remedies.REMEDIES
                       and f.remedy not in run.chosen})
    if left_out:
        lines.append(f"left out by --only: {', '.join(left_out)}")
    t = triage(d, run.plan, run.chosen)  # the account `check` prints too
    if t.human:
        lines.append(t.human_line())
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

def daemon_cycle(out, found: dict) -> None:
    """One cycle of the daemon, per host: its verdict, what it found (each root cause as check's root cause block),
    what it did. `out`: a term.Styled."""
    for name, r in found.items():
        v = r["verdict"]
        style = _STYLE.get(Status(v), "") if v in {s.value for s in Status} else _STYLE[Status.UNKNOWN]
        out.print(f"{line(name)}: ", (v.upper(), style), f": {line(r['error'])}" if r.get("error") else "")
        for f in r.get("root_causes") or []:
            cause_block(out, f, status_word(f.status), lead="  ", indent="      ", list_hint=DAEMON_LIST_HINT)
        for remedy, what in r.get("actions") or []:
            out.print(f"  remedy {line(remedy)}: {line(what)}")
        if r.get("verification"):
            out.print(f"  verification {line(r['verification'])}")
        lad = r.get("ladder")
        if lad is not None:
            out.print(f"  recovery: {line(lad.state)}" + (f" ({line(lad.reason)})" if lad.reason else ""))


# --- `gpudoctor lxc audit` --------------------------------------------------------------------------------------

_ORDER = {Status.FAIL: 0, Status.UNKNOWN: 1, Status.WARN: 2, Status.OK: 3, Status.INFO: 4}


def lxc_audit(out, d: Diagnosis, inp, *, verbose: bool = False, quiet: bool = False,
              list_hint: str = LIST_HINT) -> None:
    """The container's verdict, each root cause once as a block (its evidence and fix), then the other boundary
    findings (their symptoms, the healthy checks) in check's table, worst first: every finding is printed once.
    `out`: a term.Styled."""
    out.print(f"{line(inp.label)} ({line(inp.cfg.path)}): ", status_word(d.verdict) if d.verdict != Status.OK
              else ("OK", _STYLE[Status.OK]))
    roots = {id(f) for f in d.root_causes}
    for f in d.root_causes:
        cause_block(out, f, status_word(f.status), evidence=None if verbose else EVIDENCE_SHOWN, list_hint=list_hint)
    rest = [f for f in d.findings if id(f) not in roots]
    rows = finding_rows(sorted(rest, key=lambda f: _ORDER[f.status]), verbose=verbose, quiet=quiet,
                        list_hint=list_hint)
    if rows:
        out.print()
        findings_table(out, rows)


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
    title = f"{len(result.records)} hosts, {result.wall_s:.2f} s at parallel {result.parallel}"
    ranked = sorted(result.records, key=lambda r: (-RANK[r.status], r.host))
    counts = ", ".join(f"{n} {s}" for s, n in result.counts().items() if n)
    if not console.is_terminal:  # a pipe or a file: no box, one host per line, its (long) root cause last
        rows = [("HOST", "STATUS", "S", "ROOT CAUSE / ERROR")] + [
            (line(r.host), r.status, f"{r.duration_s:.2f}", line(r.headline)) for r in ranked]
        w = [max(len(row[i]) for row in rows) for i in range(3)]
        out = [title] + ["  ".join((h.ljust(w[0]), st.ljust(w[1]), sec.rjust(w[2]), why)).rstrip()
                         for h, st, sec, why in rows] + [f"summary: {counts}"]
        console.file.write("\n".join(out) + "\n")
        console.file.flush()
        return
    table = Table(title=title, show_lines=False)
    table.add_column("host")
    table.add_column("status")
    table.add_column("root cause / error", overflow="fold")
    table.add_column("s", justify="right")
    for r in ranked:
        table.add_row(esc(r.host), f"[{style[r.status]}]{r.status}[/]", esc(r.headline), f"{r.duration_s:.2f}")
    console.print(table)
    console.print(f"summary: {counts}")


def gate_lines(result, action=None, verdict=None) -> list[tuple[str, bool]]:
    """`gpudoctor gate`: only what blocks, one line each; (line, to_stderr). A ready ladder is one stderr line."""
    lines = []
    if result.error:
        lines.append((f"BLOCK {result.host}: could not check: {result.error}", False))
    lines += [(f"BLOCK {b.line()}", False) for b in result.blockers]
    if verdict is not None and verdict.ready:
        lines.append((f"recovery: {verdict.host} ready (verified; ladder moved by the {verdict.moved_by})", True))
    elif verdict is not None and verdict.moved_by == "replay" and not any(b.key == "recovery.ladder"
                                                                            for b in result.blockers):
        lines.append((f"recovery: {verdict.reason}", True))  # a replay: what a live gate would have recorded
    if action is not None and action.action != "none":
        lines.append((f"slurm: {action.detail}", action.action != "failed"))
    return [(line(text), err) for text, err in lines]  # the rendering rule: one line each, input escaped
