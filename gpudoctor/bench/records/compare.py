"""`bench compare A B`: per cell both sides measured, the difference of throughput and latency with a 95 % interval,
a test that fits the data, and a verdict (faster / slower / no difference detectable); the regression gate's
`--fail-if` expressions; what else differs between A and B (provenance).

The test (gpudoctor.bench.records.stats, stdlib only):
- two or more clean trials per side: Welch's t test on the trials' values (each trial one number: its steady window's
  metric where every record has one, else the whole level's);
- otherwise, where both sides carry per-request values (records of gpudoctor.bench/3): a percentile bootstrap of the
  statistic over the per-request values of the steady windows (2000 resamples, seeded) for the interval, and the
  Mann-Whitney U test for the p-value;
- otherwise "not enough data" (one trial per side of a gpudoctor.bench/2 record), with what would make it enough.

A difference is a verdict (faster / slower) when it is significant (the 95 % interval excludes 0) and at least
`min_effect` (default 1 %) of A's value: a smaller one is called "no difference detectable", with how many trials per
side would detect `effect` (default 5 %) at 80 % power.
Suspect trials (the host changed during them) are left out and named; a cell with none left is "not compared".
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

from gpudoctor.bench.records import stats
from gpudoctor.bench.records.results import OK, ResultStore, percentile
from gpudoctor.errors import InputError

# metric -> (label, higher is better, per-request column, statistic over per-request values)
METRICS = {
    "output_tok_per_s": ("tok/s", True, "tok_per_s", "mean"),
    "ttft_ms_p50": ("TTFT p50 ms", False, "ttft_ms", "p50"),
    "ttft_ms_p99": ("TTFT p99 ms", False, "ttft_ms", "p99"),
    "itl_ms_p50": ("ITL p50 ms", False, "itl_ms", "p50"),
    "e2e_ms_p50": ("e2e p50 ms", False, "e2e_ms", "p50"),
}
FASTER, SLOWER, SAME, NOT_ENOUGH, NOT_COMPARED = ("faster", "slower", "no difference detectable", "not enough data",
                                                  "not compared")
SELECT_KEYS = ("method", "label", "tp", "host", "node")
KEY_FIELDS = ("method", "tp", "workload", "load")
# What is expected to differ when a method or TP is what is compared.
_EXPECTED = {"method": ("server.flags", "server.command", "label"), "tp": ("server.flags", "server.command", "label",
                                                                          "gpus")}


def _stat(name: str):
    if name == "mean":
        return lambda xs: sum(xs) / len(xs)
    q = {"p50": 50, "p99": 99}[name]
    return lambda xs: percentile(xs, q)


# ---- the two sides -------------------------------------------------------------------------------------------------
def parse_side(arg: str) -> tuple[Path, dict]:
    """`DIR` or `DIR:field=value[,field=value]` (fields: method, label, tp, host, node) -> (dir, selector)."""
    p = Path(arg)
    if p.is_dir() or ":" not in arg:
        return p, {}
    head, _, sel = arg.rpartition(":")
    out = {}
    for part in sel.split(","):
        k, eq, v = part.partition("=")
        k = k.strip()
        if not eq or k not in SELECT_KEYS or not v.strip():
            raise InputError(f"bench compare: {arg!r}: a side is DIR or DIR:FIELD=VALUE[,...] with FIELD one of "
                             f"{', '.join(SELECT_KEYS)}")
        out[k] = v.strip()
    return Path(head), out


def _host(r: dict):
    return ((r.get("provenance") or {}).get("host") or {}).get("name")


def node_of(r: dict):
    """The Slurm node a record was measured on (provenance.slurm.node: `bench run --slurm`), else None."""
    return ((r.get("provenance") or {}).get("slurm") or {}).get("node")


def _matches(r: dict, sel: dict) -> bool:
    for k, v in sel.items():
        have = (_host(r) if k == "host" else node_of(r) if k == "node" else (r.get("method") or r.get("label"))
                if k == "method" else r.get(k))
        if str(have) != v:
            return False
    return True


def load_side(arg: str) -> dict:
    d, sel = parse_side(arg)
    if not d.is_dir():
        raise InputError("bench compare: no such result directory", path=str(d))
    store = ResultStore(d)
    if not store.path.exists():
        raise InputError("bench compare: no results.jsonl here", path=str(d))
    recs = [r for r in store.load() if _matches(r, sel)]
    if not recs:
        raise InputError(f"bench compare: no records{' match ' + _sel_text(sel) if sel else ''}", path=str(store.path))
    return {"arg": arg, "dir": str(d), "select": sel, "records": recs}


def _sel_text(sel: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sel.items())


def _load(r: dict):
    return ("rate", r["request_rate"]) if r.get("request_rate") else r.get("concurrency")


def _field(r: dict, f: str):
    if f == "method":
        return r.get("method") or r.get("label")
    if f == "load":
        return _load(r)
    if f == "node":
        return node_of(r)
    return r.get(f)


def key_fields(a: list[dict], b: list[dict], sel_a: dict, sel_b: dict) -> tuple[str, ...]:
    """The fields a cell is matched on: all of KEY_FIELDS except those a selector fixes, and method (or tp) when the
    two sides have no value of it in common (two directories of different methods compared cell by cell)."""
    out = []
    for f in KEY_FIELDS:
        if f in sel_a or f in sel_b:
            continue
        if f in ("method", "tp"):
            va, vb = {_field(r, f) for r in a}, {_field(r, f) for r in b}
            if not va & vb:
                continue
        out.append(f)
    return tuple(out)


def compared_fields(a: list[dict], b: list[dict], fields: tuple) -> list[str]:
    """What differs by design: the KEY_FIELDS the cells are not matched on whose values differ between A and B."""
    return [f for f in ("method", "tp") if f not in fields and {_field(r, f) for r in a} != {_field(r, f) for r in b}]


# ---- values -------------------------------------------------------------------------------------------------------
def _steady_ok(r: dict) -> bool:
    s = r.get("steady")
    return isinstance(s, dict) and s.get("status") == "steady" and isinstance(s.get("metrics"), dict)


def trial_value(r: dict, metric: str, steady: bool):
    return (r["steady"]["metrics"].get(metric) if steady else r.get(metric))


def request_values(r: dict, column: str, steady: bool) -> list[float]:
    pr = r.get("per_request")
    if not isinstance(pr, dict) or not isinstance(pr.get("rows"), list):
        return []
    cols = pr.get("fields") or []
    if column not in cols:
        return []
    i = cols.index(column)
    rows = pr["rows"]
    if steady and _steady_ok(r):
        rows = rows[r["steady"]["first"]: r["steady"]["last"] + 1]
    return [row[i] for row in rows if isinstance(row[i], (int, float))]


def compare_metric(ra: list[dict], rb: list[dict], metric: str, *, effect: float = 0.05,
                   min_effect: float = 0.01) -> dict:
    """One metric of one cell: A's and B's value, the difference (absolute and relative to A) with its 95 %
    interval, the test used and its p-value, the verdict and what more data would detect `effect`."""
    _, higher, column, statname = METRICS[metric]
    steady = bool(ra and rb) and all(_steady_ok(r) for r in ra + rb)
    basis = "steady window" if steady else "whole level"
    va = [v for v in (trial_value(r, metric, steady) for r in ra) if v is not None]
    vb = [v for v in (trial_value(r, metric, steady) for r in rb) if v is not None]
    out = {"metric": metric, "basis": basis, "trials": [len(va), len(vb)]}
    if not va or not vb:
        return {**out, "verdict": NOT_ENOUGH, "why": "no value on " + ("A" if not va else "B")}
    # a and b are always the quantity the change and its interval are of, named in `quantity`
    out["a"], out["b"] = sum(va) / len(va), sum(vb) / len(vb)
    out["quantity"] = "level" if len(va) == len(vb) == 1 else "mean of the trials"
    if len(va) >= 2 and len(vb) >= 2:
        w = stats.welch(va, vb)
        out.update(test="Welch t on trial values", diff=w["diff"], lo=w["lo"], hi=w["hi"], p=w["p"])
        sd = math.sqrt((stats._mean_var(va)[1] + stats._mean_var(vb)[1]) / 2)
        need = stats.trials_needed(sd, effect * abs(out["a"])) if out["a"] else None
        out["need"] = None if need is None else {"trials_per_side": need, "effect": effect}
    else:
        xa = [x for r in ra for x in request_values(r, column, steady)]
        xb = [x for r in rb for x in request_values(r, column, steady)]
        if len(xa) < 4 or len(xb) < 4:
            why = ("one trial per side and no per-request values (a record of gpudoctor.bench/2 or older)"
                   if not xa or not xb else f"too few requests ({len(xa)} and {len(xb)}) for a per-request test")
            return {**out, "verdict": NOT_ENOUGH, "why": why + ": run 2 or more trials per side",
                    "diff": out["b"] - out["a"]}
        f = _stat(statname)
        pa, pb = f(xa), f(xb)
        lo, hi = stats.bootstrap_diff(xa, xb, f)
        mw = stats.mann_whitney(xa, xb) if statname != "p99" else {"p": None}  # M-W tests location, not a tail
        # The change, its interval and A and B are all the per-request statistic's (the levels' own values, which
        # this test does not compare, are kept beside as `level`): A, B and the change always agree.
        out.update(level=[out["a"], out["b"]], a=pa, b=pb, quantity=f"per-request {statname}",
                   test=f"bootstrap of the per-request {statname} ({len(xa)} vs {len(xb)} requests)"
                        + (" + Mann-Whitney U" if mw["p"] is not None else ""),
                   diff=pb - pa, lo=lo, hi=hi, p=mw["p"], per_request=[pa, pb])
        sd = math.sqrt((stats._mean_var(xa)[1] + stats._mean_var(xb)[1]) / 2) if len(xa) > 1 < len(xb) else 0
        need = stats.trials_needed(sd, effect * abs(pa)) if pa else None
        out["need"] = None if need is None else {"requests_per_side": need, "effect": effect}
    a = out["a"]
    rel = out["diff"] / a if a else None
    out["rel"], out["rel_lo"], out["rel_hi"] = rel, (out["lo"] / a if a else None), (out["hi"] / a if a else None)
    significant = out["lo"] > 0 or out["hi"] < 0
    out["significant"] = significant
    if significant and rel is not None and abs(rel) >= min_effect:
        better = (out["diff"] > 0) == higher
        out["verdict"] = FASTER if better else SLOWER
    else:
        out["verdict"] = SAME
        if significant:
            out["why"] = f"significant but below the {min_effect:.0%} that counts as a difference"
    return out


# ---- cells ----------------------------------------------------------------------------------------------------------
def compare(a: dict, b: dict, *, effect: float = 0.05, min_effect: float = 0.01, by_node: bool = False) -> dict:
    """Compare side A with side B (load_side's dicts) cell by cell; `by_node`: a cell is also matched on the Slurm
    node its records were measured on (provenance.slurm.node), so A and B are compared only on the same node."""
    ra, rb = a["records"], b["records"]
    fields = key_fields(ra, rb, a["select"], b["select"]) + (("node",) if by_node else ())
    ga, gb = defaultdict(list), defaultdict(list)
    for r in ra:
        ga[tuple(_field(r, f) for f in fields)].append(r)
    for r in rb:
        gb[tuple(_field(r, f) for f in fields)].append(r)
    cells = []
    for k in sorted(set(ga) & set(gb), key=_sort_key):
        cells.append(compare_cell(dict(zip(fields, k)), ga[k], gb[k], effect=effect, min_effect=min_effect))
    only_a = [dict(zip(fields, k)) for k in sorted(set(ga) - set(gb), key=_sort_key)]
    only_b = [dict(zip(fields, k)) for k in sorted(set(gb) - set(ga), key=_sort_key)]
    varied = compared_fields(ra, rb, fields) + [k for k in SELECT_KEYS if a["select"].get(k) != b["select"].get(k)]
    return {"a": _side_info(a), "b": _side_info(b), "matched_on": list(fields), "compared": sorted(set(varied)),
            "effect": effect, "min_effect": min_effect, "cells": cells, "only_a": only_a, "only_b": only_b,
            "warnings": [w for w in provenance_warnings(ra, rb, set(varied))  # by node: nodes are matched on
                         if not (by_node and w.startswith("A and B ran on different nodes"))]}


def compare_with(ra: list[dict], rb: list[dict], name_a: str, name_b: str, **kw) -> dict:
    """compare() on two lists of records (a campaign's methods, for its report)."""
    return compare({"arg": name_a, "dir": "", "select": {"method": name_a.split("=", 1)[-1]}, "records": ra},
                   {"arg": name_b, "dir": "", "select": {"method": name_b.split("=", 1)[-1]}, "records": rb}, **kw)


def _sort_key(k: tuple):
    return tuple((1, v[1]) if isinstance(v, tuple) else (0, str(v) if not isinstance(v, (int, float)) else "",
                                                         v if isinstance(v, (int, float)) else 0) for v in k)


def _side_info(s: dict) -> dict:
    return {"arg": s["arg"], "dir": s["dir"], "select": s["select"], "records": len(s["records"])}


def compare_cell(cell: dict, ra: list[dict], rb: list[dict], *, effect: float, min_effect: float) -> dict:
    out = {"cell": cell}
    notes = []
    clean = []
    for side, rs in (("A", ra), ("B", rb)):
        ok = [r for r in rs if r["status"] == OK]
        sus = [r for r in ok if r.get("suspect")]
        bad = [r for r in rs if r["status"] != OK]
        if sus:
            notes.append(f"{side}: {len(sus)} suspect trial(s) left out ("
                         + "; ".join(x["reason"] for x in sus[0]["suspect"])[:200] + ")")
        if bad:
            notes.append(f"{side}: {len(bad)} trial(s) not measured ({bad[0]['status']}: "
                         f"{' '.join(str(bad[0].get('error') or '').split())[:120]})")
        clean.append([r for r in ok if not r.get("suspect")])
        too_short = [r for r in ok if isinstance(r.get("steady"), dict) and r["steady"].get("status") == "too_short"]
        if too_short:
            notes.append(f"{side}: {len(too_short)} trial(s) too short for a steady state "
                         f"({too_short[0]['steady'].get('why')}); their whole-level values are used")
    out["notes"] = notes
    if not clean[0] or not clean[1]:
        out["verdict"] = NOT_COMPARED
        out["why"] = "no clean trial on " + ("A" if not clean[0] else "B") + (": " + "; ".join(notes) if notes else "")
        out["metrics"] = {}
        return out
    out["metrics"] = {m: compare_metric(clean[0], clean[1], m, effect=effect, min_effect=min_effect) for m in METRICS}
    out["verdict"] = out["metrics"]["output_tok_per_s"]["verdict"]
    return out


# ---- provenance ---------------------------------------------------------------------------------------------------
_PROV_FIELDS = (("server.engine", ("server", "engine")), ("server.version", ("server", "version")),
                ("server.flags", ("server", "flags")), ("server.model", ("server", "model")),
                ("gpu.name", ("gpu", "name")), ("gpu.driver", ("gpu", "driver")), ("gpu.cuda", ("gpu", "cuda")),
                ("gpu.power_limit_w", ("gpu", "power_limit_w")), ("gpu.pcie", ("gpu", "pcie")),
                ("gpus", ("gpu", "count")), ("server.numa_node", ("server", "numa_node")),
                ("host", ("host", "name")), ("node", ("slurm", "node")), ("campaign.sha256", ("campaign", "sha256")),
                ("gpudoctor", ("gpudoctor", "version")))


def _get(d, path):
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def provenance_warnings(ra: list[dict], rb: list[dict], varied: set) -> list[str]:
    """One line per provenance field whose values differ between A and B, except what is being compared."""
    expected = set()
    for v in varied:
        expected.update(_EXPECTED.get(v, ()))
    pa = [r.get("provenance") for r in ra if isinstance(r.get("provenance"), dict)]
    pb = [r.get("provenance") for r in rb if isinstance(r.get("provenance"), dict)]
    out = []
    if not pa or not pb:
        missing = [s for s, p in (("A", pa), ("B", pb)) if not p]
        return [f"no provenance on {' and '.join(missing)} (records of gpudoctor.bench/2 or older): what else differs "
                "between A and B is unknown"]
    for name, path in _PROV_FIELDS:
        if name in expected:
            continue
        sa = {_canon(_get(p, path)) for p in pa} - {None}
        sb = {_canon(_get(p, path)) for p in pb} - {None}
        if sa and sb and sa != sb and name == "node":
            out.append(f"A and B ran on different nodes: {', '.join(sorted(sa))[:160]} vs {', '.join(sorted(sb))[:160]}"
                       " (a difference may be the nodes'; --by-node compares only cells measured on the same node)")
        elif sa and sb and sa != sb:
            out.append(f"A and B differ in {name}: {', '.join(sorted(sa))[:160]} vs {', '.join(sorted(sb))[:160]}")
    return out


def _canon(v):
    if v is None:
        return None
    if isinstance(v, (list, tuple)):
        return " ".join(str(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={v[k]}" for k in sorted(v))
    return str(v)


# ---- the gate ------------------------------------------------------------------------------------------------------
_RULE = re.compile(r"^\s*([a-z0-9_]+)\s*([<>])\s*([+-]?\d+(?:\.\d+)?)\s*%\s*$")


def parse_rule(text: str) -> dict:
    """`output_tok_per_s < -5%` -> {metric, op, pct}; InputError naming the expression otherwise."""
    m = _RULE.match(text or "")
    if not m:
        raise InputError(f"--fail-if {text!r}: expected METRIC < -N% or METRIC > +N% (e.g. "
                         f"\"output_tok_per_s < -5%\", \"ttft_ms_p99 > +10%\")")
    metric, op, pct = m.group(1), m.group(2), float(m.group(3))
    if metric not in METRICS:
        raise InputError(f"--fail-if {text!r}: unknown metric {metric!r}; one of {', '.join(METRICS)}")
    return {"text": text.strip(), "metric": metric, "op": op, "pct": pct}


def gate(result: dict, rules: list[dict]) -> dict:
    """Judge each rule on every compared cell: a cell fails a rule when its relative change is beyond the threshold
    and significant. Cells that could not be judged (not compared, not enough data) are listed: a gate never passes
    what it could not judge, so any such cell makes the outcome "unknown" unless another cell failed."""
    failed, unjudged, passed = [], [], []
    for rule in rules:
        for c in result["cells"]:
            m = (c.get("metrics") or {}).get(rule["metric"])
            where = {"rule": rule["text"], "cell": c["cell"]}
            if c["verdict"] == NOT_COMPARED or m is None or m.get("verdict") == NOT_ENOUGH or m.get("rel") is None:
                unjudged.append({**where, "why": (m or {}).get("why") or c.get("why") or "not compared"})
                continue
            rel = m["rel"] * 100
            beyond = rel < rule["pct"] if rule["op"] == "<" else rel > rule["pct"]
            entry = {**where, "rel_pct": rel, "p": m.get("p"), "significant": m["significant"]}
            (failed if beyond and m["significant"] else passed).append(entry)
    if not result["cells"]:
        unjudged.append({"rule": "*", "cell": {}, "why": "A and B have no cell in common"})
    outcome = "fail" if failed else "unknown" if unjudged else "pass"
    return {"outcome": outcome, "failed": failed, "unjudged": unjudged, "passed": passed}


# ---- rendering -----------------------------------------------------------------------------------------------------
def cell_text(cell: dict) -> str:
    parts = []
    for k, v in cell.items():
        if k == "load":
            parts.append(f"{v[1]:g} req/s" if isinstance(v, tuple) else f"c={v}")
        elif k == "tp":
            if v is not None:
                parts.append(f"TP{v}")
        else:
            parts.append(str(v))
    return " ".join(parts) or "all"


def fmt_diff(m: dict) -> str:
    if m.get("rel") is None:
        return "—"
    return f"{m['rel']:+.1%} [{m['rel_lo']:+.1%}, {m['rel_hi']:+.1%}]"


def need_text(m: dict) -> str:
    n = m.get("need") or {}
    if "trials_per_side" in n:
        have = min(m["trials"])
        return (f"≈{n['trials_per_side']} trials per side ({max(0, n['trials_per_side'] - have)} more) would detect "
                f"{n['effect']:.0%}")
    if "requests_per_side" in n:
        return f"≈{n['requests_per_side']} requests per side would detect {n['effect']:.0%}"
    return ""


def render_text(result: dict, verdict_of_gate: dict | None = None) -> list[str]:
    lines = [f"A: {result['a']['arg']} ({result['a']['records']} records)",
             f"B: {result['b']['arg']} ({result['b']['records']} records)",
             f"cells matched on: {', '.join(result['matched_on']) or 'nothing (one cell)'}"
             + (f"; compared: {', '.join(result['compared'])}" if result["compared"] else "")]
    for w in result["warnings"]:
        lines.append(f"WARNING: {w}")
    for c in result["cells"]:
        lines.append("")
        lines.append(f"{cell_text(c['cell'])}: {c['verdict'].upper()}" + (f" ({c['why']})" if c.get("why") else ""))
        for n in c["notes"]:
            lines.append(f"  note: {n}")
        ms = c.get("metrics") or {}
        whys = {m.get("why") for m in ms.values()}
        if ms and all(m["verdict"] == NOT_ENOUGH for m in ms.values()) and len(whys) == 1:
            t = ms["output_tok_per_s"]
            vals = f"tok/s A {t['a']:.4g} B {t['b']:.4g}; " if t.get("a") is not None else ""
            lines.append(f"  {vals}every metric: {whys.pop()}")
            continue
        for name, m in ms.items():
            label = METRICS[name][0]
            if m.get("a") is None:
                lines.append(f"  {label}: {m['verdict']} ({m.get('why', '')})")
                continue
            if "test" in m:
                tail = (f"p={m['p']:.3g}, " if m.get("p") is not None else "") + f"{m['test']}, {m['basis']}"
            else:
                tail = m.get("why", "")
            extra = ""
            if m["verdict"] == SAME and need_text(m):
                extra = f"; {need_text(m)}"
            if m.get("why") and "test" in m:
                extra += f"; {m['why']}"
            if m.get("level"):
                extra += f"; the levels' {label}: A {m['level'][0]:.4g} B {m['level'][1]:.4g}"
            lines.append(f"  {label} ({m.get('quantity') or 'level'}): A {m['a']:.4g} B {m['b']:.4g} {fmt_diff(m)} → "
                         f"{m['verdict']} ({tail}{extra})")
    for side, cells in (("A", result["only_a"]), ("B", result["only_b"])):
        if cells:
            lines.append("")
            lines.append(f"only in {side} (not compared): " + "; ".join(cell_text(c) for c in cells)[:600])
    if verdict_of_gate is not None:
        g = verdict_of_gate
        lines.append("")
        for f in g["failed"]:
            pv = f" (p={f['p']:.3g})" if f.get("p") is not None else " (95 % interval excludes 0)"
            lines.append(f"GATE FAIL {f['rule']}: {cell_text(f['cell'])} changed {f['rel_pct']:+.1f}%{pv}")
        for u in g["unjudged"]:
            lines.append(f"GATE COULD NOT JUDGE {u['rule']}: {cell_text(u['cell'])}: {u['why']}")
        lines.append(f"gate: {g['outcome']} ({len(g['failed'])} failed, {len(g['passed'])} passed, "
                     f"{len(g['unjudged'])} not judged)")
    return lines


def render_markdown_table(result: dict, title: str) -> list[str]:
    """The seed's table for report.md: per cell, A and B's tok/s, each metric's change with its interval, the test
    and the verdict. A and B are the quantity the change is of, which the test column names (the levels' tok/s, the
    mean of the trials', or the per-request mean)."""
    lines = [f"### {title}", "", "| cell | tok/s A | tok/s B | Δ tok/s [95 % CI] | Δ TTFT p50 | Δ TTFT p99 | Δ ITL p50 | "
             "Δ e2e p50 | test | verdict |", "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for c in result["cells"]:
        ms = c.get("metrics") or {}
        t = ms.get("output_tok_per_s") or {}

        def num(v):
            return "—" if v is None else f"{v:.1f}"

        def rel(m):
            if not m or m.get("rel") is None:
                return "—"
            return f"{m['rel']:+.1%}" + ("*" if m.get("significant") else "")

        why = c.get("why") or t.get("why") or ""
        verdict = c["verdict"] + (f" ({why})" if why and c["verdict"] in (NOT_COMPARED, NOT_ENOUGH) else "")
        if c["verdict"] == SAME and need_text(t):
            verdict += f"; {need_text(t)}"
        if c["notes"]:
            verdict += "; " + "; ".join(c["notes"])
        lines.append(f"| {cell_text(c['cell'])} | {num(t.get('a'))} | {num(t.get('b'))} | {fmt_diff(t)} | "
                     f"{rel(ms.get('ttft_ms_p50'))} | {rel(ms.get('ttft_ms_p99'))} | {rel(ms.get('itl_ms_p50'))} | "
                     f"{rel(ms.get('e2e_ms_p50'))} | "
                     f"{(t.get('quantity') + ': ' if t.get('quantity') and t.get('test') else '') + (t.get('test') or '—')} | "
                     + " ".join(verdict.split()).replace("|", "\\|")[:400] + " |")
    for w in result["warnings"]:
        lines.append(f"\nWarning: {w}")
    return lines + [""]
