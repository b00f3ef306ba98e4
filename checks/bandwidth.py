"""Deep tier (--deep): every GPU measured against its physical limit, and a named cause for every shortfall.

fabric.deep.figure: one finding per GPU and figure (H2D/D2H pinned, remote-node and pageable copies, device copy,
bf16 GEMM, P2P) as a ratio to its limit (gpudoctor/catalog/deep_limits.py), ok at or above its floor. A figure below its floor
is a symptom: the cause checks below name why, from what was sampled while it ran, and the diagnosis makes that the
root cause. A shortfall no cause explains says "below floor, cause unknown" with its numbers.
"""

from gpudoctor.checkreg import check
from gpudoctor.catalog.deep_limits import HOST_LINK, SLOWING, figure_line, figures, fmt_link, link_gbs, sample_words
from gpudoctor.findings import Finding, Status
from gpudoctor.catalog.xid import norm_pci


def _policy(facts):
    return ((facts.get("meta") or {}).get("context") or {}).get("policy") or {}



def _driver_gpu(facts, bus):
    want = norm_pci(bus)
    return next((g for g in (facts.get("driver") or {}).get("gpus") or [] if want and norm_pci(g.get("bus_id")) ==
                 want), None)


def _fabric_gpu(facts, bus):
    """The sysfs record of a GPU (bdf 0000:00:06.0 for NVML's 00000000:00:06.0)."""
    want = norm_pci(bus)
    return next((g for g in (facts.get("fabric") or {}).get("gpus") or [] if want and norm_pci(g.get("bdf")) == want),
                None)


def _subject(rec):
    return f"GPU {rec['index']}"


def _driver_subject(g):
    return f"GPU {g.get('minor')} ({g.get('bus_id')})"


def _figure_subject(rec, fig):
    return f"{_subject(rec)} {fig['kind']}" + (f"-{fig['peer']}" if fig["kind"] == "p2p" else "")


def _pair_path(facts):
    fab = facts.get("fabric") or {}
    pairs = (fab.get("topo") or {}).get("pairs") or {}
    p2p = fab.get("p2p_read") or {}

    def path(a, b):
        return pairs.get(f"GPU{a}-GPU{b}") or pairs.get(f"GPU{b}-GPU{a}")

    def p2p_status(a, b):
        return p2p.get(f"GPU{a}-GPU{b}") or p2p.get(f"GPU{b}-GPU{a}")

    return path, p2p_status


def _deep_gpus(facts):
    deep = facts.get("deep") or {}
    return deep.get("gpus") if isinstance(deep.get("gpus"), list) else None


def analyse(facts) -> list[dict]:
    """Per measured GPU: its figures (each with status and the causes that explain a shortfall) and its causes."""
    recs = _deep_gpus(facts) or []
    path, p2p_status = _pair_path(facts)
    results = {r["index"]: r.get("result") or {} for r in recs}

    def peer_link(i):
        from gpudoctor.catalog.deep_limits import max_link

        r = next((x for x in recs if x["index"] == i), None)
        return max_link(results.get(i) or {}, _driver_gpu(facts, r and r.get("bus_id"))) if r else None

    out = []
    for rec in recs:
        res = rec.get("result")
        if not res:
            out.append({"rec": rec, "figs": [], "causes": {}})
            continue
        dg = _driver_gpu(facts, rec.get("bus_id") or res.get("bus_id"))
        figs = figures(res, dg, peer_link, path)
        causes = _causes(facts, rec, res, dg, figs, p2p_status)
        out.append({"rec": rec, "figs": figs, "causes": causes})
    return out


def _cause(name, status, summary, evidence, data, explained_by=()):
    return {"name": name, "status": status, "summary": summary, "evidence": evidence, "data": data,
            "explained_by": tuple(explained_by), "figures": []}


def _causes(facts, rec, res, dg, figs, p2p_status) -> dict:
    """name → cause (attached to the low figures it explains). Each cause is judged from what was sampled during
    the figure's own test, or from counters read before and after the child ran."""
    subj = _subject(rec)
    low = [f for f in figs if f["floor"] is not None and f["ratio"] is not None and f["ratio"] < f["floor"]]
    for f in figs:
        f["status"] = "low" if f in low else ("ok" if f["floor"] is not None and f["ratio"] is not None else "info")
        f["causes"] = []
    causes: dict = {}

    def attach(name, fig, make):
        if name not in causes:
            causes[name] = make()
        causes[name]["figures"].append(fig)
        fig["causes"].append(name)

    numa = res.get("numa") or {}
    before, after = res.get("before") or {}, res.get("after") or {}
    # MIG, and error counters that moved: they explain every figure of the GPU.
    if before.get("mig") == 1:
        for f in low:
            attach("mig", f, lambda: _cause("mig", Status.WARN, f"{subj}: MIG mode is enabled: a measurement sees one "
                                            "instance's share of the GPU", ["NVML nvmlDeviceGetMigMode: current 1"],
                                            {"mig": 1}))
    moved = _counters_moved(before, after, facts, rec)
    if moved:
        for f in low or [None]:
            if f is None:  # errors appearing are a cause of their own, even where every figure met its floor
                causes.setdefault("errors", _errors_cause(subj, moved, dg))
            else:
                attach("errors", f, lambda: _errors_cause(subj, moved, dg))
    for f in low:
        t = f["test"]
        smp = t.get("samples") or {}
        if f["kind"] in HOST_LINK:
            cur, mx = f.get("loaded_link"), f.get("max_link")
            if cur and mx and (cur["gen"] < mx["gen"] or cur["width"] < mx["width"]):
                what = []
                if cur["gen"] < mx["gen"]:
                    what.append(f"Gen{cur['gen']} of Gen{mx['gen']}")
                if cur["width"] < mx["width"]:
                    what.append(f"x{cur['width']} of x{mx['width']}")
                up = [f"driver.pcie.width@{_driver_subject(dg)}"] if dg and cur["width"] < mx["width"] else []
                attach("link", f, lambda: _cause(
                    "link", Status.WARN, f"{subj}: PCIe link trained at {fmt_link(cur)} under load, below its "
                    f"{fmt_link(mx)} ({', '.join(what)}): limit {link_gbs(cur['gen'], cur['width']):.1f} of "
                    f"{link_gbs(mx['gen'], mx['width']):.1f} GB/s",
                    [f"NVML link sampled during {f['label']}: {', '.join(fmt_link(x) for x in smp.get('link') or [])}; "
                     f"max {fmt_link(mx)}"], {"loaded_link": cur, "max_link": mx}, up))
            want = (_policy(facts).get("pcie") or {}).get("mrrs")
            fg = _fabric_gpu(facts, rec.get("bus_id"))
            p = (fg or {}).get("pcie") or {}
            if want and p.get("found") and p["mrrs"] < want:
                f["causes"].append("mrrs")
                f.setdefault("upstream", []).append(f"fabric.pcie.mrrs@{fg['bdf']}")
                f.setdefault("upstream_words", []).append(
                    f"MaxReadReq {p['mrrs']} < policy {want} (config space of {fg['bdf']}, fabric.pcie.mrrs)")
            gnode = numa.get("gpu_node")
            pages = t.get("page_nodes") or {}
            on = sum(v for k, v in pages.items() if k == str(gnode))
            if gnode is not None and pages and on < sum(pages.values()):
                attach("numa", f, lambda: _cause(
                    "numa", Status.WARN, f"{subj}: pinned memory for the GPU on NUMA node {gnode} landed on node(s) "
                    f"{', '.join(k for k in sorted(pages) if k != str(gnode))} ({sum(pages.values()) - on} of "
                    f"{sum(pages.values())} sampled pages remote)",
                    [f"move_pages of the pinned buffer: {pages} (GPU {numa.get('bdf')} on node {gnode}, CPUs "
                     f"{numa.get('gpu_cpus')})", f"this process: Mems_allowed {numa.get('mems_allowed')}, "
                     f"Cpus_allowed {numa.get('cpus_allowed')}"] + ([t["policy_note"]] if t.get("policy_note") else [])
                    + _wrong_node(numa),
                    {"gpu_node": gnode, "page_nodes": pages, "mems_allowed": numa.get("mems_allowed")}))
        slowing = [r for r in smp.get("reasons") or [] if r in SLOWING]
        if slowing:
            up = [f"driver.throttle@{_driver_subject(dg)}"] if dg else []
            attach("clocks", f, lambda: _cause(
                "clocks", Status.WARN, f"{subj}: clocks held down by {', '.join(slowing)} during the measurement",
                [f"NVML during {f['label']}: {sample_words(smp)}",
                 f"enforced power limit {before.get('power_limit_w')} W; application SM clock "
                 f"{(before.get('app_clocks_mhz') or {}).get('sm')} MHz (default "
                 f"{(before.get('app_clocks_mhz') or {}).get('sm_default')})"], {"reasons": slowing}, up))
        foreign = smp.get("procs") or []
        idle = res.get("idle") or {}
        busy = (idle.get("util") or [0, 0])[1]
        if foreign or busy > 5:
            who = foreign or idle.get("procs") or []
            attach("contention", f, lambda: _cause(
                "contention", Status.WARN, f"{subj}: another process used the GPU during the measurement: "
                + (", ".join(f"pid {p['pid']} ({p.get('name') or '?'}, {p.get('used_mib')} MiB)" for p in who)
                   or f"no visible process, GPU {busy}% busy before the test"),
                [f"NVML processes during {f['label']}: " + (", ".join(f"pid {p['pid']} {p.get('used_mib')} MiB "
                                                                      f"{p.get('name')}" for p in foreign) or "none"),
                 f"GPU utilisation before the tests: {busy}%"],
                {"pids": [p["pid"] for p in who], "idle_util_pct": busy},
                [f"workload.gpu.foreign_memory@GPU {rec['index']} (*"]))
        if f["kind"] == "p2p":
            st = p2p_status(res.get("device"), f.get("peer"))
            can = t.get("can_access_peer")
            if can is False or (st and st != "OK"):
                attach(f"p2p_path-{f['peer']}", f, lambda: _cause(
                    "p2p_path", Status.WARN, f"{subj}: no direct peer path to GPU {f['peer']} (can_access_peer "
                    f"{can}, nvidia-smi topo -p2p r: {st}): copies stage through host memory — ACS or the IOMMU "
                    "redirecting peer traffic, or a topology without P2P",
                    [f"torch.cuda.can_device_access_peer({res.get('device')}, {f['peer']}) = {can}",
                     f"nvidia-smi topo -p2p r GPU{res.get('device')}-GPU{f['peer']}: {st}"],
                    {"peer": f["peer"], "can_access_peer": can, "p2p_read": st}))
    _contention_explains_clocks(causes, subj)
    return causes


# The clock events another process's load brings on a healthy card: its power draw hits the power cap, its heat the
# software thermal limit. Hardware slowdown, a power brake or application clocks are not a neighbour's doing.
LOAD_INDUCED = {"sw_power_cap", "sw_thermal_slowdown"}


def _contention_explains_clocks(causes: dict, subj: str) -> None:
    """A foreign process during the measurement outranks the clock events it brings (#33: on the H200 a contender's
    GEMMs held the clocks at the power cap, and "sw_power_cap" was ranked the root cause, the process second).
    The clocks are its symptom when every figure they slowed ran beside it and every event is one load induces."""
    clk, con = causes.get("clocks"), causes.get("contention")
    if not clk or not con or not set(clk["data"]["reasons"]) <= LOAD_INDUCED:
        return
    if all("contention" in f["causes"] for f in clk["figures"]):
        clk["explained_by"] = (*clk["explained_by"], f"fabric.deep.contention@{subj}")
        clk["evidence"].append(f"the process named by fabric.deep.contention[{subj}] ran during the same "
                               "measurement: its load brings these clock events")


def _cpus(text):
    out = set()
    for part in (text or "").split(","):
        a, _, b = part.strip().partition("-")
        if a.isdigit():
            out.update(range(int(a), int(b or a) + 1))
    return out


def _wrong_node(numa) -> list[str]:
    """Evidence that the process is bound off the GPU's node: its allowed CPUs miss every CPU local to the GPU."""
    mine, local = _cpus(numa.get("cpus_allowed")), _cpus(numa.get("gpu_cpus"))
    if mine and local and not mine & local:
        return [f"this process is bound to the wrong node: Cpus_allowed {numa.get('cpus_allowed')} has none of the "
                f"GPU's CPUs {numa.get('gpu_cpus')}"]
    return []


def _counters_moved(before, after, facts, rec) -> list[str]:
    moved = []
    for k in ("ecc_uncorrected", "ecc_corrected"):
        a, b = before.get(k), after.get(k)
        if a is not None and b is not None and b > a:
            moved.append(f"{k.replace('_', ' ')} {a} → {b}")
    ra, rb = before.get("remap") or {}, after.get("remap") or {}
    for k in ("uncorrectable", "pending", "failure"):
        if ra.get(k) is not None and rb.get(k) is not None and rb[k] > ra[k]:
            moved.append(f"row remap {k} {ra[k]} → {rb[k]}")
    xids = ((facts.get("deep") or {}).get("xids") or {}).get("lines") or []
    mine = [x for x in xids if norm_pci(rec.get("bus_id")) and norm_pci(x.get("pci")) == norm_pci(rec.get("bus_id"))]
    moved += [f"Xid {x.get('code')} during the run: {x.get('text', '')[:120]}" for x in mine]
    return moved


def _errors_cause(subj, moved, dg):
    up = [f"driver.ecc.uncorrected@{_driver_subject(dg)}", f"driver.remapped_rows@{_driver_subject(dg)}"] if dg else []
    return _cause("errors", Status.FAIL, f"{subj}: memory errors appeared while it was measured: {moved[0]}",
                  moved + ["(NVML counters before and after the measuring child, and the kernel log since it started)"],
                  {"moved": moved}, up)


def _refused_finding(rec, deep):
    who = rec["refused"].get("pids") or []
    if who:
        what = ", ".join(f"pid {p['pid']} ({p.get('name')}, {p.get('used_mib')} MiB)" for p in who)
        summary = (f"{_subject(rec)}: not measured: {what} holds it — `gpudoctor check --deep --force` measures "
                   "anyway (and the figures then include its load)")
    else:
        summary = f"{_subject(rec)}: not measured: could not tell whether another process holds it"
    return Finding("fabric.deep.figure", Status.UNKNOWN, summary, subject=_subject(rec),
                   evidence=[rec["refused"].get("why") or "nvidia-smi --query-compute-apps: " + (what if who else "?")],
                   data={"refused": True, "pids": [p["pid"] for p in who]}, explained_by=())


# What stops the deep tier from measuring at all (a missing driver, NVML or CUDA failing) explains its unknowns.
_UPSTREAM = ("host.driver.loaded", "host.uvm.loaded", "driver.nvml.init", "cuda.init", "cuda.device_count")


@check("fabric.deep.figure", summary="Deep tier (--deep): each GPU's pinned/pageable host copies, device copy, bf16 "
       "GEMM and P2P as ratios to the link's and the SKU's physical limits, each against a floor healthy cards reach.",
       depends_on=_UPSTREAM)
def deep_figures(facts):
    """A figure below its floor is a symptom: the cause it names (fabric.deep.*, fabric.pcie.mrrs, driver.*) is the
    root; without one it says "below floor, cause unknown" with the numbers."""
    recs = _deep_gpus(facts)
    if recs is None:
        return None  # the deep tier was not asked for (or predates per-GPU measurements)
    deep = facts.get("deep") or {}
    if not recs:
        return Finding("fabric.deep.figure", Status.UNKNOWN, "Deep tier asked for, but no GPU was measured",
                       evidence=[deep.get("gpus_error") or "nvidia-smi --query-gpu listed no GPUs"])
    out = []
    for g in analyse(facts):
        rec, res = g["rec"], g["rec"].get("result") or {}
        if rec.get("refused"):
            out.append(_refused_finding(rec, deep))
            continue
        how = f"backend {res.get('backend')}" + (f" (torch {res['torch']})" if res.get("torch") else "")
        py = (deep.get("python") or {}).get("evidence")
        notes = [f"{how}; child {res.get('elapsed_s')} s"] + ([py] if py else []) + list(res.get("notes") or []) + \
                [f"skipped: {s}" for s in res.get("skipped") or []]
        out += _not_measured(rec, res, deep)
        if not g["figs"]:
            why = rec.get("error") or res.get("error") or "the child measured nothing"
            out.append(Finding("fabric.deep.figure", Status.UNKNOWN, f"{_subject(rec)}: deep measurement failed: "
                               f"{why[:200]}", subject=_subject(rec), evidence=notes,
                               data={"backend": res.get("backend"), "error": why}))
            continue
        if rec.get("error") or res.get("error"):
            notes.append(f"incomplete: {rec.get('error') or res.get('error')}")
        for f in g["figs"]:
            size = f"{f['test']['bytes'] >> 20} MiB " if f["test"].get("bytes") else ""  # a GEMM moves no buffer
            # the summary already is the figure's sentence: the evidence is how it was measured (#41)
            ev = [f"{size}median of {len(f['test'].get('seconds') or [])}; NVML: "
                  f"{sample_words(f['test'].get('samples'))}"] + notes
            if f["floor_source"]:
                ev.append(f"floor {f['floor']} (healthy {f['healthy']}): {f['floor_source']}")
            data = {k: f.get(k) for k in ("kind", "value", "unit", "limit", "ratio", "ratio_current", "floor",
                                          "healthy", "peer")}
            data.update(gpu=rec["index"], bus_id=rec.get("bus_id"), backend=res.get("backend"), causes=f["causes"])
            subj = _figure_subject(rec, f)
            line = figure_line(f)
            if f["status"] == "low":
                pats = [f"fabric.deep.{c.split('-')[0]}@{_subject(rec)}" + (f"-{c.split('-')[1]}" if "-" in c else "")
                        for c in f["causes"] if c != "mrrs"]
                pats += f.get("upstream") or []
                ev += f.get("upstream_words") or []
                if f["causes"]:
                    names = ", ".join(c.split("-")[0] for c in f["causes"])
                    out.append(Finding("fabric.deep.figure", Status.WARN, f"{_subject(rec)}: {line}: below floor "
                                       f"({names})", subject=subj, evidence=ev, data=data, explained_by=tuple(pats)))
                else:
                    out.append(Finding("fabric.deep.figure", Status.WARN, f"{_subject(rec)}: {line}: below floor, "
                                       "cause unknown", subject=subj, evidence=ev + [
                                           "no cause found: link at its max, memory on the GPU's node, no clock "
                                           "event, no other process, no MIG, no errors"], data=data, explained_by=()))
            elif f["status"] == "ok":
                out.append(Finding("fabric.deep.figure", Status.OK, f"{_subject(rec)}: {line}", subject=subj,
                                   evidence=ev, data=data))
            else:
                why = "" if f["limit"] else " (no limit known for this SKU: not judged)"
                out.append(Finding("fabric.deep.figure", Status.INFO, f"{_subject(rec)}: {line}{why}", subject=subj,
                                   evidence=ev, data=data))
    return out


def _not_measured(rec, res, deep) -> list[Finding]:
    """What the child could not measure with the python it had (GEMM and P2P need torch): information that says
    why and what measures it, never an unknown."""
    out = []
    why = (deep.get("python") or {}).get("why")
    for s in res.get("skipped") or []:
        what, _, reason = s.partition(": ")
        if reason == "budget" or res.get("backend") != "ctypes":
            continue  # out of time is the figure's own story (the budget), not a missing tool
        kind = what.split()[0]
        out.append(Finding("fabric.deep.figure", Status.INFO, f"{_subject(rec)}: {kind}: not measured: {reason}",
                           subject=f"{_subject(rec)} {kind}", evidence=[s] + ([why] if why else []) +
                           ["`gpudoctor check --deep --deep-python PATH` names a python with torch"],
                           data={"kind": kind, "gpu": rec["index"], "not_measured": reason, "backend": "ctypes"}))
    return out


def _cause_check(name):
    def fn(facts):
        if _deep_gpus(facts) is None:
            return None
        out = []
        for g in analyse(facts):
            for key, c in g["causes"].items():
                if c["name"] != name:
                    continue
                ev = list(c["evidence"]) + [f"explains {figure_line(f)}" for f in c["figures"]]
                subj = _subject(g["rec"]) + (f"-{key.split('-')[1]}" if "-" in key else "")
                out.append(Finding(f"fabric.deep.{name}", c["status"], c["summary"], subject=subj,
                                   evidence=ev, data={**c["data"], "figures": [
                                       {"kind": f["kind"], "value": f["value"], "ratio": f["ratio"]}
                                       for f in c["figures"]]},
                                   explained_by=c["explained_by"]))
        return out
    return fn


_CAUSES = {
    "link": "A host copy below its floor ran on a PCIe link trained below its max generation or width (sampled while "
            "loaded: an idle link may down-clock legitimately).",
    "numa": "A host copy below its floor used pinned memory that landed on a NUMA node other than the GPU's "
            "(a cpuset or memory policy binding the process to the wrong node).",
    "clocks": "A figure below its floor ran under a clock event: power cap, thermal or hardware slowdown, sync "
              "boost or application clocks.",
    "contention": "A figure below its floor ran while another process used the GPU (its PID and memory).",
    "p2p_path": "A peer copy below its floor had no direct peer path (ACS or the IOMMU redirecting P2P, or no P2P).",
    "mig": "A figure below its floor ran with MIG enabled (one instance's share of the GPU).",
    "errors": "ECC errors, row remaps or Xids appeared while the GPU was measured.",
}
for _name, _summary in _CAUSES.items():
    check(f"fabric.deep.{_name}", summary=_summary)(_cause_check(_name))
