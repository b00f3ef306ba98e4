"""The deep tier's physical limits: PCIe link bandwidth from generation and width, the SKU table
(gpudoctor/data/gpu_skus.json: memory bandwidth, dense bf16 throughput, NVLink per link, floors — each with its
source), and each measured figure of a deep child's record as a ratio to its limit, judged against its floor. Pure."""

from __future__ import annotations

import json
import math
import os
import re
from functools import lru_cache
from importlib import resources

from gpudoctor.errors import ConfigError

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


SHIPPED = "data/gpu_skus.json"
SITE_TABLE = "/etc/gpudoctor/gpu_skus.json"  # a site's own measured SKUs (tools/sku_from_snapshots.py writes entries)
SITE_ENV = "GPUDOCTOR_SKU_TABLE"  # another path for the site table (tests; an image that keeps it elsewhere)

# What a plausible entry holds, per field: (low, high, what it is). A datasheet figure typed in TB/s or MB/s, or a
# sparsity figure in PFLOP/s, falls outside (H200: 4800 GB/s, 989 TFLOP/s; GB300: 8000 GB/s, ~2500 TFLOP/s dense).
RANGES = {"memory_gbs": (100.0, 20000.0, "a memory bandwidth in GB/s (100-20000)"),
          "bf16_dense_tflops": (10.0, 5000.0, "a dense bf16 peak in TFLOP/s (10-5000)"),
          "nvlink_gbs_per_link": (1.0, 200.0, "an NVLink rate per link and direction in GB/s (1-200)")}
# How a floor is derived from measured runs (docs/deep.md "Floors from measurements"): at least MIN_RUNS healthy runs,
# healthy = the lowest run's ratio rounded to 0.01, floor = MARGIN x healthy rounded down to 0.01.
MIN_RUNS, MARGIN = 3, 0.90


def table() -> dict:
    """The SKU table: the shipped one, with a site's entries (SITE_TABLE, or $GPUDOCTOR_SKU_TABLE) first. Each is
    checked as it is loaded (table_problems): a bad entry is a ConfigError naming the file and the entry."""
    site = os.environ.get(SITE_ENV) or SITE_TABLE
    try:
        st = os.stat(site)
        key = (site, st.st_mtime_ns, st.st_size, st.st_uid, st.st_mode)
    except FileNotFoundError:
        key = None
    except OSError as exc:
        raise ConfigError(f"cannot read the site SKU table: {exc.strerror}", path=site) from None
    return _load(key)


@lru_cache(maxsize=4)
def _load(site_key) -> dict:
    path = str(resources.files("gpudoctor").joinpath(SHIPPED))
    shipped = json.loads(resources.files("gpudoctor").joinpath(SHIPPED).read_text())
    _refuse(table_problems(shipped), path)
    if site_key is None:
        return shipped
    site = site_key[0]  # its owner and mode are in the key only so that a chmod or chown is read again
    from gpudoctor.files.inputs import read_json

    # it sets the floors gpudoctor judges by: as root, the one rule on the fd read (it and every directory above it)
    doc = read_json(site, what="site SKU table", max_bytes=1 << 20, error=ConfigError, obeyed=True)
    if not isinstance(doc, dict) or doc.get("schema") != "gpudoctor.gpu_skus/1" or not isinstance(doc.get("skus"), list):
        raise ConfigError('a site SKU table is {"schema": "gpudoctor.gpu_skus/1", "skus": [ENTRY, ...]} (each entry '
                         "as tools/sku_from_snapshots.py writes it)", path=site)
    _refuse(table_problems({"floors_default": {}, "skus": doc["skus"]}), site)
    mine = {s["sku"] for s in doc["skus"]}
    return {**shipped, "site": site, "skus": [{**s, "site": site} for s in doc["skus"]]
            + [s for s in shipped["skus"] if s["sku"] not in mine]}


def _refuse(problems: list[str], path: str) -> None:
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(f"bad SKU entry: {problems[0]}{more}", path=path)


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
                fig["floor_assumed_from"] = fl.get("assumed_from") if fl["source"].startswith("assumed") else None
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
        if fig.get("floor_assumed_from"):
            s += f" assumed from {fig['floor_assumed_from']}"
    return s


def table_problems(t: dict | None = None) -> list[str]:
    """What is wrong with a SKU table, one line per problem naming the entry: a number without a source, a number
    outside its field's plausible range (RANGES: a TB/s or MB/s typed for GB/s), a bad match pattern, and a floor
    not 0 < floor < healthy <= 1 (a floor at or above healthy fails a healthy card), one under 85 % of healthy (a card
    that lost that much would pass: DCGM's H200 HBM floor is 2333 MB/s of 4.8 TB/s), or one that does not say whether
    it was measured or assumed, and from what."""
    t = table() if t is None else t
    bad = []

    def floors(where, fl):
        if not isinstance(fl, dict):
            bad.append(f"{where}: floors is not a mapping of figure to {{floor, healthy, source}}")
            return
        for kind, f in fl.items():
            if not isinstance(f, dict):
                bad.append(f"{where} {kind}: not a {{floor, healthy, source}} mapping")
                continue
            src = f.get("source")
            if not src or not isinstance(src, str):
                bad.append(f"{where} {kind}: floor without a source")
            elif not src.startswith(("measured", "assumed")):
                bad.append(f"{where} {kind}: the source must start with \"measured\" (where, when, how) or "
                           "\"assumed\" (from what)")
            elif src.startswith("assumed") and not f.get("assumed_from"):
                bad.append(f"{where} {kind}: an assumed floor needs assumed_from (what it is assumed from, for the "
                           "finding's text)")
            fv, hv = f.get("floor"), f.get("healthy")
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (fv, hv)):
                bad.append(f"{where} {kind}: floor {fv!r} and healthy {hv!r} must be ratios (numbers)")
            elif not (0 < fv and hv <= 1):
                bad.append(f"{where} {kind}: floor {fv}, healthy {hv}: ratios must be 0 < floor < healthy <= 1")
            elif fv >= hv:
                bad.append(f"{where} {kind}: floor {fv} at or above its healthy ratio {hv}: a healthy card would fail")
            elif fv < 0.85 * hv:
                bad.append(f"{where} {kind}: floor {fv} is below 85 % of the healthy {hv}: a card that lost that much "
                           "would pass")

    floors("default", t.get("floors_default") or {})
    seen = set()
    for s in t.get("skus") or []:
        if not isinstance(s, dict):
            bad.append(f"SKU entry {brief(s)}: not a mapping")
            continue
        name = s.get("sku")
        if not name or not isinstance(name, str):
            bad.append(f"SKU entry {brief(s)}: no sku name")
            continue
        if name in seen:
            bad.append(f"{name}: listed twice")
        seen.add(name)
        src = s.get("source")
        if not isinstance(src, str) or "NVIDIA" not in src or "http" not in src:
            bad.append(f"{name}: memory and bf16 figures without an NVIDIA source (name and URL)")
        match = s.get("match")
        if not isinstance(match, list) or not match or not all(isinstance(p, str) for p in match):
            bad.append(f"{name}: match must be a list of regular expressions for NVML's product name")
        else:
            for p in match:
                try:
                    re.compile(p)
                except re.error as exc:
                    bad.append(f"{name}: match {p!r} is not a regular expression ({exc})")
        for k, (lo, hi, what) in RANGES.items():
            v = s.get(k)
            if v is None and k == "nvlink_gbs_per_link":
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                bad.append(f"{name}: {k} missing" if v is None else f"{name}: {k} {brief(v)} is not a number")
            elif not lo <= v <= hi:
                bad.append(f"{name}: {k} {v:g} is not {what}")
        if s.get("nvlink_gbs_per_link") and not s.get("nvlink_source"):
            bad.append(f"{name}: NVLink rate without a source")
        if not isinstance(s.get("floors"), dict) or set(s["floors"]) != {"d2d", "gemm"}:
            bad.append(f"{name}: needs floors for d2d and gemm")
        floors(name, s.get("floors") or {})
    return bad


def brief(v) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 60 else text[:59] + "…"


def derive_floor(ratios: list[float], margin: float = MARGIN) -> dict:
    """{healthy, floor} from the ratios of healthy runs (docs/deep.md): healthy is the lowest run's ratio rounded to
    0.01 (the card does at least that on a normal day), the floor MARGIN of it rounded down to 0.01 (twice the 5 %
    run-to-run spread the H200 showed)."""
    if not ratios:
        raise ValueError("no runs")
    healthy = round(min(ratios), 2)
    return {"healthy": healthy, "floor": math.floor(round(healthy * margin * 100, 6)) / 100}
