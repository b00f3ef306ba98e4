"""Result records: one per (label, workload, concurrency or request rate, trial), appended to DIR/results.jsonl atomically.

A record is `ok` only when every request completed with output; otherwise it is `crashed` (the server died), `error`
(requests failed, the server hung, or the level timed out) or `skipped` (not sent, with the reason). Metrics of a record
that is not ok are null, never zeros, so nothing downstream can mistake a failure for a measurement.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from gpudoctor.files.atomic import append_jsonl_atomic
from gpudoctor.files.safe import output_mode
from gpudoctor.host import ops as fs  # the mutation seam (tests/crash)

SCHEMA = "gpudoctor.bench/3"
# /3 added per_request and steady (every level: the per-request series and its steady window), provenance (what
# produced the record) and server_counters (the server's own Prometheus counters over the level); /2 added
# host_health, suspect and cache (every level), multi_turn, trace and per_prompt (their workloads);
# /1 and /2 records (without them) still load, report and compare.
SCHEMAS = ("gpudoctor.bench/1", "gpudoctor.bench/2", SCHEMA)
OK, CRASHED, ERROR, SKIPPED = "ok", "crashed", "error", "skipped"
STATUSES = (OK, CRASHED, ERROR, SKIPPED)
METRICS = ("output_tok_per_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "e2e_ms_p50", "accept_length",
           "output_tokens", "duration_s", "prompt_tokens_mean", "goodput_req_per_s", "slo_ok_fraction",
           "connect_ms_p50", "headers_ms_p50", "achieved_req_per_s", "send_late_ms_p50", "send_late_ms_p99")
FIELDS = ("label", "method", "tp", "workload", "context_len", "max_tokens", "concurrency", "request_rate", "arrival",
          "api", "trial", "status", "requests", "completed", "failed", "error_rate", *METRICS, "itl_source",
          "transport_note", "error", "cause", "diagnosis", "fix", "heal", "log_excerpt", "suspect")
# Kept out of tables (long text); report.md lists them under the failed levels instead.
DETAIL_FIELDS = ("diagnosis", "fix", "log_excerpt")


MAX_BYTES = 512 << 20
_INT_FIELDS = ("tp", "context_len", "max_tokens", "requests", "completed", "output_tokens")


def check_record(rec, path: str, line: int) -> None:
    """A record as ResultStore.append writes it: its identity, a known status, numbers that are finite or null."""
    from gpudoctor.errors import InputError
    from gpudoctor.files.inputs import brief

    def bad(msg: str):
        raise InputError(f"result record {msg}", path=path, line=line)

    if not isinstance(rec, dict):
        bad(f"must be a JSON object, got {type(rec).__name__}")
    if rec.get("schema", SCHEMA) not in SCHEMAS:
        bad(f"has schema {brief(rec.get('schema'), 40)}, expected one of {', '.join(SCHEMAS)}")
    for k in ("label", "workload"):
        if not isinstance(rec.get(k), str) or not rec[k]:
            bad(f"needs {k} (a non-empty string), got {brief(rec.get(k), 40)}")
    for k, lo in (("concurrency", 1), ("trial", 0)):
        v = rec.get(k, 0 if k == "trial" else None)
        if k == "concurrency" and v is None and rec.get("request_rate") is not None:
            continue  # an open-loop level: paced by its rate, no cap on requests in flight
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            bad(f"needs {k} (an integer >= {lo}), got {brief(v, 40)}")
    rate = rec.get("request_rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate)
                             or rate <= 0):
        bad(f"request_rate must be a number > 0 or null, got {brief(rate, 40)}")
    if rec.get("status") not in STATUSES:
        bad(f"status must be one of {', '.join(STATUSES)}, got {brief(rec.get('status'), 40)}")
    for k in (*METRICS, *_INT_FIELDS):
        v = rec.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (
                v < 0 and not k.startswith("send_late")):  # a send can be early; nothing else is negative
            bad(f"{k} must be a finite number{'' if k.startswith('send_late') else ' >= 0'} or null, "
                f"got {brief(v, 40)}")
    for k in ("method", "error", "log_excerpt"):
        if rec.get(k) is not None and not isinstance(rec[k], str):
            bad(f"{k} must be a string or null, got {type(rec[k]).__name__}")
    sus = rec.get("suspect")
    if sus is not None and (not isinstance(sus, list) or not all(isinstance(x, dict) and isinstance(x.get("reason"), str)
                                                                 for x in sus)):
        bad("suspect must be null or a list of {reason, kind, t}")
    for k in ("host_health", "cache", "multi_turn", "trace", "per_prompt", "per_request", "steady", "provenance",
              "server_counters"):
        if rec.get(k) is not None and not isinstance(rec[k], dict):
            bad(f"{k} must be an object or null, got {type(rec[k]).__name__}")


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation, like numpy's default; None for no values."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def key(rec: dict) -> tuple:
    """The identity of a record: a rerun must never add a second record with the same key. A closed-loop level is
    keyed by its concurrency, an open-loop one by its request rate too (records without one read as None)."""
    return (rec.get("label"), rec.get("workload"), rec.get("concurrency"), rec.get("trial", 0),
            rec.get("request_rate"))


class ResultStore:
    """DIR/results.jsonl. Every append rewrites the file atomically, so a kill leaves whole records only."""

    def __init__(self, out_dir: str | Path):
        self.dir = Path(out_dir)
        self.path = self.dir / "results.jsonl"
        self.stamp: dict = {}  # fields every record appended from now on carries (e.g. {"heal": {...}} after a heal)
        # provenance every record appended from now on carries, measured or not (a Slurm job: {"slurm": {node, job}})
        self.provenance_stamp: dict = {}

    def load(self) -> list[dict]:
        """Every record, each checked (check_record); a truncated or wrong-shaped line is InputError FILE:LINE."""
        if not self.path.exists():
            return []
        from gpudoctor.files.inputs import read_jsonl

        out = []
        for n, rec in read_jsonl(self.path, what="results file", item="result record", max_bytes=MAX_BYTES,
                                objects=False):
            check_record(rec, str(self.path), n)
            out.append(rec)
        return out

    def keys(self) -> set[tuple]:
        return {key(r) for r in self.load()}

    def ours(self) -> None:
        """Before the first write: DIR is created, or refused when another user owns or can write it."""
        if not getattr(self, "_ours", False):
            import os

            from gpudoctor.files import safe

            os.close(safe.owned_dir(str(self.dir)))
            self._ours = True

    def append(self, rec: dict) -> dict:
        self.ours()
        fs.fs_makedirs(str(self.dir))
        if key(rec) in self.keys():
            raise ValueError(f"duplicate result record {key(rec)}")
        rec = {"schema": SCHEMA, **rec, **self.stamp}
        if self.provenance_stamp:
            rec["provenance"] = {**(rec.get("provenance") or {}), **self.provenance_stamp}
        for f in FIELDS:
            rec.setdefault(f, None)
        if rec["status"] != OK:
            for m in METRICS:
                if m != "prompt_tokens_mean":
                    rec[m] = None
            if isinstance(rec.get("steady"), dict):  # a failed level has no steady state to report
                rec["steady"] = {"status": "not_measured", "why": f"the level is {rec['status']}"}
        append_jsonl_atomic(self.path, [rec], mode=output_mode())
        return rec

    def retract(self, keys: list[tuple], why: str) -> list[dict]:
        """Take records out (they measured a broken target, not the method) so their levels run again: the file is
        rewritten atomically without them, and they are appended to DIR/retracted.jsonl with the reason — nothing
        is lost, and no key is ever in results.jsonl twice."""
        from gpudoctor.files.atomic import atomic_write

        keys = set(keys)
        recs = self.load()
        gone = [{**r, "retracted": why} for r in recs if key(r) in keys]
        if not gone:
            return []
        self.ours()
        kept_before = self.dir / "retracted.jsonl"  # a run killed between the two writes retracts them again:
        seen = set(kept_before.read_text().splitlines()) if kept_before.exists() else set()  # once is enough
        fresh = [g for g in gone if json.dumps(g, sort_keys=True) not in seen]
        if fresh:
            append_jsonl_atomic(kept_before, fresh, mode=output_mode())
        kept = "".join(json.dumps(r, sort_keys=True) + "\n" for r in recs if key(r) not in keys)
        atomic_write(self.path, kept, mode=output_mode())
        return gone
