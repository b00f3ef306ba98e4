"""report.md's sections on whether the numbers can be trusted and what they are made of: suspect levels (the host
changed during them), host health coverage, multi-turn cache behaviour, trace replay fidelity, per-prompt results,
steady-state windows, the server's own counters, provenance.
"""

from __future__ import annotations

from collections import defaultdict

from gpudoctor.bench.records.results import OK
from gpudoctor.bench.records.stats import fmt_ci, mean_ci


def _esc(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _load(r: dict) -> str:
    return f"{r['request_rate']:g} req/s" if r.get("request_rate") else str(r.get("concurrency"))


def _num(v, nd: int = 1) -> str:
    return "—" if v is None else (v if isinstance(v, str) else f"{v:.{nd}f}")


def render_suspect(records: list[dict]) -> list[str]:
    sus = [r for r in records if r["status"] == OK and r.get("suspect")]
    if not sus:
        return []
    lines = ["## Suspect levels", "", "The host changed while these levels ran (gpudoctor.bench.cell.suspect; thresholds: "
             "the campaign's `suspect:` keys). Their numbers are shown here only: not in the tables above, not in "
             "any speedup. `gpudoctor bench run CAMPAIGN --out DIR --rerun-suspect` measures them again.", "",
             "| label | workload | load | trial | tok/s | TTFT p50 ms | what changed (s from the level's start) |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in sus:
        why = "; ".join(x["reason"] for x in r["suspect"])
        lines.append(f"| {r['label']} | {r['workload']} | {_load(r)} | {r.get('trial', 0)} | "
                     f"{_num(r.get('output_tok_per_s'))} | {_num(r.get('ttft_ms_p50'))} | {_esc(why)[:400]} |")
    return lines + [""]


def render_health(records: list[dict]) -> list[str]:
    measured = [r for r in records if r["status"] != "skipped"]
    if not measured:
        return []
    sampled = [r for r in measured if (r.get("host_health") or {}).get("status") == "sampled"]
    why = defaultdict(int)
    for r in measured:
        h = r.get("host_health")
        if h is None:
            why["no host_health section (a record of schema gpudoctor.bench/1, or not a measured level)"] += 1
        elif h.get("status") != "sampled":
            why[h.get("reason") or "unknown"] += 1
    lines = ["## Host health", "", f"{len(sampled)} of {len(measured)} levels had their GPUs sampled during the "
             "level (NVML: clocks, clock events, power, temperature, memory, ECC, remapped rows, PCIe replays, "
             "processes; Xids from NVML and the kernel log)."]
    if sampled:
        cpu = [r["host_health"].get("sampler_cpu_s") for r in sampled]
        dur = [r["host_health"].get("duration_s") for r in sampled]
        if all(isinstance(x, (int, float)) for x in cpu + dur) and sum(dur) > 0:
            lines.append(f"The sampler used {sum(cpu) / sum(dur) * 100:.2f} % of a core over those levels.")
    for reason, n in why.items():
        lines.append(f"- not sampled ({n}): {_esc(reason)}")
    return lines + [""]


def render_multiturn(records: list[dict]) -> list[str]:
    rs = [r for r in records if r["status"] == OK and isinstance(r.get("multi_turn"), dict)]
    if not rs:
        return []
    turns = max(r["multi_turn"].get("turns") or 0 for r in rs)
    lines = ["## Multi-turn sessions", "", "Each turn re-sends the conversation so far with the server's answers; "
             "cached = prompt tokens the server reported served from its prefix cache (where it reports them). "
             "TTFT p50 by turn index.", "",
             "| label | workload | sessions (concurrent) | trial | cache hit rate | cache before | "
             + " | ".join(f"TTFT t{k + 1} ms" for k in range(turns)) + " |",
             "|---|---|---:|---:|---:|---|" + "---:|" * turns]
    for r in rs:
        m = r["multi_turn"]
        by = {t["turn"]: t for t in m.get("by_turn") or []}
        hit = m.get("cache_hit_rate")
        cache = (r.get("cache") or {}).get("action") or "—"
        lines.append(f"| {r['label']} | {r['workload']} | {m.get('sessions')} ({r.get('concurrency')}) | "
                     f"{r.get('trial', 0)} | {hit if isinstance(hit, str) else f'{hit:.1%}'} | {_esc(cache)} | "
                     + " | ".join(_num((by.get(k + 1) or {}).get("ttft_ms_p50")) for k in range(turns)) + " |")
    return lines + [""]


def render_trace(records: list[dict]) -> list[str]:
    rs = [r for r in records if r["status"] == OK and isinstance(r.get("trace"), dict)]
    if not rs:
        return []
    lines = ["## Trace replay", "", "Requests sent open loop at the trace's times x time scale; rate error = achieved "
             "/ intended request rate - 1 over the same requests; late = how long after its time a request went out.",
             "", "| label | workload | trial | requests | time scale | req/s | rate error | late p99 ms | "
             "shared prefix tokens | cached tokens |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rs:
        t = r["trace"]
        err = t.get("rate_error")
        lines.append(f"| {r['label']} | {r['workload']} | {r.get('trial', 0)} | {t.get('requests')} | "
                     f"{t.get('time_scale'):g} | {_num(r.get('achieved_req_per_s'), 2)} | "
                     f"{'—' if err is None else f'{err:+.2%}'} | {_num(r.get('send_late_ms_p99'), 2)} | "
                     f"{t.get('shared_prefix_tokens')} | {t.get('cached_tokens')} |")
    return lines + [""]


def render_per_prompt(records: list[dict], order=None) -> list[str]:
    """The seed's table: per named prompt, single-request tok/s as mean ± 95 % CI over trials."""
    groups: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r["status"] != OK or r.get("suspect") or not isinstance(r.get("per_prompt"), dict):
            continue
        cell = (r.get("method") or r["label"], r.get("tp"), r["workload"], _load(r))
        for name, v in r["per_prompt"].items():
            groups[cell][name].append(v)
    if not groups:
        return []
    lines = ["## Per prompt", "", "Single-request tok/s (output tokens / end-to-end time) per named prompt, mean ± "
             "95 % confidence interval over the trials.", "",
             "| method · TP | workload | load | prompt | tok/s | TTFT ms | trials |", "|---|---|---:|---|---:|---:|---:|"]
    for cell, names in groups.items():
        for name, vs in names.items():
            m, h, n = mean_ci([v.get("tok_per_s") for v in vs])
            tm, th, _ = mean_ci([v.get("ttft_ms") for v in vs])
            lines.append(f"| {cell[0]} · {cell[1] if cell[1] is not None else '—'} | {cell[2]} | {cell[3]} | "
                         f"{_esc(name)} | {fmt_ci(m, h)} | {fmt_ci(tm, th)} | {n} |")
    return lines + [""]


def render_steady(records: list[dict]) -> list[str]:
    rs = [r for r in records if r["status"] == OK and isinstance(r.get("steady"), dict)]
    if not rs:
        return []
    lines = ["## Steady state", "", "Per level, the warm-up cut from its per-request series (MSER on the time per "
             "output token, gpudoctor.bench.records.steady) and the window measured after it: requests counted "
             "(first..last, by send order), the window's tok/s and TTFT p50. A level too short to reach a steady "
             "state says so and has no steady numbers.", "",
             "| label | workload | load | trial | window | steady tok/s | steady TTFT p50 ms | why |",
             "|---|---|---:|---:|---|---:|---:|---|"]
    for r in rs:
        s = r["steady"]
        m = s.get("metrics") or {}
        win = (f"{s['first']}..{s['last']} ({s['counted']} of {s['requests']})" if s.get("status") == "steady"
               else s.get("status", "—").replace("_", " "))
        lines.append(f"| {r['label']} | {r['workload']} | {_load(r)} | {r.get('trial', 0)} | {win} | "
                     f"{_num(m.get('output_tok_per_s'))} | {_num(m.get('ttft_ms_p50'))} | "
                     f"{_esc(s.get('why') or '')[:200]} |")
    return lines + [""]


def render_counters(records: list[dict]) -> list[str]:
    rs = [r for r in records if r["status"] == OK and isinstance(r.get("server_counters"), dict)]
    if not rs:
        return []
    read = [r for r in rs if r["server_counters"].get("status") == "read"]
    lines = ["## Server counters", "", "The server's own Prometheus counters, read before and after each level "
             "(gpudoctor.bench.cell.counters): the level's prefix-cache queries and hits (tokens), its own hit rate "
             "and preemptions; KV usage and queue after the level."]
    if not read:
        why = {r["server_counters"].get("reason") for r in rs}
        return lines + ["", f"Not read: {_esc('; '.join(sorted(w for w in why if w)))[:300]}", ""]
    lines += ["", "| label | workload | load | trial | engine | queries | hits | hit rate | preemptions | KV usage | "
              "queue |", "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in read:
        for engine, e in (r["server_counters"].get("engines") or {}).items():
            d = e.get("deltas") or {}
            hr = e.get("hit_rate")
            ga = e.get("gauges_after") or {}
            lines.append(f"| {r['label']} | {r['workload']} | {_load(r)} | {r.get('trial', 0)} | {engine} | "
                         f"{_num(d.get('prefix_cache_queries'), 0)} | {_num(d.get('prefix_cache_hits'), 0)} | "
                         f"{'—' if hr is None else f'{hr:.1%}'} | {_num(d.get('preemptions'), 0)} | "
                         f"{_num(ga.get('kv_usage'), 2)} | {_num(ga.get('queue'), 0)} |")
    return lines + [""]


def render_provenance(records: list[dict]) -> list[str]:
    """What produced the records: one line per distinct provenance, with the levels it covers."""
    rs = [r for r in records if r["status"] != "skipped"]
    if not rs:
        return []
    lines = ["## Provenance", ""]
    groups: dict[str, list[dict]] = defaultdict(list)
    none = 0
    for r in rs:
        p = r.get("provenance")
        if not isinstance(p, dict):
            none += 1
            continue
        groups[_prov_line(p)].append(r)
    for line, grp in groups.items():
        labels = sorted({g["label"] for g in grp})
        lines.append(f"- {', '.join(labels)} ({len(grp)} levels): {line}")
        ends = _clock_line(grp)
        if ends:
            lines.append(f"  - {ends}")
    if none:
        lines.append(f"- {none} levels without provenance (records of gpudoctor.bench/2 or older)")
    return lines + [""]


def _prov_line(p: dict) -> str:
    s, g = p.get("server") or {}, p.get("gpu") or {}
    parts = [f"engine {s.get('engine', '?')} {s.get('version') or ''}".strip()
             + (f" (from {s['engine_from']})" if s.get("engine_from") else f" ({s['why']})" if s.get("why") else ""),
             f"model {s.get('model') or '?'}"]
    if s.get("command"):
        parts.append("launched as `" + " ".join(str(x) for x in s["command"])[:300].replace("|", "\\|") + "`")
    elif s.get("flags"):
        parts.append("flags " + ", ".join(f"{k}={v}" for k, v in sorted(s["flags"].items()))[:300])
    if g.get("status") == "read":
        parts.append(f"{g.get('count')}x {g.get('name')}, driver {g.get('driver')}, CUDA {g.get('cuda')}, PCIe "
                     f"{g.get('pcie')}, power limit {g.get('power_limit_w')} W")
    else:
        parts.append(f"GPUs: {g.get('why') or 'unknown'}")
    n = p.get("numa") or {}
    parts.append(f"server NUMA node(s) {n.get('nodes')}" if n.get("status") == "read"
                 else f"NUMA: {n.get('why') or 'unknown'}")
    c = p.get("check") or {}
    parts.append(f"check before: {c.get('status')}" + (f" ({_esc(c.get('said'))[:120]})" if c.get("said") else
                                                        (f" ({c.get('why')})" if c.get("why") else "")))
    camp = p.get("campaign") or {}
    if camp.get("sha256"):
        parts.append(f"campaign {camp.get('path')} sha256 {camp['sha256'][:16]}")
    host = p.get("host") or {}
    if host.get("name"):
        parts.append(f"host {host['name']}")
    parts.append(f"gpudoctor {(p.get('gpudoctor') or {}).get('version')}")
    return "; ".join(parts)


def _clock_line(grp: list[dict]) -> str | None:
    """SM clock, power limit and clock-event reasons at the first level's start and the last level's end."""
    def at(r, when):
        gpus = ((r.get("provenance") or {}).get("gpu") or {}).get("gpus") or {}
        return {i: g.get(when) for i, g in gpus.items() if g.get(when)}

    first, last = at(grp[0], "start"), at(grp[-1], "end")
    if not first and not last:
        return None

    def fmt(d):
        return ", ".join(f"GPU{i} {v.get('sm_mhz')} MHz, {v.get('power_limit_w')} W limit, reasons "
                         f"{'/'.join(v.get('reasons') or []) or 'none'}" for i, v in sorted(d.items()))

    return f"at the start: {fmt(first) or '—'}; at the end: {fmt(last) or '—'}"


def render_trust(records: list[dict], order=None) -> list[str]:
    return (render_suspect(records) + render_per_prompt(records, order) + render_multiturn(records)
            + render_trace(records) + render_steady(records) + render_counters(records) + render_health(records)
            + render_provenance(records))
