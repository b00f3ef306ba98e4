"""Remedy driver.persistence: turn persistence mode on the durable way — enable and start nvidia-persistenced
(`systemctl enable --now nvidia-persistenced.service`) where its unit exists under a running systemd — or, only when
the user allows it (`--allow nvidia-smi-pm`), with `nvidia-smi -i BUS -pm 1` for each GPU that is off (resets at
reboot). Risk medium: the driver state of every GPU changes.

It refuses when the unit starts the daemon with --no-persistence-mode (enabling it would not help), inside a
container (the daemon belongs on the host), and when neither way is available. Verify re-reads `nvidia-smi -q -x`
(polling a few seconds: the daemon needs a moment) and re-runs the check; rollback restores the unit's
enabled/active state, or sets -pm 0 on the GPUs it turned on.
"""

from __future__ import annotations

import re
import time

from gpudoctor.errors import RemedyError
from gpudoctor.findings import Finding, Status
from gpudoctor.gather.tools import PERSISTENCED_UNIT
from gpudoctor.remedy import Change, Remedy, RemedyContext

from .common import bad, command, container_kind, in_container, run_check, target_name, tools, verdict

ID = "driver.persistence"
ALLOW_SMI = "nvidia-smi-pm"
UNIT = PERSISTENCED_UNIT


def _exec_start(text: str | None) -> str | None:
    m = re.search(r"^\s*ExecStart\s*=\s*(.+)$", text or "", re.M)
    return m.group(1).strip() if m else None


def _unit_state(host, systemctl: str, timeout: float) -> dict:
    en = host.run([systemctl, "is-enabled", UNIT], timeout=timeout)
    ac = host.run([systemctl, "is-active", UNIT], timeout=timeout)
    return {"enabled": en.stdout.strip() or None, "active": ac.stdout.strip() or None}


class Persistence(Remedy):
    id = ID
    summary = "turn GPU persistence mode on (nvidia-persistenced, or nvidia-smi -pm 1 when allowed)"

    def plan(self, facts: dict, ctx: RemedyContext) -> Change | None:
        from gpudoctor.checks.driver import persistence

        off = [f for f in bad(run_check(persistence, facts)) if f.subject]
        if not off:
            return None
        buses = [f.data.get("bus_id") or _bus(f.subject) for f in off]
        allow_smi = ALLOW_SMI in (ctx.options.get("allow") or ())
        t = tools(facts)
        unit = (t.get("units") or {}).get(UNIT) or {}
        systemctl, smi = command(facts, "systemctl"), command(facts, "nvidia-smi")
        rows_before = [f"{b}  {f.evidence[0] if f.evidence else 'persistence mode off'}" for b, f in zip(buses, off)]
        why_not_unit = None
        if in_container(facts):
            why_not_unit = (f"this is a{'n LXC' if container_kind(facts) == 'lxc' else ''} container: persistence is "
                            f"the host's setting, and nvidia-persistenced belongs on the host (enable it there: "
                            f"systemctl enable --now {UNIT})")
        elif not unit.get("path"):
            why_not_unit = f"no {UNIT} unit file on {target_name(facts)} (install the driver's nvidia-persistenced)"
        elif not t.get("systemd") or not systemctl:
            why_not_unit = "systemd is not running here, so the unit cannot be enabled"
        elif "--no-persistence-mode" in (_exec_start(unit.get("text")) or ""):
            why_not_unit = (f"{unit['path']} starts the daemon with --no-persistence-mode (ExecStart={_exec_start(unit['text'])}): "
                            f"enabling it would not turn persistence on; drop that flag with a drop-in "
                            f"(systemctl edit {UNIT})")
        if why_not_unit is None:
            state = f"{unit.get('enabled') or '?'}, {unit.get('active') or '?'}"
            running = unit.get("enabled") == "enabled" and unit.get("active") == "active"
            cmd = f"systemctl {'restart' if running else 'enable --now'} {UNIT}"
            diff = _diff(rows_before + [f"{UNIT}  {state}"],
                         [f"{b}  persistence_mode = Enabled" for b in buses] + [f"{UNIT}  enabled, active"])
            return Change(ID, target_name(facts),
                          f"{'restart' if running else 'enable and start'} {UNIT} so persistence mode stays on for "
                          f"{', '.join(buses)} (also after reboots)", diff=diff, commands=[cmd], risk="medium",
                          fixes=[f.key for f in off],
                          data={"route": "unit", "systemctl": systemctl, "restart": running, "buses": buses,
                                "subjects": [f.subject for f in off]})
        if allow_smi and smi:
            diff = _diff(rows_before, [f"{b}  persistence_mode = Enabled (until the next reboot)" for b in buses])
            return Change(ID, target_name(facts),
                          f"nvidia-smi -pm 1 on {', '.join(buses)} (not durable: persistence mode resets at reboot; "
                          f"{why_not_unit})", diff=diff, commands=[f"{smi} -i {b} -pm 1" for b in buses],
                          risk="medium", fixes=[f.key for f in off],
                          data={"route": "smi", "smi": smi, "buses": buses, "subjects": [f.subject for f in off]})
        how = (f"or re-run with --allow {ALLOW_SMI} to set it now with nvidia-smi -pm 1 (resets at reboot)" if smi
               else "and nvidia-smi is not on PATH either")
        return self.refuse(f"persistence mode is off on {', '.join(buses)}, but {why_not_unit}; {how}")

    def apply(self, host, change: Change, ctx: RemedyContext) -> dict:
        d, t = change.data, ctx.timeout
        if d["route"] == "unit":
            before = _unit_state(host, d["systemctl"], t)
            running = before["enabled"] == "enabled" and before["active"] == "active"
            if running and not d.get("restart"):
                return {"changed": False, "before": before}
            argv = [d["systemctl"], "restart", UNIT] if d.get("restart") else [d["systemctl"], "enable", "--now", UNIT]
            res = host.run(argv, timeout=max(t, 30.0))
            if not res.ok:
                raise RemedyError(res.describe())
            return {"changed": True, "before": before, "ran": res.cmdline}
        on = _pm_by_bus(host, t)
        turned = []
        for b in d["buses"]:
            if on.get(b) == "Enabled":
                continue
            res = host.run([d["smi"], "-i", b, "-pm", "1"], timeout=max(t, 30.0))
            if not res.ok:
                raise RemedyError(res.describe() + (f" (turned on before the failure: {', '.join(turned)})" if turned
                                                    else ""))
            turned.append(b)
        return {"changed": bool(turned), "turned_on": turned}

    def verify(self, host, change: Change, ctx: RemedyContext) -> Finding:
        from gpudoctor.checks.driver import persistence
        from gpudoctor.gather import driver as gdriver
        from gpudoctor.gather.context import GatherContext

        wait = float(ctx.options.get("persistence_wait_s", 10.0))
        deadline = time.monotonic() + wait
        subjects = set(change.data["subjects"])
        while True:
            facts = {"driver": gdriver.gather(host, GatherContext(timeout=ctx.timeout))}
            found = [f for f in run_check(persistence, facts) if f.subject in subjects]
            if (found and all(f.status == Status.OK for f in found)) or time.monotonic() >= deadline:
                break
            time.sleep(0.25)
        if not found and facts["driver"].get("rc") != 0:
            return Finding(ID, Status.UNKNOWN, f"nvidia-smi failed after the change: rc {facts['driver'].get('rc')} "
                           f"{facts['driver'].get('stderr', '')[:200]}")
        return verdict(found, ID, f"persistence mode Enabled on {', '.join(change.data['buses'])}",
                       f"persistence mode still off after {wait:g} s")

    def rollback(self, host, change: Change, ctx: RemedyContext, applied: dict) -> dict:
        d, t, done = change.data, ctx.timeout, []
        if not applied.get("changed"):
            return {"changed": False}
        if d["route"] == "unit":
            before = applied.get("before") or {}
            if before.get("enabled") != "enabled":
                _must(host.run([d["systemctl"], "disable", UNIT], timeout=t))
                done.append(f"systemctl disable {UNIT}")
            if before.get("active") != "active":
                _must(host.run([d["systemctl"], "stop", UNIT], timeout=max(t, 30.0)))
                done.append(f"systemctl stop {UNIT}")
            return {"changed": bool(done), "restored": done}
        for b in applied.get("turned_on") or []:
            _must(host.run([d["smi"], "-i", b, "-pm", "0"], timeout=max(t, 30.0)))
            done.append(f"nvidia-smi -i {b} -pm 0")
        return {"changed": bool(done), "restored": done}


def _must(res) -> None:
    if not res.ok:
        raise RemedyError(res.describe())


def _bus(subject: str) -> str:
    m = re.search(r"\(([0-9A-Fa-f:.]+)\)\s*$", subject or "")
    return m.group(1) if m else subject


def _pm_by_bus(host, timeout: float) -> dict:
    from gpudoctor.gather import driver as gdriver
    from gpudoctor.gather.context import GatherContext

    d = gdriver.gather(host, GatherContext(timeout=timeout))
    return {g.get("bus_id"): g.get("persistence_mode") for g in d.get("gpus") or []}


def _diff(before: list[str], after: list[str]) -> str:
    return ("--- persistence (before)\n+++ persistence (after)\n" + "".join(f"-{x}\n" for x in before)
            + "".join(f"+{x}\n" for x in after))
