"""Remedy lxc.cgroup_allow: add the missing `lxc.cgroup2.devices.allow` rules to a container's LIVE config section
and remove keyless rule lines (a hand fix that lost its key), leaving every other byte as it was.

Plan refuses — rather than guesses — when the config is locked, its filesystem is read-only, a needed driver is not
in the host's /proc/devices, or an explicit deny rule would still win. Apply goes through gpudoctor.files.edit (backup
outside /etc/pve, temp file beside the target, validate, one rename). Verify re-reads the file and re-audits it.
Reboot (only with --reboot) restarts the container when it runs and no GPU compute process is inside it.
"""

from __future__ import annotations

import base64

from gpudoctor.files.edit import EditPlan, apply_edit
from gpudoctor.findings import Finding, Status
from gpudoctor.proxmox import pct
from gpudoctor.proxmox.audit import (AuditInput, restart_cmd, check_cgroup_allow, check_misplaced, decide, input_from_facts, live_rules,
                                     running_rules)
from gpudoctor.proxmox.config import ALLOW_KEY, LIVE, Config, parse
from gpudoctor.proxmox.devices import ProcDevices
from gpudoctor.remedy import Change, RebootOutcome, Remedy, RemedyContext

ID = "lxc.cgroup_allow"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(s: str) -> bytes:
    return base64.b64decode(s)


def fix_text(cfg: Config, majors: list[int]) -> tuple[str, list[int], list[str]]:
    """The new file text: keyless rule lines removed from the live section, `allow c M:* rwm` lines inserted after
    the live section's last allow line (else after its last setting), never after the first [section] header.
    Returns (text, removed line numbers, inserted lines)."""
    from gpudoctor.proxmox.audit import allow_line

    remove = {ln.no for ln in cfg.live if ln.bare_rule is not None}
    keep = [ln for ln in cfg.lines if ln.no not in remove]
    header = cfg.first_header
    live_keep = [ln for ln in keep if ln.section == LIVE and (header is None or ln.no < header.no)]
    anchor = next((ln for ln in reversed(live_keep) if ln.key == ALLOW_KEY), None)
    if anchor is None:
        anchor = next((ln for ln in reversed(live_keep) if ln.kind != "blank"), None)
    eol = cfg.eol
    new = [allow_line(cfg, m) + eol for m in majors]
    raws = [ln.raw for ln in keep]
    if not new:
        return "".join(raws), sorted(remove), []
    if anchor is None:
        at = 0
    else:
        at = keep.index(anchor) + 1
        if not anchor.eol:  # the anchor ends the file without a newline: give it one
            raws[at - 1] = anchor.raw + eol
    raws[at:at] = new
    return "".join(raws), sorted(remove), [s.rstrip("\r\n") for s in new]


class LxcCgroupAllow(Remedy):
    id = ID
    summary = "allow the container's NVIDIA device majors in its Proxmox config (live section only)"

    # --- plan ---------------------------------------------------------------------------------
    def plan(self, facts: dict, ctx: RemedyContext) -> Change | None:
        b = facts.get("boundary") or {}
        if b.get("kind") != "lxc" or not b.get("applicable", True):
            return None
        if b.get("error"):
            return self.refuse(b["error"])
        inp = input_from_facts(b)
        cfg, label = inp.cfg, inp.label
        if not inp.procdev.text_ok:
            pd = b.get("proc_devices") or {}
            return self.refuse(f"cannot read the host's {pd.get('path', '/proc/devices')} ({pd.get('error')}): "
                               f"the live majors are unknown, so no rule can be written with certainty")
        allow = check_cgroup_allow(inp)
        missing: list[int] = []
        for f in allow:
            if f.bad and f.data.get("fix_line") and not f.data.get("denied_by") and f.data["major"] not in missing:
                missing.append(f.data["major"])
        denied = [f for f in allow if f.bad and f.data.get("denied_by")]
        unknown = [f for f in allow if f.status == Status.UNKNOWN]
        restart = [f for f in allow if f.bad and f.data.get("restart_needed")]
        bare = [ln for ln in cfg.live if ln.bare_rule is not None]
        if missing and inp.v1:
            lines = sorted({f.data["fix_line"] for f in allow if f.bad and f.data.get("fix_line")})
            return self.refuse(f"{b.get('proxmox') or 'the host'} runs a {inp.layout} cgroup layout, where LXC "
                               f"ignores lxc.cgroup2 rules: add {', '.join(f'`{x}`' for x in lines)} to the live "
                               f"section of {cfg.path} by hand (gpudoctor writes cgroup2 rules only), then "
                               f"{restart_cmd(inp.vmid)}")
        blind = [f for f in unknown if f.data.get("critical", True)]
        if blind:  # no edit can reach the healthy state without the node's live major: refuse rather than half-fix
            return self.refuse(f"{label}: " + "; ".join(f.summary for f in blind)
                               + " — no edit can make it usable without that major; " + (blind[0].hint or "")
                               + "; nothing was changed")
        skipped = [f"{f.subject}: {f.summary.split(': ', 1)[-1]} — no rule written for it" for f in unknown]
        if not missing and not bare:
            if denied:
                return self.refuse("; ".join(f"{f.subject}: {f.evidence[0]}" for f in denied) +
                                   " — an explicit deny rule wins; gpudoctor will not remove it for you")
            if unknown:
                return self.refuse("; ".join(f.summary for f in unknown))
            if restart:  # the edit is done (by an earlier run or by hand): only the restart is pending
                return Change(ID, b.get("proxmox") or "localhost",
                              f"{cfg.path} already allows every GPU node; {label} still runs with its old rules: "
                              f"restart it so they take effect",
                              commands=[f"pct reboot {inp.vmid}"] if inp.vmid is not None else [], risk="medium",
                              needs_reboot=True,
                              fixes=[f.key for f in restart],
                              data=self._data(b, inp, cfg.data, cfg.data,
                                              sorted({f.data["major"] for f in restart}), [], []))
            return None
        if cfg.lock is not None:
            return self.refuse(f"{label} is locked (lock: {cfg.lock}): an operation is running or was interrupted; "
                               f"gpudoctor does not edit a locked config")
        if (b.get("config") or {}).get("readonly"):
            return self.refuse(f"{cfg.path} is on a read-only filesystem (/etc/pve turns read-only when the node "
                               f"loses quorum): nothing can be written")
        text, removed, inserted = fix_text(cfg, missing)
        after = text.encode("utf-8", "surrogateescape")
        problem = self.check_content(after, cfg.data, inp.procdev, missing, cfg.path)
        if problem:
            return self.refuse(f"the planned edit would not fix it: {problem}")
        running = inp.status != "stopped"  # unknown counts: the change applies only at the next start
        parts = []
        if missing:
            parts.append("allow " + ", ".join(f"c {m}:*" for m in missing) + " in the live section")
        if removed:
            parts.append("remove keyless line" + ("s " if len(removed) > 1 else " ") + ", ".join(map(str, removed)))
        targets = [f.key for f in allow if f.bad and f.data.get("major") in missing]
        targets += [f"boundary.lxc.malformed[{cfg.path}:{n}]" for n in removed]
        targets += [f.key for f in check_misplaced(inp) if f.remediable]  # stranded allow lines this edit supersedes
        commands = [f"pct reboot {inp.vmid}"] if running and inp.vmid is not None else []
        plan = EditPlan(cfg.path, cfg.data, after)
        data = self._data(b, inp, cfg.data, after, missing, removed, inserted)
        if skipped:
            data["skipped"] = skipped
        return Change(ID, b.get("proxmox") or "localhost", f"{label}: " + "; ".join(parts) + f" of {cfg.path}",
                      diff=plan.diff, commands=commands, risk="low", needs_reboot=running, fixes=targets, data=data)

    @staticmethod
    def _data(b: dict, inp: AuditInput, before: bytes, after: bytes, majors, removed, inserted) -> dict:
        return {"path": inp.cfg.path, "vmid": inp.vmid, "label": inp.label,
                "devices_path": (b.get("proc_devices") or {}).get("path", "/proc/devices"),
                "running_path": (b.get("running") or {}).get("path"), "pct": list(b.get("pct") or pct.PCT),
                "before_b64": _b64(before), "after_b64": _b64(after),
                "majors": majors, "removed_lines": removed, "inserted": inserted}

    @staticmethod
    def check_content(after: bytes, before: bytes, procdev: ProcDevices, majors: list[int], path: str) -> str | None:
        """Why `after` is not a correct fix of `before`, or None: every section but the live one byte-identical,
        no keyless rule left in the live section, and every needed node of the wanted majors allowed."""
        new, old = parse(after, path), parse(before, path)
        if [ln.raw for ln in new.lines if ln.section != LIVE] != [ln.raw for ln in old.lines if ln.section != LIVE]:
            return "a snapshot or pending section would change"
        if new.sections != old.sections:
            return "the section layout would change"
        left = [ln.no for ln in new.live if ln.bare_rule is not None]
        if left:
            return f"keyless rule line(s) {left} would remain"
        if new.lock is not None:
            return f"the config is now locked (lock: {new.lock})"
        rules = live_rules(new)
        for node in _nodes(new):
            m = node.live_major(procdev)
            if m in majors and not decide(rules, node, m).allowed:
                return f"{node.path} (major {m}) would still be denied"
        return None

    # --- apply / verify / rollback -------------------------------------------------------------
    def apply(self, host, change: Change, ctx: RemedyContext) -> dict:
        d = change.data
        before, after = _unb64(d["before_b64"]), _unb64(d["after_b64"])
        if before == after:
            return {"changed": False}
        procdev = self._procdev(host, d, ctx)
        res = apply_edit(host, EditPlan(d["path"], before, after), backup_dir=ctx.backup_dir, timeout=ctx.timeout,
                         validate=lambda data: self.check_content(data, before, procdev, d["majors"], d["path"]))
        return res.to_json()

    def _procdev(self, host, d: dict, ctx: RemedyContext) -> ProcDevices:
        r = host.read_file(d["devices_path"], timeout=ctx.timeout, max_bytes=1 << 20)
        return ProcDevices.parse(r.text if r.ok else None)

    def verify(self, host, change: Change, ctx: RemedyContext) -> Finding:
        d = change.data
        r = host.read_file(d["path"], timeout=ctx.timeout, max_bytes=(1 << 20) + 1)
        if not r.ok:
            return Finding("boundary.lxc.cgroup_allow", Status.UNKNOWN, f"cannot re-read {d['path']} ({r.error})")
        cfg = parse(r.data, d["path"])
        procdev = self._procdev(host, d, ctx)
        inp = AuditInput(cfg, procdev, vmid=d.get("vmid"), name=d.get("label"))
        allow = check_cgroup_allow(inp)
        bad = [f for f in allow if f.bad and f.data.get("major") in d["majors"]]
        bare = [ln.no for ln in cfg.live if ln.bare_rule is not None]
        ev = [f"re-read {d['path']}: sha256 matches the planned result"
              if r.data == _unb64(d["after_b64"]) else f"re-read {d['path']}: differs from the planned result"]
        if bad or bare:
            ev += [e for f in bad for e in f.evidence[:1]] + [f"{d['path']}:{n}: keyless rule line" for n in bare]
            return Finding("boundary.lxc.cgroup_allow", Status.FAIL,
                           f"{d['label']}'s config still does not allow what it needs", evidence=ev)
        done = []
        if d["majors"]:
            done.append("now allows " + ", ".join(f"c {m}:*" for m in d["majors"]) + " in its live section")
        if d.get("removed_lines"):
            done.append("keyless line" + ("s " if len(d["removed_lines"]) > 1 else " ")
                        + ", ".join(map(str, d["removed_lines"])) + " removed")
        still = [f for f in allow if f.bad and not f.data.get("restart_needed")]
        ev += [f"{f.subject}: {f.status.value}: {f.summary}" for f in allow if f.bad]
        text = f"{d['label']}'s config: " + "; ".join(done or ["unchanged"])
        if still:  # what this change could not do is said, never left for the reader to discover
            text += "; still not allowed: " + "; ".join(f"{f.subject} ({f.summary.split(': ', 1)[-1]})"
                                                        for f in still)
        else:
            text += "; every GPU node it passes is allowed"
        return Finding("boundary.lxc.cgroup_allow", Status.OK, text, evidence=ev)

    def rollback(self, host, change: Change, ctx: RemedyContext, applied: dict) -> dict:
        if not applied.get("changed"):
            return {"changed": False}
        d = change.data
        plan = EditPlan(d["path"], _unb64(d["after_b64"]), _unb64(d["before_b64"]))
        return apply_edit(host, plan, backup_dir=ctx.backup_dir, timeout=ctx.timeout).to_json()

    # --- reboot --------------------------------------------------------------------------------
    def reboot(self, host, change: Change, ctx: RemedyContext) -> RebootOutcome:
        d = change.data
        vmid = d.get("vmid")
        if vmid is None:
            return RebootOutcome(False, "no VMID known for this config: restart the container by hand")
        res = pct.safe_reboot(host, int(vmid), wait_s=ctx.reboot_wait_s, timeout=ctx.timeout, label=d.get("label"),
                              cmd=tuple(d.get("pct") or pct.PCT))
        if not res.done:
            return RebootOutcome(False, res.message, {"evidence": res.evidence})
        # re-check: the running config LXC generated at start must now allow what we added
        rpath = d.get("running_path") or f"/var/lib/lxc/{vmid}/config"
        r = host.read_file(rpath, timeout=ctx.timeout)
        if not r.ok:
            return RebootOutcome(True, f"{res.message}; cannot re-read {rpath} ({r.error}) to confirm",
                                 {"evidence": res.evidence})
        rules = running_rules(r.text)
        procdev = self._procdev(host, d, ctx)
        after = parse(_unb64(d["after_b64"]), d["path"])
        judged = [(n, n.live_major(procdev)) for n in _nodes(after) if n.live_major(procdev) is not None]
        still = [n.path for n, m in judged if m in d["majors"] and not decide(rules, n, m).allowed]
        if still:
            return RebootOutcome(False, f"{res.message}, but its running config still denies {', '.join(still)}",
                                 {"evidence": res.evidence})
        others = [n.path for n, m in judged if m not in d["majors"] and not decide(rules, n, m).allowed]
        said = f"now allows {', '.join(f'c {m}:*' for m in d['majors'])}" if d["majors"] else "was rebuilt"
        tail = (f"; still denied there: {', '.join(others)}" if others else
                "; every GPU node the config passes is allowed there")  # said only after looking at each node
        return RebootOutcome(True, f"{res.message}; its running config {said}{tail}", {"evidence": res.evidence})


def _nodes(cfg: Config):
    from gpudoctor.proxmox.audit import needed_nodes

    return [n.node for n in needed_nodes(cfg)]
