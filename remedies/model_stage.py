"""Remedy model.stage: restage a model that is missing or incomplete in tmpfs (wiped by a reboot, never staged,
interrupted) from its persistent source, with gpudoctor.model.stage — parallel copies into temp names, config and
index last, verified by headers, boot-id marker written last.

The source is the one the user configures (`gpudoctor fix --model-source [DST=]SRC`), else the one the persistent
stage record names (root's state dir, read only when root owns it and nobody else can write it: probe.read_record).
Never the staging marker: it lies inside DST, a directory anyone may have made first in /dev/shm (#40). Plan refuses
when no source is known and when the checks already say the tmpfs or the memory cgroup has no room; apply refuses
(through stage) while a server holds files under DST, and when another user owns DST. On this machine the stage runs
in-process; on a remote host it runs that host's `gpudoctor model stage` (refused when it has none).
Verify re-gathers the model facts and re-runs the model checks; rollback removes the marker (the copy stays, but it is
no longer vouched for), since the state before was a broken model anyway.
"""

from __future__ import annotations

import json
import os

from gpudoctor.errors import RemedyError
from gpudoctor.findings import Finding
from gpudoctor.remedy import Change, Remedy, RemedyContext

from .common import bad, command, errtext, run_check, target_name, verdict

ID = "model.stage"


def _is_local(host) -> bool:
    from gpudoctor.host.local import LocalHost

    return isinstance(host, LocalHost)


def _sources(ctx: RemedyContext) -> dict:
    return dict(ctx.options.get("model_sources") or {})


def no_source(dst: str, p: dict) -> str:
    """Why there is nothing to restage dst from, in one line: where the stage record was looked for and, when a
    record exists in another state directory, where (a gpudoctor that staged with another state directory)."""
    v = p.get("verify") or {}
    named = " (the staging marker inside it is not trusted for this)" if (v.get("marker") or {}).get("source") else ""
    where = ", ".join(p.get("record_dirs") or [])
    looked = f"; looked in {where}" if where else ""
    other = p.get("record_elsewhere")
    also = (f"; a stage record exists in {other}; this gpudoctor reads {where} ($GPUDOCTOR_STATE_DIR): stage and "
            "heal with one state directory" if other else "")
    return (f"{dst}: no source to stage from (no stage record names one{looked}){named}{also}: "
            f"pass --model-source {dst}=SRC")


class ModelStage(Remedy):
    id = ID
    summary = "restage a wiped or incomplete model into tmpfs from its persistent source"

    def plan(self, facts: dict, ctx: RemedyContext) -> Change | None:
        from gpudoctor.checks.workload_model import (check_complete, check_memory_cgroup, check_staged_this_boot,
                                                     check_tmpfs_room, missing_bytes)
        from gpudoctor.model import human_bytes

        m = facts.get("model") or {}
        if m.get("error"):
            return None  # "could not probe": the check says so; nothing to act on
        paths = {p["path"]: p for p in m.get("paths") or [] if isinstance(p, dict) and p.get("path")}
        found = [f for f in bad(run_check(check_complete, facts)) + bad(run_check(check_staged_this_boot, facts))
                 if f.remedy == ID and f.subject in paths]
        if not found:
            return None
        no_room = {}
        for f in bad(run_check(check_tmpfs_room, facts)) + bad(run_check(check_memory_cgroup, facts)):
            if f.status.value == "fail":
                no_room.setdefault(f.subject, []).append(f.summary)
        configured = _sources(ctx)
        name = target_name(facts)
        host = ctx.hosts.get(name)
        remote_gd = command(facts, "gpudoctor")
        actions, skipped, rows, commands, keys = [], [], [], [], []
        for dst in dict.fromkeys(f.subject for f in found):
            p = paths[dst]
            v = p.get("verify") or {}
            rec = p.get("record") or {}
            src = configured.get(dst) or configured.get("*") or rec.get("source")
            if not src:
                skipped.append(no_source(dst, p))
                continue
            if os.path.normpath(src) == os.path.normpath(dst):
                skipped.append(f"{dst}: the source is the destination itself")
                continue
            if v.get("others_control"):
                skipped.append(f"{dst}: {v['others_control']}: gpudoctor does not stage into a directory another "
                               "user controls as root (remove it, then fix again)")
                continue
            if dst in no_room:
                skipped.append(f"{dst}: " + "; ".join(no_room[dst]))
                continue
            if host is not None and not _is_local(host) and not remote_gd:
                skipped.append(f"{dst}: {name} has no `gpudoctor` on PATH to stage there; run `gpudoctor model "
                               f"stage --from {src} --to {dst} --apply` on {name}")
                continue
            need = missing_bytes(p)
            state = next((f.summary for f in found if f.subject == dst and f.id == "workload.model.staged_this_boot"),
                         None) or next(f.summary for f in found if f.subject == dst)
            actions.append({"dst": dst, "src": src, "need": need})
            rows.append((f"{dst}  {state}", f"{dst}  complete (copied from {src}), marker with this boot's id"))
            commands.append(f"gpudoctor model stage --from {src} --to {dst} --apply")
            keys += [f.key for f in found if f.subject == dst]
        if not actions:
            return self.refuse("; ".join(skipped))
        total = sum(a["need"] or 0 for a in actions)
        summary = ("restage " + ", ".join(f"{a['dst']} from {a['src']}" for a in actions)
                   + (f" (about {human_bytes(total)} to copy)" if total else ""))
        diff = "--- model (before)\n+++ model (after)\n" + "".join(f"-{a}\n+{b}\n" for a, b in rows)
        return Change(ID, name, summary, diff=diff, commands=commands, risk="medium", fixes=keys,
                      data={"actions": actions, "skipped": skipped, "gpudoctor": remote_gd})

    def apply(self, host, change: Change, ctx: RemedyContext) -> dict:
        staged = []
        for a in change.data["actions"]:
            staged.append(self._stage_local(host, a, ctx) if _is_local(host) else self._stage_remote(host, a, change,
                                                                                                     ctx))
        return {"changed": any(s.get("changed") for s in staged), "staged": staged}

    @staticmethod
    def _stage_local(host, a: dict, ctx: RemedyContext) -> dict:
        from gpudoctor.model import probe
        from gpudoctor.model.stage import DEFAULT_JOBS, apply_stage, plan_stage

        src, dst = host._path(a["src"]), host._path(a["dst"])
        rep = probe.verify_model(dst) if os.path.isdir(dst) else {"complete": False}
        if rep.get("complete") and (rep.get("marker") or {}).get("boot_id") == probe.boot_id():
            return {"dst": a["dst"], "changed": False, "note": "already complete and staged this boot"}
        sp = plan_stage(src, dst)
        if sp.refusals:
            raise RemedyError(f"not staging {a['dst']}: " + "; ".join(sp.refusals))
        res = apply_stage(sp, jobs=int(ctx.options.get("stage_jobs") or DEFAULT_JOBS))
        return {"dst": a["dst"], "changed": True, "copied_bytes": res["copied_bytes"], "seconds": res["seconds"],
                "marker": a["dst"].rstrip("/") + "/" + probe.MARKER_NAME}

    @staticmethod
    def _stage_remote(host, a: dict, change: Change, ctx: RemedyContext) -> dict:
        gd = change.data.get("gpudoctor") or "gpudoctor"
        res = host.run([gd, "model", "stage", "--from", a["src"], "--to", a["dst"], "--apply", "--json"],
                       timeout=float(ctx.options.get("stage_timeout_s", 3600)))
        if not res.ok:
            raise RemedyError(f"{res.describe()}")
        try:
            doc = json.loads(res.stdout)
        except ValueError:
            doc = {}
        return {"dst": a["dst"], "changed": True, "copied_bytes": (doc.get("result") or {}).get("copied_bytes"),
                "marker": a["dst"].rstrip("/") + "/.gpudoctor-staged.json"}

    def verify(self, host, change: Change, ctx: RemedyContext) -> Finding:
        from gpudoctor.checks.workload_model import check_complete, check_staged_this_boot
        from gpudoctor.gather import model as gmodel
        from gpudoctor.gather.context import GatherContext

        dsts = [a["dst"] for a in change.data["actions"]]
        facts = {"model": gmodel.gather(host, GatherContext(model_paths=dsts, timeout=max(ctx.timeout, 30.0)))}
        found = [f for f in run_check(check_complete, facts) + run_check(check_staged_this_boot, facts)
                 if f.subject in dsts]
        return verdict(found, "workload.model.complete", f"{', '.join(dsts)}: complete and staged this boot",
                       "the model is still not whole")

    def rollback(self, host, change: Change, ctx: RemedyContext, applied: dict) -> dict:
        done = []
        for s in applied.get("staged") or []:
            if s.get("changed") and s.get("marker"):
                try:
                    host.unlink(s["marker"], ctx.timeout)
                    done.append(f"removed {s['marker']} (the copy is no longer vouched for)")
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise RemedyError(f"cannot remove {s['marker']}: {errtext(exc)}") from exc
        return {"changed": bool(done), "restored": done}
