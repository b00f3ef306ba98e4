"""Remedy systemd.device_allow: a drop-in that lets a unit open the NVIDIA nodes its DevicePolicy= leaves out.

Plan writes nothing: it names each missing /proc/devices group (`DeviceAllow=char-nvidia-uvm rw`: by name, so a
driver reload that moves the major is still allowed at the next start) in /etc/systemd/system/UNIT.d/
50-gpudoctor-devices.conf, with its diff. Apply goes through gpudoctor.files.edit, whose validator runs
`systemd-analyze verify` on the target over a copy of the unit with the new drop-in beside it (SYSTEMD_UNIT_PATH) and
refuses any complaint that names the drop-in; then `systemctl daemon-reload`. Verify asks `systemctl show` again and
re-runs boundary.systemd.device_allow; a running unit applies the new rules at its next start (--reboot restarts
it). Rollback restores the drop-in's previous bytes (or removes the one it created) and reloads.
"""

from __future__ import annotations

import os

from gpudoctor.boundary import systemd_devices as SD
from gpudoctor.files.edit import apply_edit, plan_edit, unified_diff
from gpudoctor.findings import Finding, Status
from gpudoctor.remedy import Change, RebootOutcome, Remedy, RemedyContext

from .common import bad, command, run_check, target_name, verdict

ID = "systemd.device_allow"


_VERIFY = r"""
d=$(mktemp -d /tmp/gpudoctor-verify.XXXXXXXX) || exit 125
trap 'rm -rf -- "$d"' EXIT
mkdir "$d/$2.d" && printf '%s' "$3" > "$d/$2" && printf '%s' "$4" > "$d/$2.d/$5" || exit 125
SYSTEMD_UNIT_PATH="$d:" "$1" verify "$d/$2" 2>&1
"""


def verify_dropin(host, unit: str, unit_text: str, text: bytes, analyze: str, timeout: float) -> str | None:
    """systemd-analyze verify over a copy of the unit with the new drop-in beside it, in a scratch directory on the
    target (one command: mktemp, write, verify, remove). Its complaints about the drop-in fail the edit."""
    res = host.run(["sh", "-c", _VERIFY, "sh", analyze, unit, unit_text, text.decode("utf-8", "surrogateescape"),
                    SD.DROPIN_NAME], timeout=timeout)
    if res.rc is None or res.rc == 125:
        return f"systemd-analyze verify could not run: {res.describe()}"
    complaints = SD.verify_problems(res.stdout + res.stderr, f"{unit}.d/{SD.DROPIN_NAME}")
    if complaints:
        return f"systemd-analyze verify: {'; '.join(complaints)}"
    return None


class SystemdDeviceAllow(Remedy):
    id = ID
    fixes = ("boundary.systemd.device_allow",)
    summary = "add a DeviceAllow= drop-in for the NVIDIA groups a unit's device policy leaves out"

    def plan(self, facts: dict, ctx: RemedyContext) -> Change | None:
        from gpudoctor.checks.systemd_unit import device_allow

        found = [f for f in bad(run_check(device_allow, facts)) if f.status == Status.FAIL]
        if not found:
            return None
        analyze = (facts.get("platform") or {}).get("systemd_analyze")
        if not analyze:
            return self.refuse("systemd-analyze is not on this host: the drop-in cannot be verified before it is written")
        units = (facts.get("platform") or {}).get("units") or {}
        unit = sorted({f.data["unit"] for f in found})[0]  # one unit per change; the next run takes the next
        u = units[unit]
        frag = u.get("fragment") or {}
        if frag.get("text") is None:
            return self.refuse(f"cannot read {unit}'s unit file ({frag.get('path') or 'no FragmentPath'}): "
                               f"nothing to verify the drop-in against")
        groups = sorted({f.data["group"] for f in found if f.data["unit"] == unit})
        path = SD.dropin_path(unit)
        before = (u.get("dropin") or {}).get("text")
        after = SD.dropin_text(unit, groups)
        b = None if before is None else before.encode("utf-8", "surrogateescape")
        if b == after.encode():
            return self.refuse(f"{path} already says this; `systemctl daemon-reload` has not been run "
                               f"(NeedDaemonReload={u['show'].get('NeedDaemonReload')})")
        return Change(ID, target_name(facts), f"allow {', '.join('char-' + g for g in groups)} for {unit} in a "
                      f"drop-in ({path}), then daemon-reload; the unit applies it at its next start",
                      diff=unified_diff(path, b, after.encode()),
                      commands=["systemctl daemon-reload", f"systemctl restart {unit}  (with --reboot)"],
                      risk="medium", needs_reboot=True, fixes=[f.key for f in found if f.data["unit"] == unit],
                      data={"unit": unit, "path": path, "before": before, "after": after, "unit_text": frag["text"],
                            "analyze": analyze, "systemctl": command(facts, "systemctl") or "systemctl",
                            "keys": [f.key for f in found if f.data["unit"] == unit]})

    def apply(self, host, change: Change, ctx: RemedyContext) -> dict:
        d = change.data
        before = None if d["before"] is None else d["before"].encode("utf-8", "surrogateescape")
        host.makedirs(os.path.dirname(d["path"]), 0o755, timeout=ctx.timeout)
        res = apply_edit(host, plan_edit(d["path"], before, d["after"]), backup_dir=ctx.backup_dir, timeout=ctx.timeout,
                         validate=lambda data: verify_dropin(host, d["unit"], d["unit_text"], data, d["analyze"],
                                                             ctx.timeout))
        out = res.to_json()
        if res.changed:
            r = host.run([d["systemctl"], "daemon-reload"], timeout=max(ctx.timeout, 30.0))
            out["daemon_reload"] = r.describe()
        return out

    def verify(self, host, change: Change, ctx: RemedyContext) -> Finding:
        from gpudoctor.checks.systemd_unit import device_allow
        from gpudoctor.gather.hostinfo import parse_proc_devices
        from gpudoctor.gather.platform import show_unit

        d = change.data
        pd = host.read_file("/proc/devices", timeout=ctx.timeout)
        nodes = {p: s.to_json() for p, s in host.stat_many(["/dev/nvidiactl", "/dev/nvidia-uvm"], ctx.timeout).items()}
        facts = {"host": {"proc_devices": parse_proc_devices(pd.text or "")}, "devices": {"nodes": nodes},
                 "platform": {"units": {d["unit"]: {"why": "named", **show_unit(host, d["unit"], ctx.timeout)}}}}
        found = [f for f in run_check(device_allow, facts) if (f.data or {}).get("unit", f.subject) == d["unit"]
                 or f.subject == d["unit"]]
        return verdict(found, ID, f"{d['unit']}'s device policy now allows the NVIDIA nodes",
                       f"{d['unit']} still does not allow them")

    def rollback(self, host, change: Change, ctx: RemedyContext, applied: dict) -> dict:
        d = change.data
        if not applied.get("changed"):
            return {"changed": False}
        if d["before"] is None:
            host.unlink(d["path"], timeout=ctx.timeout)
            out = {"changed": True, "removed": d["path"]}
        else:
            out = apply_edit(host, plan_edit(d["path"], d["after"].encode(), d["before"]), backup_dir=ctx.backup_dir,
                             timeout=ctx.timeout).to_json()
        host.run([d["systemctl"], "daemon-reload"], timeout=max(ctx.timeout, 30.0))
        return out

    def reboot(self, host, change: Change, ctx: RemedyContext) -> RebootOutcome:
        d = change.data
        r = host.run([d["systemctl"], "restart", d["unit"]], timeout=max(ctx.timeout, 90.0))
        return RebootOutcome(r.ok, f"systemctl restart {d['unit']}: {r.describe()}")
