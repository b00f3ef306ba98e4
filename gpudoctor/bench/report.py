"""Reports from DIR/results.jsonl: report.md (per method x TP tables, speedup vs the baseline), results.csv, PNG plots.

Only `ok` records produce numbers; every other record is listed with its reason, so a failure is visible and never
averaged in. Trials of the same level are averaged; the table says how many were ok.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from pathlib import Path

from gpudoctor.bench.results import FIELDS, OK, ResultStore
from gpudoctor.errors import InputError

Cell = tuple  # (method, tp, workload, concurrency)


def _cell(r: dict) -> Cell:
    return (r.get("method") or r["label"], r.get("tp"), r["workload"], r["concurrency"])


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def aggregate(records: list[dict]) -> dict[Cell, dict]:
    """Mean of the ok trials per (method, tp, workload, concurrency), and how many trials there were."""
    groups: dict[Cell, list[dict]] = defaultdict(list)
    for r in records:
        groups[_cell(r)].append(r)
    out = {}
    for cell, rs in groups.items():
        ok = [r for r in rs if r["status"] == OK]
        out[cell] = {"trials": len(rs), "ok": len(ok),
                     **{k: _mean([r[k] for r in ok]) for k in ("output_tok_per_s", "accept_length", "ttft_ms_p50",
                                                              "itl_ms_p50", "e2e_ms_p50")}}
    return out


def speedup(agg: dict[Cell, dict], cell: Cell, baseline: str | None) -> float | None:
    """Throughput relative to the baseline method at the same TP, workload and concurrency."""
    if not baseline or cell[0] == baseline:
        return None
    base = agg.get((baseline, *cell[1:]))
    mine = agg[cell]["output_tok_per_s"]
    if not base or not base["output_tok_per_s"] or mine is None:
        return None
    return mine / base["output_tok_per_s"]


def _fmt(v, nd: int = 1, suffix: str = "") -> str:
    return "—" if v is None else f"{v:.{nd}f}{suffix}"


def _tp_key(tp) -> tuple:
    return (tp is None, tp or 0)


def render_heals(records: list[dict], heals: list[dict]) -> list[str]:
    """report.md's "Heals" section: each time the target broke mid-campaign, what was done, what ran after."""
    if not heals:
        return []
    lines = ["## Heals", "", "The target broke during the campaign; gpudoctor judged it through the gate profile and "
             "healed it where the campaign's heal policy allowed. Records a broken target produced were retracted "
             "(kept in retracted.jsonl) and their levels ran again; records after a heal carry its number.", "",
             "| # | when | what happened | root cause | remedies | outcome | levels after |", "|---:|---|---|---|---|---|---:|"]
    for h in heals:
        after = sum(1 for r in records if isinstance(r.get("heal"), dict) and r["heal"].get("n") == h.get("n"))
        acts = ", ".join(f"{a['remedy']} ({'ok' if a.get('ok') else 'failed'})" for a in h.get("actions") or []) or "—"
        outcome = ("healed" if h.get("healthy") and h.get("broken") else "healthy (the crash was the method's own)"
                   if h.get("healthy") else "not healed: campaign stopped")
        cell = [str(h.get("n")), str(h.get("at") or ""), str(h.get("reason") or ""), str(h.get("root_cause") or "—"),
                acts, outcome, str(after)]
        lines.append("| " + " | ".join(" ".join(c.split()).replace("|", "\\|")[:300] for c in cell) + " |")
    return lines + [""]


def render_markdown(records: list[dict], baseline: str | None, title: str, plots: list[str],
                    heals: list[dict] | None = None) -> str:
    agg = aggregate(records)
    counts = defaultdict(int)
    for r in records:
        counts[r["status"]] += 1
    lines = [f"# Benchmark report: {title}", "",
             f"Source: results.jsonl, {len(records)} records ("
             + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + "). "
             + (f"Speedup is output tok/s relative to **{baseline}** at the same TP, workload and concurrency."
                if baseline else "No baseline method: no speedup column."),
             "", "Throughput is all output tokens of a level divided by its wall time; accept length is "
             "completion tokens / verify steps over the level's requests; trials are averaged (ok/total shown).", ""]
    methods = sorted({c[0] for c in agg}, key=lambda m: (m != baseline, m))
    for m in methods:
        for tp in sorted({c[1] for c in agg if c[0] == m}, key=_tp_key):
            if not any(agg[c]["ok"] for c in agg if c[0] == m and c[1] == tp):
                continue  # nothing measured: its levels are all under "Not measured"
            lines += [f"## {m} · TP {tp if tp is not None else '—'}", "",
                      "| workload | concurrency | tok/s | speedup | accept length | TTFT p50 ms | ITL p50 ms | ok/trials |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|"]
            cells = sorted((c for c in agg if c[0] == m and c[1] == tp), key=lambda c: (c[2], c[3]))
            for c in cells:
                a = agg[c]
                lines.append(f"| {c[2]} | {c[3]} | {_fmt(a['output_tok_per_s'])} | "
                             f"{_fmt(speedup(agg, c, baseline), 2, '×')} | {_fmt(a['accept_length'], 2)} | "
                             f"{_fmt(a['ttft_ms_p50'])} | {_fmt(a['itl_ms_p50'], 2)} | {a['ok']}/{a['trials']} |")
            lines.append("")
    bad = [r for r in records if r["status"] != OK]
    if bad:
        lines += ["## Not measured", "", "| label | workload | concurrency | trial | status | reason |",
                  "|---|---|---:|---:|---|---|"]
        for r in bad:
            reason = " ".join(str(r.get("error") or "").split()).replace("|", "\\|")
            lines.append(f"| {r['label']} | {r['workload']} | {r['concurrency']} | {r.get('trial', 0)} | "
                         f"{r['status']} | {reason[:300]} |")
        lines.append("")
        named: dict[str, list[dict]] = {}
        for r in bad:
            if r.get("cause") and r["cause"] != "unknown":
                named.setdefault(r["cause"], []).append(r)
        if named:  # what the server's log says, once per cause (gpudoctor/data/server_failures.yaml)
            lines += ["### Causes named from the server logs", ""]
            for cause, rs in named.items():
                lines.append(f"- **{cause}** ({len(rs)} level{'s' if len(rs) != 1 else ''}, first "
                             f"{rs[0]['label']} / {rs[0]['workload']} / c={rs[0]['concurrency']}): "
                             f"{rs[0].get('diagnosis') or ''}. Fix: {rs[0].get('fix') or '—'}")
            lines.append("")
    lines += render_heals(records, heals or [])
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots] + [""]
    return "\n".join(lines)


def render_csv(records: list[dict], baseline: str | None) -> str:
    agg = aggregate(records)
    cols = [f for f in FIELDS if f != "log_excerpt"] + ["speedup"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in records:
        sp = speedup(agg, _cell(r), baseline) if r["status"] == OK else None
        row = {**r, "speedup": sp, "error": " ".join(str(r.get("error") or "").split()) or None,
               "heal": (r.get("heal") or {}).get("n") if isinstance(r.get("heal"), dict) else None}
        w.writerow(["" if row.get(c) is None else row.get(c) for c in cols])
    return buf.getvalue()


def render_plots(records: list[dict], baseline: str | None, plot_dir: Path) -> list[str]:
    """Per workload: throughput and speedup vs concurrency, one panel per TP, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agg = aggregate(records)
    palette = plt.get_cmap("tab10").colors
    all_methods = sorted({c[0] for c in agg}, key=lambda m: (m != baseline, m))
    color = {m: palette[i % len(palette)] for i, m in enumerate(all_methods)}  # one colour per method everywhere
    plot_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for workload in sorted({c[2] for c in agg}):
        tps = sorted({c[1] for c in agg if c[2] == workload}, key=_tp_key)
        methods = sorted({c[0] for c in agg if c[2] == workload}, key=lambda m: (m != baseline, m))
        concs = sorted({c[3] for c in agg if c[2] == workload})
        for kind in ("throughput", "speedup"):
            if kind == "speedup" and not baseline:
                continue
            fig, axes = plt.subplots(1, len(tps), figsize=(4.2 * len(tps) + 1, 3.6), squeeze=False)
            drawn = False
            for ax, tp in zip(axes[0], tps):
                for m in methods:
                    if kind == "speedup" and m == baseline:
                        continue
                    pts = sorted((c[3], agg[c]["output_tok_per_s"] if kind == "throughput" else
                                  speedup(agg, c, baseline)) for c in agg if c[:3] == (m, tp, workload))
                    pts = [(x, y) for x, y in pts if y is not None]
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m, color=color[m])
                        drawn = True
                if kind == "speedup":
                    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
                ax.set_ylim(bottom=0)
                ax.set_xscale("log", base=2)
                ax.set_xticks(concs)
                ax.set_xticklabels([str(c) for c in concs])
                ax.minorticks_off()
                ax.set_title(f"TP {tp if tp is not None else '—'}")
                ax.set_xlabel("concurrency")
                ax.set_ylabel("output tok/s" if kind == "throughput" else f"speedup vs {baseline}")
                ax.grid(True, alpha=0.3)
                ax.legend(fontsize=8)
            if not drawn:
                plt.close(fig)
                continue
            fig.suptitle(f"{workload}: {kind}")
            fig.tight_layout()
            name = f"{kind}-{workload.replace(':', '_')}.png"
            fig.savefig(plot_dir / name, dpi=110)
            plt.close(fig)
            written.append(f"plots/{name}")
    return written


def write_report(out_dir: str, *, baseline: str | None = None, plots: bool = True) -> dict[str, str]:
    """Write report.md, results.csv and plots/ into OUT_DIR from its results.jsonl. Returns what was written."""
    from gpudoctor.atomic import atomic_write

    d = Path(out_dir)
    store = ResultStore(d)
    if not store.path.exists():
        raise InputError("no results.jsonl here (run `gpudoctor bench load` or `bench run` first)", path=str(d))
    records = store.load()
    meta = {}
    if (d / "campaign.json").exists():
        meta = json.loads((d / "campaign.json").read_text())
    baseline = baseline or meta.get("baseline")
    title = meta.get("name") or d.name
    pngs = render_plots(records, baseline, d / "plots") if plots else []
    heals = []
    if (d / "heals.jsonl").exists():
        heals = [json.loads(x) for x in (d / "heals.jsonl").read_text().splitlines() if x.strip()]
    atomic_write(d / "report.md", render_markdown(records, baseline, title, pngs, heals))
    atomic_write(d / "results.csv", render_csv(records, baseline))
    return {"report": str(d / "report.md"), "csv": str(d / "results.csv"), "plots": [str(d / p) for p in pngs]}
