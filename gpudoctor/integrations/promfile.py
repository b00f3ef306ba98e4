"""Prometheus text output of check results: for node_exporter's textfile collector (`--prom FILE`).

The file is written atomically (temp file beside it, then rename) so the collector never reads half a file;
the temp name ends in `.tmp`, which the collector ignores. The daemon's /metrics uses the same names.
"""

from __future__ import annotations

import os


# Nagios order, as in exit codes: 0 ok (and info), 1 warn, 2 fail, 3 unknown.
STATUS_VALUE = {"ok": 0, "info": 0, "warn": 1, "fail": 2, "unknown": 3}


def status_value(status) -> int:
    """The numeric value of a status for a gauge."""
    return STATUS_VALUE.get(getattr(status, "value", status), 3)


def label(value) -> str:
    """A label value the exposition can encode: text that is not valid UTF-8 (a lone surrogate, as a snapshot's JSON
    may carry in a host name) is escaped (`\\udc80`), never a traceback."""
    s = str(value)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        s = s.encode("utf-8", "backslashreplace").decode("utf-8")
    return s


def _finding_rows(findings):
    """(check id, subject, status) per finding; the same (id, subject) twice keeps the worst."""
    rows: dict[tuple[str, str], int] = {}
    for f in findings:
        key = (f.id, f.subject or "")
        rows[key] = max(rows.get(key, 0), status_value(f.status))
    return rows


def _deep_rows(findings):
    """(gpu, kind, ratio, floor) of each deep-tier figure that has a limit (fabric.deep.figure's data)."""
    for f in findings:
        d = f.data or {}
        if f.id == "fabric.deep.figure" and d.get("ratio") is not None:
            kind = d["kind"] + (f"-{d['peer']}" if d.get("peer") is not None else "")
            yield str(d.get("gpu")), kind, d["ratio"], d.get("floor")


def render(results, *, now: float | None = None) -> str:
    """Text exposition for a list of host results.

    Each result is a mapping with: host (str), status (ok|warn|fail|unknown|unreachable|error),
    findings (list of Finding; empty when the host could not be checked), duration_s, timestamp.
    """
    from prometheus_client import CollectorRegistry, Gauge
    from prometheus_client.exposition import generate_latest

    reg = CollectorRegistry()
    check = Gauge("gpudoctor_check_status", "Check status: 0 ok, 1 warn, 2 fail, 3 unknown.",
                  ["host", "check", "subject"], registry=reg)
    verdict = Gauge("gpudoctor_host_status", "Host verdict: 0 ok, 1 warn, 2 fail, 3 unknown or unreachable.",
                    ["host"], registry=reg)
    up = Gauge("gpudoctor_host_up", "1 when gpudoctor could reach and probe the host.", ["host"], registry=reg)
    last = Gauge("gpudoctor_last_run_timestamp_seconds", "When the host was last checked (Unix time).", ["host"],
                 registry=reg)
    dur = Gauge("gpudoctor_check_duration_seconds", "Wall time of the last check of the host.", ["host"], registry=reg)
    ratio = Gauge("gpudoctor_gpu_bandwidth_ratio", "Deep tier (--deep): a GPU's measured figure over its physical "
                  "limit (h2d/d2h: the link's max gen and width; d2d: the SKU's memory bandwidth; gemm: its dense bf16 "
                  "peak; p2p: the pair's link).", ["host", "gpu", "kind"], registry=reg)
    floor = Gauge("gpudoctor_gpu_bandwidth_floor", "Deep tier: the ratio a healthy GPU of that SKU reaches at least "
                  "(gpudoctor/data/gpu_skus.json).", ["host", "gpu", "kind"], registry=reg)
    for r in results:
        host = label(r["host"])
        for gpu, kind, rt, fl in _deep_rows(r.get("findings") or []):
            ratio.labels(host, label(gpu), label(kind)).set(rt)
            if fl is not None:
                floor.labels(host, label(gpu), label(kind)).set(fl)
        st = r["status"]
        reachable = st not in ("unreachable", "error")
        up.labels(host).set(1 if reachable else 0)
        verdict.labels(host).set(status_value(st) if reachable else 3)
        ts = r.get("timestamp") if r.get("timestamp") is not None else now
        if ts is not None:
            last.labels(host).set(ts)
        if r.get("duration_s") is not None:
            dur.labels(host).set(r["duration_s"])
        for (cid, subject), value in sorted(_finding_rows(r.get("findings") or []).items()):
            check.labels(host, label(cid), label(subject)).set(value)
    return generate_latest(reg).decode()


def write_prom(path: str | os.PathLike, results, *, now: float | None = None) -> None:
    """Write the text exposition to `path` atomically (mode 0644, readable by node_exporter), never through a link
    planted at its name or on its way (files/safe.py)."""
    from gpudoctor.files import safe

    safe.write_file(path, render(results, now=now), public=True)
