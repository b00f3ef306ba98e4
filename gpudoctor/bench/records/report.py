"""Reports from DIR/results.jsonl: report.md (per method x TP tables, speedup vs the baseline), results.csv, PNG plots.

Only `ok` records produce numbers; every other record is listed with its reason, so a failure is visible and never
averaged in. Trials of the same level are averaged; the table says how many were ok.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections import defaultdict
from pathlib import Path

from gpudoctor.bench.records.results import FIELDS, OK, ResultStore
from gpudoctor.bench.records.stats import fmt_ci
from gpudoctor.bench.records.trust import render_trust
from gpudoctor.errors import InputError

Cell = tuple  # (method, tp, workload, load): load is the concurrency, or ("rate", requests/s) for an open-loop level


def _load(r: dict):
    return ("rate", r["request_rate"]) if r.get("request_rate") else r.get("concurrency")


def _load_key(load) -> tuple:
    return (1, load[1]) if isinstance(load, tuple) else (0, load or 0)


def load_label(load) -> str:
    """How a level's load reads in a table: its concurrency, or `16 req/s`."""
    return f"{load[1]:g} req/s" if isinstance(load, tuple) else str(load)


def _cell(r: dict) -> Cell:
    return (r.get("method") or r["label"], r.get("tp"), r["workload"], _load(r))


class Order:
    """Methods and workloads in the order the campaign lists them (campaign.json), else in the order the records
    first name them: a report reads like the campaign that produced it, not alphabetically."""

    def __init__(self, records: list[dict], meta: dict | None = None):
        meta = meta or {}
        seen_m, seen_w = {}, {}
        for r in records:
            seen_m.setdefault(r.get("method") or r["label"], len(seen_m))
            seen_w.setdefault(r["workload"], len(seen_w))
        listed_m = {m: i for i, m in enumerate(meta.get("methods") or [])}
        listed_w = {w: i for i, w in enumerate(meta.get("workloads") or [])}
        self.method = lambda m: (listed_m.get(m, len(listed_m)), seen_m.get(m, 0))
        self.workload = lambda w: (listed_w.get(w.split(":", 1)[0], len(listed_w)), seen_w.get(w, 0))


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def aggregate(records: list[dict]) -> dict[Cell, dict]:
    """Mean of the ok trials per (method, tp, workload, concurrency), and how many trials there were. A suspect
    record (the host changed during it: gpudoctor.bench.cell.suspect) is never averaged in; `suspect` counts them. With
    two or more ok trials, `ci` holds the 95 % confidence half-width of tok/s, TTFT and ITL (t distribution)."""
    from gpudoctor.bench.records.stats import mean_ci

    groups: dict[Cell, list[dict]] = defaultdict(list)
    for r in records:
        groups[_cell(r)].append(r)
    out = {}
    for cell, rs in groups.items():
        ok = [r for r in rs if r["status"] == OK and not r.get("suspect")]
        out[cell] = {"trials": len(rs), "ok": len(ok),
                     "suspect": sum(1 for r in rs if r["status"] == OK and r.get("suspect")),
                     **{k: _mean([r.get(k) for r in ok]) for k in ("output_tok_per_s", "accept_length", "ttft_ms_p50",
                                                              "itl_ms_p50", "e2e_ms_p50",
                                                              "goodput_req_per_s")},
                     "ci": {k: mean_ci([r.get(k) for r in ok])[1] for k in ("output_tok_per_s", "ttft_ms_p50",
                                                                            "itl_ms_p50")}}
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


def render_comparisons(records: list[dict], baseline: str | None, order: Order) -> list[str]:
    """The seed's table: every method against the baseline at the same TP, per cell, with the change, its 95 %
    interval, the test and the verdict (gpudoctor.bench.records.compare, as `bench compare` does)."""
    from gpudoctor.bench.records.compare import compare_with

    if not baseline:
        return []
    methods = sorted({r.get("method") or r["label"] for r in records}, key=order.method)
    if baseline not in methods or len(methods) < 2:
        return []
    lines = ["## Comparisons", "", f"Each method against **{baseline}** at the same TP, workload and load "
             "(`gpudoctor bench compare DIR:method=" + baseline + " DIR:method=M` prints the same with every metric). "
             "Δ = (method − baseline) / baseline with its 95 % interval; * = significant. The test: Welch t on the "
             "trials where both have two or more, else a bootstrap + Mann-Whitney U on per-request values; a verdict "
             "needs a significant change of at least 1 %. Suspect levels are left out and named.", ""]
    base = [r for r in records if (r.get("method") or r["label"]) == baseline]
    for m in methods:
        if m == baseline:
            continue
        mine = [r for r in records if (r.get("method") or r["label"]) == m]
        result = compare_with(base, mine, f"method={baseline}", f"method={m}")
        lines += render_comparison_table(result, f"{m} vs {baseline}")
    return lines


def render_comparison_table(result: dict, title: str) -> list[str]:
    from gpudoctor.bench.records.compare import render_markdown_table

    return render_markdown_table(result, title)


def render_slurm(state: dict | None) -> list[str]:
    """report.md's "Nodes refused by the gate" section of a campaign run with --slurm (OUT/slurm/state.json): which
    node each configuration's job landed on and was refused by the gate, what gpudoctor did to the node; and jobs
    Slurm ended before their levels were recorded."""
    if not isinstance(state, dict) or not isinstance(state.get("configs"), dict):
        return []
    refused = [(label, r) for label, st in sorted(state["configs"].items()) if isinstance(st, dict)
               for r in st.get("refused") or [] if isinstance(r, dict)]
    ended = [(label, e) for label, st in sorted(state["configs"].items()) if isinstance(st, dict)
             for e in st.get("ended") or [] if isinstance(e, dict)]
    lines = []
    esc = lambda c: " ".join(str(c).split()).replace("|", "\\|")[:300]  # noqa: E731
    if refused:
        lines += ["## Nodes refused by the gate", "",
                  "The configuration's job ran the gate on the node it landed on; the gate refused the node, gpudoctor "
                  "drained it (never a node someone else drained) and resubmitted the configuration without it.", "",
                  "| configuration | node | job | the gate said | the node |", "|---|---|---|---|---|"]
        for label, r in refused:
            lines.append(f"| {esc(label)} | {esc(r.get('node'))} | {esc(r.get('job_id'))} | {esc(r.get('said'))} | "
                         f"{esc((r.get('drain') or {}).get('detail'))} |")
        lines.append("")
    if ended:
        lines += ["## Jobs Slurm ended", "", "| configuration | job | how it ended | its last output |",
                  "|---|---|---|---|"]
        for label, e in ended:
            lines.append(f"| {esc(label)} | {esc(e.get('job_id'))} | {esc(e.get('why'))} | "
                         f"{esc(e.get('output') or '—')} |")
        lines.append("")
    return lines


def render_markdown(records: list[dict], baseline: str | None, title: str, plots: list[str],
                    order: Order | None = None, heals: list[dict] | None = None, plots_note: str | None = None,
                    slurm: dict | None = None, by_node: bool = False) -> str:
    agg = aggregate(records)
    order = order or Order(records)
    counts = defaultdict(int)
    for r in records:
        counts[r["status"]] += 1
    lines = [f"# Benchmark report: {title}", "",
             f"Source: results.jsonl, {len(records)} records ("
             + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + "). "
             + (f"Speedup is output tok/s relative to **{baseline}** at the same TP, workload and concurrency."
                if baseline else "No baseline method: no speedup column."),
             "", "Throughput is all output tokens of a level divided by its wall time; accept length is "
             "completion tokens / verify steps over the level's requests; trials are averaged (ok/total shown), "
             "with ± the 95 % confidence interval of the mean over the ok trials (t distribution) where there are "
             "two or more; suspect levels (the host changed during them) are listed apart and never averaged.", ""]
    methods = sorted({c[0] for c in agg}, key=order.method)
    goodput = any(r.get("goodput_req_per_s") is not None for r in records)  # the campaign set SLOs
    for m in methods:
        for tp in sorted({c[1] for c in agg if c[0] == m}, key=_tp_key):
            if not any(agg[c]["ok"] for c in agg if c[0] == m and c[1] == tp):
                continue  # nothing measured: its levels are all under "Not measured"
            lines += [f"## {m} · TP {tp if tp is not None else '—'}", "",
                      "| workload | concurrency | tok/s | speedup | accept length | TTFT p50 ms | ITL p50 ms | ok/trials |"
                      + (" goodput req/s |" if goodput else ""),
                      "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if goodput else "")]
            cells = sorted((c for c in agg if c[0] == m and c[1] == tp),
                           key=lambda c: (order.workload(c[2]), _load_key(c[3])))
            for c in cells:
                a = agg[c]
                ci = a.get("ci") or {}
                sus = f" ({a['suspect']} suspect)" if a.get("suspect") else ""
                lines.append(f"| {c[2]} | {load_label(c[3])} | {fmt_ci(a['output_tok_per_s'], ci.get('output_tok_per_s'))} | "
                             f"{_fmt(speedup(agg, c, baseline), 2, '×')} | {_fmt(a['accept_length'], 2)} | "
                             f"{fmt_ci(a['ttft_ms_p50'], ci.get('ttft_ms_p50'))} | "
                             f"{fmt_ci(a['itl_ms_p50'], ci.get('itl_ms_p50'), 2)} | {a['ok']}/{a['trials']}{sus} |"
                             + (f" {_fmt(a['goodput_req_per_s'], 2)} |" if goodput else ""))
            lines.append("")
    bad = [r for r in records if r["status"] != OK]
    if bad:
        lines += ["## Not measured", "", "| label | workload | concurrency | trial | status | reason |",
                  "|---|---|---:|---:|---|---|"]
        for r in bad:
            reason = " ".join(str(r.get("error") or "").split()).replace("|", "\\|")
            lines.append(f"| {r['label']} | {r['workload']} | {load_label(_load(r))} | {r.get('trial', 0)} | "
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
                             f"{rs[0]['label']} / {rs[0]['workload']} / {load_label(_load(rs[0]))}): "
                             f"{rs[0].get('diagnosis') or ''}. Fix: {rs[0].get('fix') or '—'}")
            lines.append("")
    lines += render_comparisons(records, baseline, order)
    lines += render_trust(records, order)
    lines += render_heals(records, heals or [])
    lines += render_slurm(slurm)
    if by_node:
        lines += render_by_node(records)
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots] + [""]
    elif plots_note:
        lines += ["## Plots", "", plots_note, ""]
    return "\n".join(lines)


def render_csv(records: list[dict], baseline: str | None) -> str:
    agg = aggregate(records)
    cols = [f for f in FIELDS if f != "log_excerpt"] + ["speedup"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in records:
        sp = speedup(agg, _cell(r), baseline) if r["status"] == OK and not r.get("suspect") else None
        row = {**r, "speedup": sp, "error": " ".join(str(r.get("error") or "").split()) or None,
               "suspect": "; ".join(x["reason"] for x in r["suspect"]) if r.get("suspect") else None,
               "heal": (r.get("heal") or {}).get("n") if isinstance(r.get("heal"), dict) else None}
        w.writerow(["" if row.get(c) is None else row.get(c) for c in cols])
    return buf.getvalue()


# matplotlib is the `plots` extra, not a base dependency: it and numpy, pillow, fonttools (+9 packages, ~170 MB,
# measured in docs/bench.md) are more than the rest of gpudoctor, and a GPU host's report is usually read elsewhere.
PLOTS_REQUIREMENT = "matplotlib>=3.7"


def plots_unavailable() -> str | None:
    """Why the plots cannot be drawn in this Python (matplotlib missing or broken, and how to add it), or None."""
    import sys

    try:
        import matplotlib  # noqa: F401
        import matplotlib.pyplot  # noqa: F401
    except ImportError as exc:
        what = "is not installed" if getattr(exc, "name", None) == "matplotlib" else f"cannot be imported ({exc})"
        return (f"plots not drawn: matplotlib {what} in {sys.prefix} (the Python gpudoctor runs from); add it there "
                f"with `{sys.executable} -m pip install '{PLOTS_REQUIREMENT}'` (gpudoctor's `plots` extra) and run "
                f"`gpudoctor bench report` again")
    return None


def render_plots(records: list[dict], baseline: str | None, plot_dir: Path, order: Order | None = None) -> list[str]:
    """Per workload: throughput and speedup vs concurrency (and vs request rate for open-loop levels), one panel per
    TP, one line per method. A workload or panel with nothing measured draws nothing (no empty figures, legends or
    log axes without data, so matplotlib has nothing to warn about)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agg = aggregate(records)
    order = order or Order(records)
    palette = plt.get_cmap("tab10").colors
    all_methods = sorted({c[0] for c in agg}, key=order.method)
    color = {m: palette[i % len(palette)] for i, m in enumerate(all_methods)}  # one colour per method everywhere
    written = []
    for workload in sorted({c[2] for c in agg}, key=order.workload):
        for axis in ("concurrency", "rate"):
            cells = [c for c in agg if c[2] == workload and isinstance(c[3], tuple) == (axis == "rate")
                     and agg[c]["output_tok_per_s"] is not None]
            for kind in ("throughput", "speedup"):
                if kind == "speedup" and not baseline:
                    continue
                name = _plot(plt, agg, cells, kind, axis, workload, baseline, order, color, plot_dir)
                if name:
                    written.append(f"plots/{name}")
    return written


def _plot(plt, agg, cells, kind, axis, workload, baseline, order, color, plot_dir) -> str | None:
    """One figure (a panel per TP); None when it would have no line."""
    def y(c):
        return agg[c]["output_tok_per_s"] if kind == "throughput" else speedup(agg, c, baseline)

    lines = {}  # (tp, method) -> [(x, y)]
    for c in cells:
        if kind == "speedup" and c[0] == baseline or y(c) is None:
            continue
        lines.setdefault((c[1], c[0]), []).append((c[3][1] if axis == "rate" else c[3], y(c)))
    if not lines:
        return None
    tps = sorted({tp for tp, _ in lines}, key=_tp_key)
    xs = sorted({x for pts in lines.values() for x, _ in pts})
    top = max(v for pts in lines.values() for _, v in pts)
    fig, axes = plt.subplots(1, len(tps), figsize=(4.2 * len(tps) + 1, 3.6), squeeze=False)
    for ax, tp in zip(axes[0], tps):
        for m in sorted({m for t, m in lines if t == tp}, key=order.method):
            pts = sorted(lines[(tp, m)])
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m, color=color[m])
        if kind == "speedup":
            ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        # Room above the highest line (and above 1x for speedups), so a line near the maximum is not cut.
        ax.set_ylim(0, max(top, 1.0 if kind == "speedup" else 0.0) * 1.15 or 1.0)
        if len(xs) > 1 and xs[0] > 0:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{x:g}" for x in xs])
        ax.minorticks_off()
        ax.set_title(f"TP {tp if tp is not None else '—'}")
        ax.set_xlabel("concurrency" if axis == "concurrency" else "request rate (req/s)")
        ax.set_ylabel("output tok/s" if kind == "throughput" else f"speedup vs {baseline}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{workload}: {kind}" + (" (open loop)" if axis == "rate" else ""))
    fig.tight_layout()
    plot_dir.mkdir(parents=True, exist_ok=True)
    name = f"{kind}{'-rate' if axis == 'rate' else ''}-{workload.replace(':', '_')}.png"
    fig.savefig(plot_dir / name, dpi=110)
    plt.close(fig)
    return name


def render_by_node(records: list[dict]) -> list[str]:
    """report.md's "By node" section (--by-node): tok/s per Slurm node, configuration and level, so a difference
    between methods can be told from a difference between the nodes they ran on."""
    from gpudoctor.bench.records.compare import node_of

    groups: dict = defaultdict(list)
    for r in records:
        groups[(str(node_of(r) or "—"), r["label"], r["workload"], str(load_label(_load(r))))].append(r)
    lines = ["## By node", "", "Each level on the Slurm node it was measured on (provenance.slurm.node; — where the "
             "record has none).", "", "| node | label | workload | load | ok/total | tok/s (mean of ok) |",
             "|---|---|---|---|---:|---:|"]
    for (node, label, wl, load), rs in sorted(groups.items()):
        ok = [r["output_tok_per_s"] for r in rs if r["status"] == "ok" and r.get("output_tok_per_s") is not None]
        lines.append(f"| {node} | {label} | {wl} | {load} | {len(ok)}/{len(rs)} | {_fmt(_mean(ok))} |")
    return lines + [""]


def write_report(out_dir: str, *, baseline: str | None = None, plots: bool = True, by_node: bool = False) -> dict:
    """Write report.md, results.csv and plots/ into OUT_DIR from its results.jsonl. Returns what was written, and
    under "plots_skipped" why no plot was drawn when matplotlib is not there (the tables and CSV are written anyway)."""
    from gpudoctor.files.atomic import atomic_write

    d = Path(out_dir)
    store = ResultStore(d)
    if not store.path.exists():
        raise InputError("no results.jsonl here (run `gpudoctor bench load` or `bench run` first)", path=str(d))
    records = store.load()
    if not records:
        raise InputError("results.jsonl holds no records: nothing to report", path=str(store.path))
    meta = {}
    if (d / "campaign.json").exists():
        from gpudoctor.files.inputs import read_json

        meta = read_json(d / "campaign.json", what="campaign.json", max_bytes=16 << 20)
        if not isinstance(meta, dict) or not all(isinstance(meta.get(k), (str, type(None))) for k in ("name", "baseline")):
            raise InputError("campaign.json must be an object whose name and baseline are strings",
                             path=str(d / "campaign.json"))
    from gpudoctor.files import safe

    os.close(safe.owned_dir(str(d), create=False))  # ours (#40): plots and reports below it are written by path
    baseline = baseline or meta.get("baseline")
    title = meta.get("name") or d.name
    order = Order(records, meta)
    skipped = plots_unavailable() if plots else None
    pngs = render_plots(records, baseline, d / "plots", order) if plots and not skipped else []
    heals = []
    if (d / "heals.jsonl").exists():
        heals = [json.loads(x) for x in (d / "heals.jsonl").read_text().splitlines() if x.strip()]
    slurm = None
    if (d / "slurm" / "state.json").exists():  # a campaign run with --slurm (gpudoctor.campaign.slurm)
        from gpudoctor.files.inputs import read_json

        slurm = read_json(d / "slurm" / "state.json", what="slurm/state.json", max_bytes=16 << 20)
    mode = safe.output_mode()
    atomic_write(d / "report.md", render_markdown(records, baseline, title, pngs, order, heals, plots_note=skipped,
                                                  slurm=slurm, by_node=by_node), mode=mode)
    atomic_write(d / "results.csv", render_csv(records, baseline), mode=mode)
    return {"report": str(d / "report.md"), "csv": str(d / "results.csv"), "plots": [str(d / p) for p in pngs],
            "plots_skipped": skipped}
