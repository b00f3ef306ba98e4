"""Checks on model weights in tmpfs: complete, staged this boot (or wiped by a reboot), room, memory cgroup.

Pure functions over facts["model"] (gpudoctor/gather/model.py); one finding per configured model path.
"""

from __future__ import annotations

import datetime as _dt

from gpudoctor.checkreg import check
from gpudoctor.findings import Finding, Status
from gpudoctor.model import human_bytes


# Problems that a wiped tmpfs or an interrupted stage leaves: files not there. Anything else (a short or damaged file
# still present) cannot follow from a wipe.
_GONE = ("missing", "metadata_only", "empty", "dangling_symlink")
STAGE_REMEDY = "model.stage"  # remedies/model_stage.py: `gpudoctor fix` restages from the marker's/record's source
MARKER = ".gpudoctor-staged.json"
CGROUP_WARN_SHARE = 0.85  # the model's tmpfs pages above this share of the memory limit leave the server too little


def _paths(facts: dict):
    m = facts.get("model") or {}
    return m, [p for p in m.get("paths") or [] if isinstance(p, dict) and p.get("path")]


def _b(n) -> str:
    return f"{human_bytes(n)} ({n} bytes)" if isinstance(n, int) else "?"


def _when(ts) -> str:
    try:
        return _dt.datetime.fromtimestamp(float(ts)).strftime("%Y-%m-%d %H:%M")
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def _short(bid) -> str:
    return (bid or "?")[:8]


def _stage_hint(p: dict) -> str:
    rec = p.get("record") or {}
    marker = (p.get("verify") or {}).get("marker") or {}
    src = rec.get("source") or marker.get("source")
    if not src:
        return (f"copy it again from its source (no marker or stage record names one), or stage it: "
                f"gpudoctor model stage --from <source directory> --to {p['path']} --apply")
    return f"gpudoctor model stage --from {src} --to {p['path']} --apply"


def _memory_hint(facts: dict, short: int, limit: int) -> str:
    """Raise the limit by what is missing; the Proxmox command only where the container is known to be one."""
    vmid = (facts.get("boundary") or {}).get("vmid")
    more = f" by at least {human_bytes(short)}" if short > 0 else ""
    mib = -(-(limit + max(short, 0)) // 2**20)
    how = (f" (on its Proxmox node: `pct set {vmid} --memory {mib}`)" if vmid is not None else "")
    return f"raise the container's memory limit{more}{how}, or stage to disk"


def _tmpfs(p: dict) -> bool:
    return bool((p.get("mount") or {}).get("tmpfs"))


def _unknown(cid: str, p: dict, m: dict) -> Finding:
    return Finding(cid, Status.UNKNOWN, f"could not probe {p['path']}: {m.get('error')}", subject=p["path"],
                   evidence=[str(m.get("error"))])


def _problem_line(pr: dict, base: str = "") -> str:
    kind, f = pr.get("kind"), pr.get("file") or ""
    if f and base:
        f = f"{base.rstrip('/')}/{f}"
    if kind == "hash_mismatch":
        return f"{f}: hash {pr.get('actual')} != {pr.get('expected')}"
    sizes = ""
    if pr.get("expected") is not None or pr.get("actual") is not None or kind in ("missing", "truncated"):
        exp = _b(pr["expected"]) if pr.get("expected") is not None else "?"
        act = _b(pr["actual"]) if pr.get("actual") is not None else "absent"
        sizes = f": expected {exp}, actual {act}"
    detail = f" ({pr['detail']})" if pr.get("detail") else ""
    return f"{kind} {f}{sizes}{detail}".replace("  ", " ")


def expected_total(p: dict) -> int | None:
    """The model's full size: from the marker, else the stage record, else the index (tensor bytes, a lower bound)."""
    v = p.get("verify") or {}
    for src in (v.get("marker") or {}, p.get("record") or {}):
        if isinstance(src.get("total_bytes"), int):
            return src["total_bytes"]
    its = (v.get("weights") or {}).get("index_total_size")
    return its if isinstance(its, int) else None


def missing_bytes(p: dict) -> int | None:
    """Bytes a restage must still write (0 when complete); from the index alone a lower bound (tensor data)."""
    v = p.get("verify") or {}
    if v.get("complete"):
        return 0
    for src in (v.get("marker") or {}, p.get("record") or {}):
        if isinstance(src.get("total_bytes"), int):
            return max(0, src["total_bytes"] - int(v.get("bytes") or 0))
    w = v.get("weights") or {}
    if isinstance(w.get("index_total_size"), int):
        return max(0, w["index_total_size"] - int(w.get("data_bytes") or 0))
    return None


@check("workload.model.complete", summary="Every shard of the model is present and whole by its safetensors header",
       depends_on=("workload.model.staged_this_boot",), remedy=STAGE_REMEDY)
def check_complete(facts: dict):
    """config.json present; every shard the index names present and whole by its own header (size == 8 + N + max
    data_offsets end) — no tensor data read; HF cache: refs/main -> snapshot, no dangling symlink, no *.incomplete
    blob; every file listed in the staging marker still there. A failure names each file with expected vs actual
    size. When the model was wiped from tmpfs, workload.model.staged_this_boot is the root cause."""
    m, paths = _paths(facts)
    out = []
    for p in paths:
        if m.get("error"):
            out.append(_unknown("workload.model.complete", p, m))
            continue
        v = p.get("verify") or {}
        kind, path = v.get("kind"), p["path"]
        ev = []
        if kind == "not_found":  # a reboot, a wipe or no stage at all explains a missing directory
            out.append(Finding("workload.model.complete", Status.FAIL, f"model directory {path} does not exist",
                               subject=path, evidence=[f"stat({path}) → {v.get('bad_input')}"],
                               hint=_stage_hint(p), data={"kind": kind}))
            continue
        if v.get("bad_input"):
            out.append(Finding("workload.model.complete", Status.FAIL, f"{path} is not a model: {v['bad_input']}",
                               subject=path, evidence=[f"{path}: {v['bad_input']}"],
                               hint="point the inventory's model path at the model directory", data={"kind": kind}))
            continue
        w = v.get("weights") or {}
        secs = float(v.get("seconds") or 0)
        if v.get("complete"):
            via = f" named by {w['index']}" if w.get("index") else ""
            ev.append(f"{path}: {len(v.get('files') or {})} files, {_b(v.get('bytes'))}; {w.get('shards')} weight "
                      f"file(s){via}, each size == 8 + N + max data_offsets end (checked in {secs * 1000:.1f} ms)")
            who = v.get("others_control")
            if who:  # the one rule (files/trust.py's refusal), the one `model stage` applies to its DST
                ev.append(f"{who}: contents can change after verification")
                out.append(Finding("workload.model.complete", Status.FAIL,
                                   f"{path}: complete now, but another user can change it ({who}); gpudoctor does "
                                   "not pass as root a model directory it would refuse to stage into",
                                   subject=path, evidence=ev, hint="stage it into a directory of root's: gpudoctor "
                                   f"model stage --from {path} --to DST --apply",
                                   data={"bytes": v.get("bytes"), "shards": w.get("shards"), "others_control": who}))
                continue
            out.append(Finding("workload.model.complete", Status.OK,
                               f"{path}: complete, {w.get('shards')} shard(s), {human_bytes(v.get('bytes'))}",
                               subject=path, evidence=ev, data={"bytes": v.get("bytes"), "shards": w.get("shards")}))
            continue
        probs = v.get("problems") or []
        counts: dict = {}
        for pr in probs:
            counts[pr.get("kind")] = counts.get(pr.get("kind"), 0) + 1
        what = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(counts.items()))
        base = v.get("dir") or path
        ev = [_problem_line(pr, base) for pr in probs[:12]]
        if len(probs) > 12:
            ev.append(f"... and {len(probs) - 12} more")
        # Files that are gone follow from a wiped tmpfs or an interrupted stage; a truncated or damaged file that is
        # still there does not (a reboot takes everything): that is its own fault, whatever the provenance.
        gone_only = all(pr.get("kind") in _GONE for pr in probs)
        out.append(Finding("workload.model.complete", Status.FAIL, f"{path}: model incomplete ({what})",
                           subject=path, evidence=ev, hint=_stage_hint(p),
                           data={"problems": probs, "missing_bytes": missing_bytes(p)},
                           explained_by=None if gone_only else ()))
    return out or None


@check("workload.model.staged_this_boot",
       summary="A model in tmpfs was staged this boot; tells 'wiped by reboot' from 'never staged'",
       remedy=STAGE_REMEDY)
def check_staged_this_boot(facts: dict):
    """For a model on tmpfs (or one gpudoctor staged): compares the boot id in DST/.gpudoctor-staged.json, and in the
    persistent stage record (/var/lib/gpudoctor/staged/, which survives reboots), with
    /proc/sys/kernel/random/boot_id. Tells apart: staged this boot (ok); wiped by a reboot (record from another
    boot); wiped without a reboot (container restart: same boot id, files gone); an interrupted stage; never
    staged; staged by hand (info)."""
    m, paths = _paths(facts)
    out = []
    cid = "workload.model.staged_this_boot"
    boot = m.get("boot_id")
    for p in paths:
        if m.get("error"):
            out.append(_unknown(cid, p, m))
            continue
        v = p.get("verify") or {}
        if v.get("bad_input") and v.get("kind") != "not_found":
            continue  # not a model at all: workload.model.complete says so
        marker, rec = v.get("marker"), p.get("record")
        if not (_tmpfs(p) or marker or rec):
            continue  # on disk and never staged: reboots do not matter
        path, ok = p["path"], bool(v.get("complete"))
        ev = [f"/proc/sys/kernel/random/boot_id = {boot}"]
        if marker:
            ev.append(f"{path}/{MARKER}: boot_id {marker.get('boot_id')}, staged {_when(marker.get('staged_at'))} "
                      f"from {marker.get('source')}")
        else:
            ev.append(f"{path}/{MARKER}: {v.get('marker_error') or 'absent'}")
        if rec:
            ev.append(f"{p.get('record_path')}: state {rec.get('state')}, boot_id {rec.get('boot_id')}, "
                      f"at {_when(rec.get('at'))}, source {rec.get('source')}")
        else:
            ev.append("no persistent stage record (/var/lib/gpudoctor/staged)")
        if marker:
            if marker.get("boot_id") == boot:
                st, summ = (Status.OK, f"{path}: staged this boot ({_when(marker.get('staged_at'))})") if ok else (
                    Status.FAIL, f"{path}: staged this boot but files went missing since")
            else:
                st, summ = (Status.OK, f"{path}: staged in an earlier boot and still whole (not a volatile tmpfs?)") \
                    if ok else (Status.FAIL, f"{path}: staged in an earlier boot ({_short(marker.get('boot_id'))}) "
                                f"and incomplete now")
        elif rec and rec.get("state") == "staging" and not ok:
            st = Status.FAIL
            summ = (f"{path}: a stage started {_when(rec.get('at'))} did not finish"
                    + (" and the host rebooted since" if rec.get("boot_id") != boot else " (interrupted)"))
        elif rec and not ok:
            st = Status.FAIL
            if rec.get("boot_id") != boot:
                summ = (f"{path}: wiped by a reboot — staged {_when(rec.get('staged_at') or rec.get('at'))} in boot "
                        f"{_short(rec.get('boot_id'))}, this is boot {_short(boot)}")
            else:
                summ = (f"{path}: staged {_when(rec.get('staged_at') or rec.get('at'))} this boot, but the marker and "
                        "files are gone (container restart or removed by hand)")
        elif rec and ok:
            st, summ = Status.WARN, f"{path}: complete, but its staging marker is gone (copied by hand since?)"
        elif ok:
            st, summ = Status.INFO, f"{path}: complete, but not staged by gpudoctor (no marker): boot-safety unknown"
        elif v.get("kind") == "not_found":
            st, summ = Status.FAIL, f"{path}: never staged (no marker, no stage record)"
        else:  # files are there, put by someone else: how they came is context, the fault is what complete found
            st, summ = Status.INFO, (f"{path}: not staged by gpudoctor (no marker, no stage record): copied by hand "
                                     "or by another tool, so its source is unknown")
        hint = None if st in (Status.OK, Status.INFO) else _stage_hint(p)
        out.append(Finding(cid, st, summ, subject=path, evidence=ev, hint=hint,
                           data={"boot_id": boot, "marker_boot_id": (marker or {}).get("boot_id"),
                                 "record": rec}))
    return out or None


@check("workload.model.tmpfs_room",
       summary="The tmpfs holding the model has room (and RAM) for what is missing",
       depends_on=("workload.model.staged_this_boot",))
def check_tmpfs_room(facts: dict):
    """What a restage must still write (the marker's or record's total minus what is present; from the index alone a
    lower bound) against statvfs avail of the tmpfs and /proc/meminfo MemAvailable (tmpfs lives in RAM)."""
    m, paths = _paths(facts)
    out = []
    cid = "workload.model.tmpfs_room"
    for p in paths:
        if m.get("error"):
            out.append(_unknown(cid, p, m))
            continue
        if not _tmpfs(p):
            continue
        path, mnt, sv = p["path"], p["mount"], p.get("statvfs") or {}
        ev = [f"/proc/mounts: {mnt.get('source')} {mnt.get('mountpoint')} {mnt.get('fstype')} {mnt.get('options')}"]
        if "avail" not in sv:
            out.append(Finding(cid, Status.UNKNOWN, f"statvfs({p.get('nearest_existing')}) failed: {sv.get('error')}",
                               subject=path, evidence=ev))
            continue
        ev.append(f"statvfs({p.get('nearest_existing')}): total {_b(sv['total'])}, avail {_b(sv['avail'])}")
        need = missing_bytes(p)
        mem_avail = (m.get("meminfo") or {}).get("MemAvailable")
        if isinstance(mem_avail, int):
            ev.append(f"/proc/meminfo MemAvailable = {_b(mem_avail)}")
        if need == 0 and (p.get("verify") or {}).get("complete"):
            out.append(Finding(cid, Status.OK, f"{mnt['mountpoint']}: model in place, {human_bytes(sv['avail'])} "
                                               "left", subject=path, evidence=ev, data={"avail": sv["avail"]}))
            continue
        if need is None:
            out.append(Finding(cid, Status.UNKNOWN, f"{path}: cannot tell how much a restage needs (no marker, no "
                               f"stage record, no index size); {mnt['mountpoint']} has {human_bytes(sv['avail'])}",
                               subject=path, evidence=ev))
            continue
        ev.append(f"restage needs {_b(need)} (expected total {_b(expected_total(p))} minus what is present)")
        short = []
        if need > sv["avail"]:
            short.append(f"{mnt['mountpoint']} has {human_bytes(sv['avail'])} available")
        if isinstance(mem_avail, int) and need > mem_avail:
            short.append(f"MemAvailable is {human_bytes(mem_avail)} (tmpfs lives in RAM)")
        if short:
            out.append(Finding(cid, Status.FAIL, f"{path}: no room to restage {human_bytes(need)}: "
                               + "; ".join(short), subject=path, evidence=ev,
                               hint="free space in the tmpfs (other models?) or grow it: mount -o remount,size=...",
                               data={"need": need, "avail": sv["avail"], "mem_available": mem_avail}))
        else:
            out.append(Finding(cid, Status.OK, f"{path}: room to restage {human_bytes(need)} "
                               f"({human_bytes(sv['avail'])} available)", subject=path, evidence=ev,
                               data={"need": need, "avail": sv["avail"]}))
    return out or None


@check("workload.model.memory_cgroup",
       summary="The memory cgroup can hold the model's tmpfs pages (they count against its limit) and the server")
def check_memory_cgroup(facts: dict):
    """tmpfs pages count against the memory cgroup of whoever wrote them. headroom = min over this process's cgroup
    and its ancestors of memory.max - (memory.current - inactive_file) (cgroup v2; v1 limit_in_bytes/usage_in_bytes).
    Fails when a restage would not fit; warns when the model alone takes over 85 % of the limit."""
    m, paths = _paths(facts)
    out = []
    cid = "workload.model.memory_cgroup"
    cg = m.get("cgroup") or {}
    for p in paths:
        if m.get("error"):
            out.append(_unknown(cid, p, m))
            continue
        if not _tmpfs(p):
            continue
        path = p["path"]
        if cg.get("error"):
            out.append(Finding(cid, Status.UNKNOWN, f"memory cgroup unreadable: {cg['error']}", subject=path,
                               evidence=[cg["error"]]))
            continue
        ev = []
        names = ("memory.max", "memory.current") if cg.get("version") == 2 else (
            "memory.limit_in_bytes", "memory.usage_in_bytes")
        for lvl in cg.get("levels") or []:
            ev.append(f"{lvl['dir']}: {names[0]} = {lvl['max'] if lvl['max'] is not None else 'max'}, {names[1]} = "
                      f"{lvl['current']}, inactive_file = {lvl['inactive_file']}")
        limit, head = cg.get("limit"), cg.get("headroom")
        if limit is None:
            out.append(Finding(cid, Status.OK, f"no memory limit on cgroup {cg.get('path')} or its parents",
                               subject=path, evidence=ev or [f"/proc/self/cgroup: {cg.get('path')}"]))
            continue
        need = missing_bytes(p)
        v = p.get("verify") or {}
        if need:
            ev.append(f"restage needs {_b(need)}; headroom = limit - (usage - inactive_file) = {_b(head)}")
            if need > head:
                out.append(Finding(cid, Status.FAIL, f"{path}: restaging {human_bytes(need)} into tmpfs would exceed "
                                   f"the memory cgroup (headroom {human_bytes(head)} of limit {human_bytes(limit)})",
                                   subject=path, evidence=ev, data={"need": need, "headroom": head, "limit": limit},
                                   hint=_memory_hint(facts, need - head, limit)))
                continue
        model_bytes = expected_total(p) or v.get("bytes") or 0
        share = model_bytes / limit if limit else 0
        ev.append(f"the model takes {_b(model_bytes)} = {share:.0%} of the limit {_b(limit)}")
        if share > CGROUP_WARN_SHARE:
            out.append(Finding(cid, Status.WARN, f"{path}: the model's tmpfs pages take {share:.0%} of the memory "
                               f"limit {human_bytes(limit)}; little is left for the server", subject=path, evidence=ev,
                               data={"share": share, "limit": limit}))
        else:
            out.append(Finding(cid, Status.OK, f"{path}: memory cgroup headroom {human_bytes(head)} "
                               f"(limit {human_bytes(limit)}; model {share:.0%} of it)", subject=path, evidence=ev,
                               data={"share": share, "limit": limit, "headroom": head}))
    return out or None


@check("workload.model.location", summary="Where the model lives: tmpfs (fast, volatile) or disk")
def check_location(facts: dict):
    """The mount holding the model path (longest mount-point prefix in /proc/mounts; the last of equal ones wins)."""
    m, paths = _paths(facts)
    if m.get("error"):
        return None
    out = []
    for p in paths:
        mnt = p.get("mount")
        if not mnt:
            continue
        ev = [f"/proc/mounts: {mnt.get('source')} {mnt.get('mountpoint')} {mnt.get('fstype')} {mnt.get('options')}"]
        if mnt.get("tmpfs"):
            summ = f"{p['path']} is on tmpfs {mnt['mountpoint']}: fast loads, wiped by every reboot"
        else:
            summ = f"{p['path']} is on {mnt['fstype']} {mnt['mountpoint']}, not tmpfs: loads read from disk"
        out.append(Finding("workload.model.location", Status.INFO, summ, subject=p["path"], evidence=ev,
                           data={"fstype": mnt.get("fstype"), "mountpoint": mnt.get("mountpoint")}))
    return out or None
