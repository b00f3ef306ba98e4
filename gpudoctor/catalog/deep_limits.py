"""The deep tier's physical limits: PCIe link bandwidth from generation and width, the SKU table
(gpudoctor/data/gpu_skus.json: memory bandwidth, dense bf16 throughput, NVLink per link, floors — each with its
source), and each measured figure of a deep child's record as a ratio to its limit, judged against its floor. Pure."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources

# PCIe transfer rate per lane (GT/s) and line-code efficiency: 8b/10b to Gen2, 128b/130b Gen3-5, Gen6 FLIT (242/256).
GT_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
ENCODING = {1: 0.8, 2: 0.8, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}

# Figures: which limit each is a ratio of, and its label in reports and metrics.
HOST_LINK = ("h2d", "d2h")
LABELS = {"h2d": "H2D pinned", "d2h": "D2H pinned", "h2d_remote": "H2D pinned, remote NUMA node",
          "d2h_remote": "D2H pinned, remote NUMA node", "h2d_pageable": "H2D pageable", "d2h_pageable": "D2H pageable",
          "d2d": "device copy", "gemm": "bf16 GEMM", "p2p": "P2P copy"}
# Clock-event reasons that slow a measurement (idle and display clocks do not).
SLOWING = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
           "sync_boost", "applications_clocks_setting")


def link_gbs(gen, width) -> float | None:
    """A PCIe link's payload-free limit in GB/s per direction: GT/s x lanes x encoding / 8 (Gen5 x16: 63.0)."""
    if not gen or not width or gen not in GT_S:
        return None
    return GT_S[gen] * width * ENCODING[gen] / 8


@lru_cache(maxsize=1)
def table() -> dict:
    """The shipped SKU table."""
    return json.loads(resources.files("gpudoctor").joinpath("data/gpu_skus.json").read_text())


def sku_for(name: str | None) -> dict | None:
    """The SKU entry whose match patterns fit NVML's product name, or None."""
    for s in table()["skus"]:
        if name and any(re.search(p, name) for p in s["match"]):
            return s
    return None


def floor_for(sku: dict | None, kind: str) -> dict | None:
    """{floor, healthy, source} of a figure: host-link and P2P floors are the table's defaults, d2d/gemm the SKU's."""
    if kind in table()["floors_default"]:
        return table()["floors_default"][kind]
    return ((sku or {}).get("floors") or {}).get(kind)


def kind_of(test: dict) -> str:
    """A child's test record → its figure kind (h2d, h2d_remote, h2d_pageable, d2d, gemm, p2p, ...)."""
    k = test.get("kind")
    if k in HOST_LINK:
        if test.get("memory") == "pageable":
            return f"{k}_pageable"
        if test.get("placement") == "remote":
            return f"{k}_remote"
    return k


def loaded_link(test: dict) -> dict | None:
    """The slowest link state sampled during a test ({gen, width}); None when NVML did not sample."""
    links = ((test.get("samples") or {}).get("link")) or []
    links = [x for x in links if x.get("gen") and x.get("width")]
    return min(links, key=lambda x: link_gbs(x["gen"], x["width"]) or 0) if links else None


def max_link(result: dict, driver_gpu: dict | None) -> dict | None:
    """The link's maximum generation and width: NVML's (the child's), else nvidia-smi's."""
    lm = ((result.get("before") or {}).get("link_max")) or {}
    if lm.get("gen") and lm.get("width"):
        return {"gen": lm["gen"], "width": lm["width"]}
    p = (driver_gpu or {}).get("pcie") or {}
    if p.get("gen_max") and p.get("width_max"):
        return {"gen": p["gen_max"], "width": p["width_max"]}
    return None


def fmt_link(link: dict | None) -> str:
    return f"Gen{link['gen']} x{link['width']}" if link else "unknown link"


def figures(result: dict, driver_gpu: dict | None = None, peer_link=None, pair_path=None) -> list[dict]:
    """Every measured figure of one child's record with its limit, ratio and floor.

    Host copies are ratios of the link's MAX gen/width limit (and, as ratio_current, of the link it ran at, sampled
    while loaded); the device copy and GEMM of the SKU's memory bandwidth and dense bf16 throughput; P2P of the
    NVLink (links x per-link rate) or of the slower PCIe link of the pair. `peer_link(index)` gives a peer's max
    link, `pair_path(a, b)` the topology's link type of a pair ("NV18", "SYS", ...)."""
    sku = sku_for(result.get("name"))
    mx = max_link(result, driver_gpu)
    out = []
    for t in result.get("tests") or []:
        kind = kind_of(t)
        if kind not in LABELS:
            continue
        value, unit = (t.get("tflops"), "TFLOP/s") if kind == "gemm" else (t.get("gbs"), "GB/s")
        if value is None:
            continue
        fig = {"kind": kind, "label": LABELS[kind], "value": round(value, 2), "unit": unit, "limit": None,
               "limit_what": None, "ratio": None, "ratio_current": None, "floor": None, "floor_source": None,
               "healthy": None, "test": t}
        if kind.startswith(("h2d", "d2h")):
            cur = loaded_link(t)
            fig["loaded_link"], fig["max_link"] = cur, mx
            if mx:
                fig["limit"], fig["limit_what"] = link_gbs(mx["gen"], mx["width"]), f"the {fmt_link(mx)} link"
            if cur and link_gbs(cur["gen"], cur["width"]):
                fig["ratio_current"] = round(value / link_gbs(cur["gen"], cur["width"]), 3)
        elif kind == "d2d" and sku:
            fig["limit"], fig["limit_what"] = sku["memory_gbs"], f"the {sku['sku']}'s memory bandwidth"
        elif kind == "gemm" and sku:
            fig["limit"], fig["limit_what"] = sku["bf16_dense_tflops"], f"the {sku['sku']}'s dense bf16 peak"
        elif kind == "p2p":
            fig["peer"] = t.get("peer")
            path = pair_path(result.get("device"), t.get("peer")) if pair_path else None
            fig["path"] = path
            m = re.match(r"^NV(\d+)$", path or "")
            if m and sku and sku.get("nvlink_gbs_per_link"):
                fig["limit"] = int(m.group(1)) * sku["nvlink_gbs_per_link"]
                fig["limit_what"] = f"{m.group(1)} NVLinks x {sku['nvlink_gbs_per_link']} GB/s"
            elif path and not m and mx:
                pl = peer_link(t.get("peer")) if peer_link else None
                links = [x for x in (mx, pl) if x]
                slow = min(links, key=lambda x: link_gbs(x["gen"], x["width"]))
                fig["limit"], fig["limit_what"] = link_gbs(slow["gen"], slow["width"]), f"the {fmt_link(slow)} link"
        if fig["limit"]:
            fig["limit"] = round(fig["limit"], 2)
            fig["ratio"] = round(value / fig["limit"], 3)
            fl = floor_for(sku, kind)
            if fl:
                fig["floor"], fig["floor_source"], fig["healthy"] = fl["floor"], fl["source"], fl["healthy"]
        out.append(fig)
    return out


def sample_words(samples: dict | None) -> str:
    """One line of what NVML saw during a test: clocks, power, temperature, clock-event reasons, link."""
    if not samples:
        return "no NVML samples"

    def rng(k, unit):
        v = samples.get(k)
        if not v:
            return None
        return f"{v[0]:g}{unit}" if v[0] == v[1] else f"{v[0]:g}-{v[1]:g}{unit}"

    parts = [f"{samples.get('n', 0)} samples"]
    for k, label, unit in (("sm", "SM", " MHz"), ("mem", "mem", " MHz"), ("power", "power", " W"),
                           ("temp", "temp", " C"), ("util", "util", "%")):
        r = rng(k, unit)
        if r:
            parts.append(f"{label} {r}")
    parts.append("clock events: " + (", ".join(samples.get("reasons") or []) or "none"))
    if samples.get("link"):
        parts.append("link " + ", ".join(fmt_link(x) for x in samples["link"]))
    return "; ".join(parts)


def num(v: float) -> str:
    """53.0, 4230, 798.0: one decimal below a thousand."""
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.1f}"


def figure_line(fig: dict) -> str:
    """'H2D pinned 53.0 GB/s = 0.84 of the Gen5 x16 link (63.0 GB/s), floor 0.75'."""
    s = f"{fig['label']} {num(fig['value'])} {fig['unit']}"
    if fig["ratio"] is not None:
        s += f" = {fig['ratio']:.2f} of {fig['limit_what']} ({num(fig['limit'])} {fig['unit']})"
    if fig.get("ratio_current") is not None and fig.get("loaded_link") != fig.get("max_link"):
        s += f", {fig['ratio_current']:.2f} of the {fmt_link(fig.get('loaded_link'))} it ran at"
    if fig["floor"] is not None:
        s += f", floor {fig['floor']:.2f}"
    return s


def table_problems(t: dict | None = None) -> list[str]:
    """What is wrong with a SKU table: a number without a source, or a floor a healthy card would fail (above its
    healthy ratio) or one so far below it that a sick card passes (under 85 % of healthy: DCGM's H200 HBM floor is
    2333 MB/s of 4.8 TB/s)."""
    t = t or table()
    bad = []

    def floors(where, fl):
        for kind, f in (fl or {}).items():
            if not f.get("source"):
                bad.append(f"{where} {kind}: floor without a source")
            if not (0 < f.get("floor", 0) <= f.get("healthy", 0) <= 1):
                bad.append(f"{where} {kind}: floor {f.get('floor')} above its healthy ratio {f.get('healthy')}")
            elif f["floor"] < 0.85 * f["healthy"]:
                bad.append(f"{where} {kind}: floor {f['floor']} is below 85 % of the healthy {f['healthy']}: a card "
                           "that lost that much would pass")

    floors("default", t.get("floors_default"))
    for s in t.get("skus") or []:
        name = s.get("sku", "?")
        if not s.get("source") or "NVIDIA" not in s["source"] or "http" not in s["source"]:
            bad.append(f"{name}: memory and bf16 figures without an NVIDIA source (name and URL)")
        for k in ("memory_gbs", "bf16_dense_tflops"):
            if not isinstance(s.get(k), (int, float)) or s[k] <= 0:
                bad.append(f"{name}: {k} missing")
        if s.get("nvlink_gbs_per_link") and not s.get("nvlink_source"):
            bad.append(f"{name}: NVLink rate without a source")
        if set((s.get("floors") or {})) != {"d2d", "gemm"}:
            bad.append(f"{name}: needs floors for d2d and gemm")
        floors(name, s.get("floors"))
    return bad
