"""Remedy fabric.pcie.mrrs: set PCIe MaxReadReq to the configured policy (never without one).

No NVIDIA document recommends an MRRS value, so this acts only when the policy names one (inventory
`policy: checks: fabric.pcie.mrrs: {expect: 512}`, or `gpudoctor fix --mrrs 512`). For each GPU whose MaxReadReq
differs, apply writes ONLY DevCtl bits 14:12 (`setpci -s BDF CAP_EXP+08.w=V:7000`), after reading and recording the
register and after a `setpci -D -v` dry run that must select the device and show the expected result. MaxReadReq is
volatile (a reboot or a GPU reset restores the firmware value), so a systemd oneshot unit written through
gpudoctor.files.edit re-applies it at boot. Dry run (`gpudoctor fix` without --apply) never runs setpci at all.

Refuses inside a container (config space is the host's), without setpci or systemd, and for a policy value that is
not a MaxReadReq size. Verify re-reads the config space and re-runs the check; rollback writes back the recorded bits
14:12 and restores (or removes and disables) the unit.
"""

from __future__ import annotations

import base64
import os
import re

from gpudoctor.files.edit import EditPlan, apply_edit
from gpudoctor.errors import RemedyError
from gpudoctor.findings import Finding, Status
from gpudoctor.gather.tools import PCIE_UNIT, PCIE_UNIT_FILE
from gpudoctor.remedy import Change, Remedy, RemedyContext

from .common import bad, command, in_container, run_check, target_name, tools, verdict

ID = "fabric.pcie.mrrs"
MASK = 0x7000  # DevCtl bits 14:12: Max_Read_Request_Size = 128 << v
SIZES = {128 << v: v for v in range(6)}  # 128 … 4096


def reg_op(v: int) -> str:
    return f"CAP_EXP+08.w={v << 12:04x}:{MASK:04x}"


def unit_text(setpci: str, want: int, bdfs: list[str]) -> str:
    lines = [f"# Written by gpudoctor ({ID}): re-apply the PCIe MaxReadReq policy ({want} bytes) at every boot.",
             "# MaxReadReq (PCIe DevCtl bits 14:12) is volatile: a reboot or a GPU reset restores the firmware value.",
             "# Only those bits are written (mask 7000). To undo: systemctl disable " + PCIE_UNIT
             + ", remove this file, reboot.",
             "[Unit]", f"Description=gpudoctor: PCIe MaxReadReq {want} on {len(bdfs)} NVIDIA GPU(s) (policy pcie.mrrs)",
             "After=sysinit.target", "Before=nvidia-persistenced.service", "", "[Service]", "Type=oneshot",
             "RemainAfterExit=yes"]
    lines += [f"ExecStart={setpci} -s {b} {reg_op(SIZES[want])}" for b in bdfs]
    lines += ["", "[Install]", "WantedBy=multi-user.target"]
    return "\n".join(lines) + "\n"


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode()


def _unb64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


def _hex_word(text: str) -> int | None:
    m = re.search(r"(?:^|=\s*)([0-9a-fA-F]{4})\s*$", text.strip())
    return int(m.group(1), 16) if m else None


class PcieMrrs(Remedy):
    id = ID
    summary = "set PCIe MaxReadReq to the policy value (masked DevCtl write + a boot-time unit)"

    def plan(self, facts: dict, ctx: RemedyContext) -> Change | None:
        from gpudoctor.checks.fabric import mrrs

        all_found = run_check(mrrs, facts)
        found = [f for f in bad(all_found) if f.subject and "want" in f.data]
        if not found:
            return None
        want = found[0].data["want"]
        if not isinstance(want, int) or want not in SIZES:
            return self.refuse(f"policy pcie.mrrs = {want!r} is not a MaxReadReq size "
                               f"({', '.join(map(str, SIZES))})")
        if in_container(facts):
            return self.refuse("PCIe config space belongs to the host: run gpudoctor fix there")
        setpci = command(facts, "setpci")
        if not setpci:
            return self.refuse(f"setpci (pciutils) is not installed on {target_name(facts)}: nothing can write the "
                               f"register")
        systemctl = command(facts, "systemctl")
        if not tools(facts).get("systemd") or not systemctl:
            return self.refuse("systemd is not running here: the setting would silently revert at the next reboot "
                               "or GPU reset with no unit to re-apply it")
        uf = (tools(facts).get("files") or {}).get(PCIE_UNIT_FILE)
        if uf is None or uf.get("error") not in (None, "ENOENT"):
            return self.refuse(f"cannot read {PCIE_UNIT_FILE} ({(uf or {}).get('error', 'not gathered')})")
        gpus = {g["bdf"]: g.get("pcie") or {} for g in (facts.get("fabric") or {}).get("gpus") or []}
        v = SIZES[want]
        targets, rows, preview, commands = [], [], [], []
        for f in found:
            p = gpus.get(f.subject) or {}
            if "devctl" not in p:
                return self.refuse(f"{f.subject}: its DevCtl register was not decoded; re-gather on the host as root")
            old = p["devctl"]
            new = (old & ~MASK) | (v << 12)
            targets.append({"bdf": f.subject, "devctl": old, "expect": new, "cap_offset": p.get("cap_offset")})
            rows.append((f"{f.subject}  DevCtl {old:#06x}  MaxReadReq {p.get('mrrs')} (bits 14:12 = {(old >> 12) & 7})",
                         f"{f.subject}  DevCtl {new:#06x}  MaxReadReq {want} (bits 14:12 = {v})"))
            preview.append(f"setpci -D -v -s {f.subject} {reg_op(v)}")
            commands.append(f"setpci -s {f.subject} {reg_op(v)}")
        covered = sorted({f.subject for f in all_found if f.subject in gpus and "devctl" in gpus[f.subject]
                          and f.status in (Status.OK, Status.WARN)})
        before = None if uf.get("text") is None else uf["text"].encode("utf-8", "surrogateescape")
        after = unit_text(setpci, want, covered).encode()
        edit = EditPlan(PCIE_UNIT_FILE, before, after)
        reg_diff = ("--- PCIe DevCtl (before)\n+++ PCIe DevCtl (after)\n"
                    + "".join(f"-{a}\n+{b}\n" for a, b in rows))
        commands += ["systemctl daemon-reload", f"systemctl enable {PCIE_UNIT}"]
        return Change(ID, target_name(facts),
                      f"MaxReadReq {want} on {', '.join(t['bdf'] for t in targets)} (policy pcie.mrrs; only DevCtl "
                      f"bits 14:12), re-applied at boot by {PCIE_UNIT}; best done while the GPUs are idle",
                      diff=reg_diff + edit.diff, commands=commands, risk="high", fixes=[f.key for f in found],
                      data={"setpci": setpci, "systemctl": systemctl, "want": want, "v": v, "targets": targets,
                            "preview": preview, "unit_before_b64": _b64(before), "unit_after_b64": _b64(after)})

    # --- apply ---------------------------------------------------------------------------------------------
    def _read(self, host, setpci: str, bdf: str, timeout: float) -> int:
        res = host.run([setpci, "-s", bdf, "CAP_EXP+08.w"], timeout=timeout)
        val = _hex_word(res.stdout) if res.ok else None
        if val is None:
            raise RemedyError(f"cannot read DevCtl of {bdf}: {res.describe()}")
        return val

    def apply(self, host, change: Change, ctx: RemedyContext) -> dict:
        d, t = change.data, ctx.timeout
        setpci, v, op = d["setpci"], d["v"], reg_op(d["v"])
        orig, written, todo = {}, [], []
        for tg in d["targets"]:  # every dry run first: a refused one writes nothing at all
            bdf = tg["bdf"]
            cur = self._read(host, setpci, bdf, t)
            orig[bdf] = cur
            if (cur >> 12) & 7 == v:
                continue
            expect = (cur & ~MASK) | (v << 12)
            dry = host.run([setpci, "-D", "-v", "-s", bdf, op], timeout=t)
            shown = f"{cur:04x}->({v << 12:04x}:{MASK:04x})->{expect:04x}"
            if not dry.ok or "No devices selected" in dry.stderr or shown not in dry.stdout:
                raise RemedyError(f"the dry run `setpci -D -v -s {bdf} {op}` did not show {shown}: "
                                  f"{(dry.stdout + dry.stderr).strip()[:200] or dry.describe()}; nothing was written")
            todo.append(bdf)
        # The boot-time unit before the register: a run killed between the two leaves a register the next run still
        # sees wrong (so it finishes the job); the other order left a right register with no unit, which no plan
        # would ever add, and the setting gone at the next reboot (tests/crash found it).
        before, after = _unb64(d["unit_before_b64"]), _unb64(d["unit_after_b64"])
        host.makedirs(os.path.dirname(PCIE_UNIT_FILE), 0o755, t)
        ed = apply_edit(host, EditPlan(PCIE_UNIT_FILE, before, after), backup_dir=ctx.backup_dir, timeout=t)
        en = host.run([d["systemctl"], "is-enabled", PCIE_UNIT], timeout=t)
        was_enabled = en.stdout.strip() == "enabled"
        if ed.changed or not was_enabled:  # not yet enabled: perhaps a killed run wrote the file and no more
            _must(host.run([d["systemctl"], "daemon-reload"], timeout=max(t, 30.0)))
        if not was_enabled:
            _must(host.run([d["systemctl"], "enable", PCIE_UNIT], timeout=max(t, 30.0)))
        for bdf in todo:
            res = host.run([setpci, "-s", bdf, op], timeout=t)
            if not res.ok or "No devices selected" in res.stderr:
                raise RemedyError(f"setpci -s {bdf} {op}: {res.describe()} {res.stderr.strip()[:200]}"
                                  + (f"; already written: {', '.join(written)}" if written else "")
                                  + f"; {PCIE_UNIT} is in place: run again to finish")
            written.append(bdf)
        return {"changed": bool(written) or ed.changed or not was_enabled, "orig": orig, "written": written,
                "file_changed": ed.changed, "backup": ed.backup, "was_enabled": was_enabled}

    def verify(self, host, change: Change, ctx: RemedyContext) -> Finding:
        from gpudoctor.checks.fabric import mrrs
        from gpudoctor.gather.fabric import decode_pcie

        d, t = change.data, ctx.timeout
        gpus = []
        for tg in d["targets"]:
            r = host.read_file(f"/sys/bus/pci/devices/{tg['bdf']}/config", timeout=t, max_bytes=4096)
            pcie = decode_pcie(r.data if r.ok else None)
            if not pcie.get("found"):  # a short read (not root in the initial namespace): ask setpci instead
                val = self._read(host, d["setpci"], tg["bdf"], t)
                pcie = {"readable": True, "found": True, "cap_offset": tg.get("cap_offset") or 0, "devctl": val,
                        "mrrs": 128 << ((val >> 12) & 7), "mps": 128 << ((val >> 5) & 7), "mps_supported": 0}
            gpus.append({"bdf": tg["bdf"], "pcie": pcie})
        facts = {"fabric": {"gpus": gpus}, "meta": {"context": {"policy": {"pcie": {"mrrs": d["want"]}}}}}
        found = run_check(mrrs, facts)
        unit = host.read_file(PCIE_UNIT_FILE, timeout=t)
        if unit.data != _unb64(d["unit_after_b64"]):
            found.append(Finding(ID, Status.FAIL, f"{PCIE_UNIT_FILE} does not hold the planned unit"))
        en = host.run([d["systemctl"], "is-enabled", PCIE_UNIT], timeout=t)
        if en.stdout.strip() != "enabled":
            found.append(Finding(ID, Status.FAIL, f"{PCIE_UNIT} is not enabled ({en.stdout.strip() or en.describe()})"))
        return verdict(found, ID, f"MaxReadReq {d['want']} on {', '.join(x['bdf'] for x in d['targets'])}; "
                                  f"{PCIE_UNIT} enabled", "MaxReadReq is not the policy value")

    def rollback(self, host, change: Change, ctx: RemedyContext, applied: dict) -> dict:
        d, t, done = change.data, ctx.timeout, []
        for bdf in applied.get("written") or []:
            old = applied["orig"][bdf]
            op = f"CAP_EXP+08.w={old & MASK:04x}:{MASK:04x}"
            _must(host.run([d["setpci"], "-s", bdf, op], timeout=t))
            done.append(f"setpci -s {bdf} {op}")
        if not applied.get("was_enabled", True):
            _must(host.run([d["systemctl"], "disable", PCIE_UNIT], timeout=max(t, 30.0)))
            done.append(f"systemctl disable {PCIE_UNIT}")
        if applied.get("file_changed"):
            before, after = _unb64(d["unit_before_b64"]), _unb64(d["unit_after_b64"])
            if before is None:
                if host.read_file(PCIE_UNIT_FILE, timeout=t).data == after:
                    host.unlink(PCIE_UNIT_FILE, t)
                    done.append(f"removed {PCIE_UNIT_FILE}")
            else:
                apply_edit(host, EditPlan(PCIE_UNIT_FILE, after, before), backup_dir=ctx.backup_dir, timeout=t)
                done.append(f"restored {PCIE_UNIT_FILE}")
            _must(host.run([d["systemctl"], "daemon-reload"], timeout=max(t, 30.0)))
        return {"changed": bool(done), "restored": done}


def _must(res) -> None:
    if not res.ok:
        raise RemedyError(res.describe())
