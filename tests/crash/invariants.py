"""What each writer promises over ALL the files it touches (issue #48, item 2), checked in every kill and power-loss
state by Judge.crashed: one callable per promise, (judge, now, power) -> the breaks found, `now` the state's tree
(keys "ROOT:relative path", timestamps folded). A writer declares its own in tests/crash/writers.py."""

from __future__ import annotations

import json

from gpudoctor.model import probe


def _records(judge, now: dict, power: bool) -> list | None:
    cur = now.get("0:" + judge.w.audit)
    if cur is None or cur[0] != "file":
        return []
    data = cur[1]
    if power and data and not data.endswith(b"\n"):
        data = data[:data.rfind(b"\n") + 1]  # a torn last line: AuditLog.records skips it
    out = []
    for ln in data.splitlines():
        if not ln.strip():
            continue
        try:
            out.append(json.loads(ln))
        except ValueError:
            return None
    return out


def audit_names_every_change(judge, now: dict, power: bool, remedy: str | None = None) -> list[str]:
    """The audit log names every change that happened: a target that changed has a record of this remedy (a
    "started" at least); an outcome "applied"/"unchanged" is never there for a change that is not."""
    recs = _records(judge, now, power)
    if recs is None:
        return ["the audit log holds a torn line"]
    remedy = remedy or judge.w.name
    mine = [r for r in recs if r.get("remedy") == remedy]
    changed = judge.changed(now)
    bad = []
    if changed and not mine:
        bad.append(f"{changed[0]} changed and the audit log names no change of {remedy} (no started record)")
    done = [r for r in mine if r.get("result") in ("applied", "unchanged")]
    if done:
        behind = [t for t in judge.targets() if t not in judge.volatile and not judge.is_log_or_lock(t)
                  and now.get(t) != judge.after.get(t)]
        if behind:
            bad.append(f"the audit log says {done[-1]['result']} but {behind[0]} is not the new content")
    return bad


def backup_before(*patterns: str):
    """The backup exists before the edited file changes: wherever an edited file (matching patterns) differs from
    the world before, a whole backup of what it held is there too."""
    import fnmatch

    def check(judge, now: dict, power: bool) -> list[str]:
        bad = []
        backups = {v[1] for k, v in judge.raw.items() if "gpudoctor/backups/" in k and v[0] == "file"
                   and not judge.is_temp(k)}
        for t in judge.targets():
            path = t.split(":", 1)[1]
            if not any(fnmatch.fnmatchcase(path, p) for p in patterns):
                continue
            old, cur = judge.before.get(t), now.get(t)
            if old is None or old[0] != "file" or cur == old:
                continue
            if old[1] not in backups:
                bad.append(f"{path} changed and no backup holds what it held before")
        return bad

    check.__name__ = f"backup_before({', '.join(patterns)})"
    return check


def marker_vouches(dst: str):
    """A stage marker never vouches for data that is not there and durable: wherever DST's marker parses, every file
    it lists is in DST, a regular file of the listed size."""

    def check(judge, now: dict, power: bool) -> list[str]:
        cur = now.get(f"0:{dst}/{probe.MARKER_NAME}")
        if cur is None or cur[0] != "file":
            return []
        try:
            doc = json.loads(cur[1])
        except ValueError:
            return []  # not a marker: DST verifies as incomplete
        if not isinstance(doc, dict) or doc.get("schema") != probe.MARKER_SCHEMA:
            return []
        bad = []
        for f in doc.get("files") or []:
            got = now.get(f"0:{dst}/{f['name']}")
            if got is None or got[0] != "file":
                bad.append(f"the marker of {dst} vouches for {f['name']}, which is {'absent' if got is None else got[0]}")
            elif len(got[1]) != f["size"]:
                bad.append(f"the marker of {dst} vouches for {f['name']} of {f['size']} bytes; it holds "
                           f"{len(got[1])}")
        return bad

    check.__name__ = f"marker_vouches({dst})"
    return check
