"""Remedy fabric.numa.balancing: automatic NUMA balancing off, now and after reboots.

Now: `sysctl -w kernel.numa_balancing=0`. Kept: /etc/sysctl.d/90-gpudoctor-numa.conf, written through
gpudoctor.files.edit (dated backup, temp file + rename). It refuses inside a container (the setting is host-global and
/proc/sys is read-only there) and when another sysctl file read after ours would turn it back on at boot — that file
is the user's to change. Verify re-reads /proc/sys/kernel/numa_balancing and the file and re-runs the check; rollback
restores the old runtime value and the old file (or removes the one it created).
"""

from __future__ import annotations

import base64
import os

from gpudoctor.files.edit import EditPlan, apply_edit
from gpudoctor.errors import RemedyError
from gpudoctor.findings import Finding, Status
from gpudoctor.gather.tools import SYSCTL_CONF, SYSCTL_NUMA_FILE
from gpudoctor.remedy import Change, Remedy, RemedyContext

from .common import bad, command, in_container, run_check, target_name, tools, verdict

ID = "fabric.numa.balancing"
KEY = "kernel.numa_balancing"
PROC = "/proc/sys/kernel/numa_balancing"
FILE = SYSCTL_NUMA_FILE
CONTENT = (f"# Written by gpudoctor ({ID}): automatic NUMA balancing off for GPU serving (page migration adds\n"
           f"# latency spikes to pinned servers). To undo: remove this file and run `sysctl -w {KEY}=1`.\n"
           f"{KEY} = 0\n")


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode()


def _unb64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


def read_after(path: str) -> bool:
    """Whether systemd-sysctl / `sysctl --system` apply `path` after our file (so its setting wins at boot)."""
    if path == SYSCTL_CONF:
        return True  # procps reads /etc/sysctl.conf last
    return os.path.basename(path) > os.path.basename(FILE)


class NumaBalancing(Remedy):
    id = ID
    summary = f"{KEY}=0 now and in {FILE}"

    def plan(self, facts: dict, ctx: RemedyContext) -> Change | None:
        from gpudoctor.checks.fabric import balancing

        found = bad(run_check(balancing, facts))
        if not found:
            return None
        fab = facts.get("fabric") or {}
        current = fab.get("numa_balancing")
        if in_container(facts) or tools(facts).get("proc_sys_readonly"):
            return self.refuse(f"{KEY} is host-global and this container cannot write it"
                               + (" (/proc/sys is mounted read-only)" if tools(facts).get("proc_sys_readonly") else "")
                               + ": set it on the host")
        sysctl = command(facts, "sysctl")
        if not sysctl:
            return self.refuse(f"sysctl is not on PATH on {target_name(facts)} (procps)")
        f = (tools(facts).get("files") or {}).get(FILE)
        if f is None:
            return self.refuse(f"the current content of {FILE} was not gathered (facts without 'tools'): re-gather")
        if f.get("error") not in (None, "ENOENT"):
            return self.refuse(f"cannot read {FILE} ({f['error']})")
        others = [s for s in tools(facts).get("sysctl_numa") or [] if s["path"] != FILE]
        later = [s for s in others if s["value"] != "0" and read_after(s["path"])]
        if later:
            return self.refuse("; ".join(f"{s['path']}:{s['line']} sets {KEY} = {s['value']}" for s in later)
                               + f" and is read after {FILE}, so it would turn balancing back on at boot: change "
                                 f"that line (gpudoctor does not edit other tools' files)")
        before = None if f.get("text") is None else f["text"].encode("utf-8", "surrogateescape")
        after = CONTENT.encode()
        edit = EditPlan(FILE, before, after)
        diff = (f"--- {PROC} (before)\n+++ {PROC} (after)\n-{current}\n+0\n" if current != "0" else "") + edit.diff
        overridden = [s for s in others if s["value"] != "0"]
        summary = (f"{KEY}: {current} → 0 now" if current != "0" else f"{KEY} is already 0 now") + \
            (f", and {FILE} keeps it at boot" if edit.changed else "")
        if overridden:
            summary += " (overrides " + ", ".join(f"{s['path']}:{s['line']}" for s in overridden) + ")"
        commands = [f"sysctl -w {KEY}=0"] if current != "0" else []
        return Change(ID, target_name(facts), summary, diff=diff, commands=commands, risk="low",
                      fixes=[x.key for x in found],
                      data={"sysctl": sysctl, "runtime_before": current, "before_b64": _b64(before),
                            "after_b64": _b64(after), "numa_nodes": fab.get("numa_nodes") or {}})

    def apply(self, host, change: Change, ctx: RemedyContext) -> dict:
        d, t = change.data, ctx.timeout
        before, after = _unb64(d["before_b64"]), _unb64(d["after_b64"])
        if before is None:
            host.makedirs(os.path.dirname(FILE), 0o755, t)
        res = apply_edit(host, EditPlan(FILE, before, after), backup_dir=ctx.backup_dir, timeout=t,
                         validate=lambda data: None if data == after else "content differs from the plan")
        r = host.read_file(PROC, timeout=t)
        if not r.ok:
            raise RemedyError(f"cannot read {PROC} ({r.error}); {FILE} was written"
                              + (f" (backup {res.backup})" if res.backup else ""))
        runtime = r.text.strip()
        rt_changed = False
        if runtime != "0":
            out = host.run([d["sysctl"], "-w", f"{KEY}=0"], timeout=t)
            if not out.ok:
                raise RemedyError(out.describe())
            rt_changed = True
        return {"changed": res.changed or rt_changed, "backup": res.backup, "file_changed": res.changed,
                "runtime_before": runtime, "runtime_changed": rt_changed}

    def verify(self, host, change: Change, ctx: RemedyContext) -> Finding:
        from gpudoctor.checks.fabric import balancing

        r = host.read_file(PROC, timeout=ctx.timeout)
        if not r.ok:
            return Finding(ID, Status.UNKNOWN, f"cannot re-read {PROC} ({r.error})")
        facts = {"fabric": {"gpus": [], "numa_balancing": r.text.strip(), "numa_nodes": change.data["numa_nodes"]}}
        found = run_check(balancing, facts)
        f = host.read_file(FILE, timeout=ctx.timeout)
        if f.data != _unb64(change.data["after_b64"]):
            found.append(Finding(ID, Status.FAIL, f"{FILE} does not hold the planned content after the change",
                                 evidence=[f"re-read {FILE} → {f.error or f'{len(f.data)} bytes, different'}"]))
        return verdict(found, ID, f"{KEY} is 0 and {FILE} keeps it", "numa_balancing is not off")

    def rollback(self, host, change: Change, ctx: RemedyContext, applied: dict) -> dict:
        d, t, done = change.data, ctx.timeout, []
        if applied.get("runtime_changed"):
            old = applied.get("runtime_before") or d["runtime_before"]
            out = host.run([d["sysctl"], "-w", f"{KEY}={old}"], timeout=t)
            if not out.ok:
                raise RemedyError(out.describe())
            done.append(f"sysctl -w {KEY}={old}")
        if applied.get("file_changed"):
            before, after = _unb64(d["before_b64"]), _unb64(d["after_b64"])
            if before is None:
                cur = host.read_file(FILE, timeout=t)
                if cur.data == after:
                    host.unlink(FILE, t)
                    done.append(f"removed {FILE}")
                else:
                    raise RemedyError(f"{FILE} changed since gpudoctor wrote it: not removing it")
            else:
                res = apply_edit(host, EditPlan(FILE, after, before), backup_dir=ctx.backup_dir, timeout=t)
                done.append(f"restored {FILE}" + (f" (backup of ours: {res.backup})" if res.backup else ""))
        return {"changed": bool(done), "restored": done}
