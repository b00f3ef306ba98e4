"""Render a Diagnosis for humans (rich table grouped by layer, root cause on top) or machines (JSON)."""

from __future__ import annotations

import json

from gpudoctor.diagnose import Diagnosis
from gpudoctor.findings import LAYERS, Status

_STYLE = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red", Status.UNKNOWN: "magenta",
          Status.INFO: "dim"}
_WORD = {Status.OK: "ok", Status.WARN: "WARN", Status.FAIL: "FAIL", Status.UNKNOWN: "UNKNOWN", Status.INFO: "info"}


def to_json(d: Diagnosis) -> str:
    return json.dumps(d.to_json(), indent=2, sort_keys=False)


def render(d: Diagnosis, console, verbose: bool = False, host: str | None = None) -> None:
    """Root cause and chain first, then one table per layer. `verbose` also lists ok/info evidence.
    `host`: the inventory name the check ran on over SSH, so the remedy line names it (`fix --host NAME`)."""
    from rich.markup import escape
    from rich.table import Table

    verdict = d.verdict
    t = d.facts.get("meta", {}).get("timings", {}).get("total")
    took = f" in {t:.2f} s" if isinstance(t, (int, float)) else ""
    console.print(f"[bold]gpudoctor check[/] {escape(d.host)}: [{_STYLE[verdict]}]{_WORD[verdict]}[/] "
                  f"(exit {d.exit_code}){took}")
    rc = d.root_cause
    if rc:
        console.print()
        outside = ""
        if d.only_layers and rc.layer not in d.only_layers:
            outside = f" (layer {rc.layer}, outside --only {','.join(d.only_layers)})"
        console.print(f"[{_STYLE[rc.status]}]Root cause[/] [bold]{escape(rc.key)}[/]{escape(outside)}: "
                      f"{escape(rc.summary)}")
        for e in rc.evidence:
            console.print(f"    evidence: {escape(e)}")
        if rc.hint:
            console.print(f"    fix: {escape(rc.hint)}")
        if rc.remedy:
            where = f"--host {host} " if host else ""
            console.print(f"    remedy: gpudoctor fix {escape(where)}--only {escape(rc.remedy)}   (dry run: shows the "
                          f"diff; add --apply to make the change)")
        if len(d.chain) > 1:
            console.print("    chain: " + escape(" → ".join(d.chain)))
        if len(d.root_causes) > 1:
            console.print("    also: " + escape(", ".join(f.key for f in d.root_causes[1:])))
        others = [f.key for f in d.outside if f is not rc]
        if others:
            console.print("    outside the filter: " + escape(", ".join(others)) + " (findings shown are their symptoms)")
    console.print()
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False, expand=False)
    table.add_column("layer")
    table.add_column("status")
    table.add_column("check")
    table.add_column("finding", overflow="fold")
    for layer in LAYERS:
        rows = [f for f in d.findings if f.layer == layer]
        if not verbose:
            # keep one ok line per check id so the reader sees what was verified
            seen, kept = set(), []
            for f in rows:
                if f.bad or f.id not in seen:
                    kept.append(f)
                seen.add(f.id)
            rows = kept
        for i, f in enumerate(rows):
            text = escape(f.summary)
            if f.blocked_by:
                text += f" [dim](symptom of {escape(f.blocked_by)})[/]"
            if verbose or f.bad:
                for e in f.evidence[:3]:
                    text += f"\n[dim]{escape(e)}[/]"
            table.add_row(layer if i == 0 else "", f"[{_STYLE[f.status]}]{_WORD[f.status]}[/]", escape(f.key), text)
    console.print(table)
