"""Suspect cells: a level during which the host changed is measured, but its numbers are not trusted.

A record is suspect (its `suspect` field: a list of {reason, kind, t}, t in seconds from the level's start) when its
host_health section shows, during the level:
- a new Xid (NVML event or kernel log line)                              `xid: true`
- new ECC errors (volatile, corrected + uncorrected) >= `ecc_errors`      default 1 (0: off)
- newly remapped rows >= `remapped_rows`                                  default 1 (0: off)
- PCIe replays >= `pcie_replays`                                          default 0 (off: replays are retried links)
- a clock event in `clock_reasons`                                         default hw_slowdown, hw_thermal_slowdown,
                                                                           hw_power_brake_slowdown, sw_thermal_slowdown
- a process on a serving GPU that is not the server's                     `foreign_processes: true`
- busy SM clocks (samples without the gpu_idle reason) under
  (1 - `sm_clock_drop`) x the level's own busy median                     default 0.10 (0: off)
Each is a key of the campaign's `suspect:` section (docs/bench.md). A suspect record stays `ok` with its metrics, is
listed apart in report.md and never averaged into tables or speedups; `bench run --rerun-suspect` measures it again.
"""

from __future__ import annotations

from gpudoctor.bench.cell.health import REASONS

DEFAULTS = {"xid": True, "ecc_errors": 1, "remapped_rows": 1, "pcie_replays": 0,
            "clock_reasons": ["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"],
            "foreign_processes": True, "sm_clock_drop": 0.10}
KEYS = set(DEFAULTS)


def check(raw, fail) -> dict:
    """The campaign's `suspect:` mapping validated: `fail(msg, *where)` raises the FILE:LINE error."""
    if raw is None:
        return dict(DEFAULTS)
    if not isinstance(raw, dict):
        fail("suspect must be a mapping", "suspect")
    out = dict(DEFAULTS)
    for k, v in raw.items():
        if k not in KEYS:
            fail(f"unknown key {k!r} in suspect (allowed: {', '.join(sorted(KEYS))})", "suspect", k)
        if k in ("xid", "foreign_processes"):
            if not isinstance(v, bool):
                fail(f"suspect.{k} must be true or false, got {v!r}", "suspect", k)
        elif k == "clock_reasons":
            names = set(REASONS.values()) - {"gpu_idle"}
            if not isinstance(v, list) or not all(isinstance(x, str) and x in names for x in v):
                fail(f"suspect.clock_reasons must be a list of NVML clock event reasons ({', '.join(sorted(names))}),"
                     f" got {v!r}", "suspect", k)
        elif k == "sm_clock_drop":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
                fail(f"suspect.sm_clock_drop must be a fraction in [0, 1), got {v!r}", "suspect", k)
        else:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                fail(f"suspect.{k} must be a whole number >= 0 (0: off), got {v!r}", "suspect", k)
        out[k] = v
    return out


def judge(health: dict | None, thresholds: dict | None = None) -> list[dict] | None:
    """The reasons this level is suspect (first occurrence of each), or None when nothing changed that was seen."""
    if not health:
        return None
    th = {**DEFAULTS, **(thresholds or {})}
    out: list[dict] = []
    seen: set[tuple] = set()

    def add(kind: str, t, reason: str, key) -> None:
        if (kind, key) not in seen:
            seen.add((kind, key))
            out.append({"kind": kind, "t": t, "reason": reason})

    for e in health.get("events") or []:
        where = f"GPU {e['gpu']}" if e.get("gpu") is not None else (e.get("bus_id") or "a GPU")
        if e["kind"] == "xid" and th["xid"]:
            add("xid", e["t"], f"Xid {e['xid']} on {where} ({e.get('source')}) at {e['t']:.1f} s", e["xid"])
        elif e["kind"] == "clock_event" and e["reason"] in th["clock_reasons"]:
            add("clock_event", e["t"], f"clock event {e['reason']} on {where} at {e['t']:.1f} s", e["reason"])
        elif e["kind"] == "foreign_process" and th["foreign_processes"]:
            name = f" ({e['name']})" if e.get("name") else ""
            add("foreign_process", e["t"], f"foreign process pid {e['pid']}{name} on {where} at {e['t']:.1f} s, "
                f"{e.get('used_mib') if e.get('used_mib') is not None else '?'} MiB", e["pid"])
    for gpu, g in (health.get("gpus") or {}).items():
        d = g.get("deltas") or {}
        ecc = sum(d.get(k) or 0 for k in ("ecc_corrected", "ecc_uncorrected"))
        if th["ecc_errors"] and ecc >= th["ecc_errors"]:
            add("ecc", None, f"{ecc} new ECC error(s) on GPU {gpu} during the level", gpu)
        rows = sum(d.get(k) or 0 for k in ("remapped_corr", "remapped_unc"))
        if th["remapped_rows"] and rows >= th["remapped_rows"]:
            add("remapped_rows", None, f"{rows} newly remapped row(s) on GPU {gpu}", gpu)
        rep = d.get("pcie_replay") or 0
        if th["pcie_replays"] and rep >= th["pcie_replays"]:
            add("pcie_replay", None, f"{rep} PCIe replay(s) on GPU {gpu}", gpu)
        med = g.get("sm_mhz_busy_median")
        drop = th["sm_clock_drop"]
        if drop and med:
            low = next((p for p in g.get("sm_mhz_series") or [] if not p[2] and p[1] < (1 - drop) * med), None)
            if low is not None:
                add("sm_clock", low[0], f"SM clock {low[1]} MHz on GPU {gpu} at {low[0]:.1f} s, under "
                    f"{1 - drop:.0%} of the level's busy median {med:g} MHz", gpu)
    return out or None
