"""NVIDIA Xid errors: the shipped catalog (gpudoctor/data/xid_catalog.json), the kernel log line parser, and the one
way an Xid becomes a Finding — used by `check` (kernel log, gather/kernel_log.py) and the daemon (NVML events).

A kernel log line looks like

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)

(older drivers omit "PCI:"; /dev/kmsg prefixes "PRI,SEQ,USEC,FLAGS;", dmesg "[  SEC.USEC]").
"""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import dataclass
from importlib import resources

from gpudoctor.findings import Finding, Status

_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)\): "
                   r"(?P<code>\d+),\s*(?P<text>.*)$")
_PID = re.compile(r"\bpid=(?P<pid>'?<?[\w]+>?'?),\s*(?:name=(?P<name>.*?),\s*)?")
_RECOVERY = re.compile(r"recovery action changed from 0x[0-9a-fA-F]+ \((?P<old>[^)]*)\) to 0x[0-9a-fA-F]+ "
                       r"\((?P<new>[^)]*)\)")
# NVML's gpu_recovery_action (nvidia-smi -q -x) spells the actions differently from the Xid 154 text.
_NVML_ACTION = {"none": "None", "gpu reset": "GPU Reset Required", "gpu_reset": "GPU Reset Required",
                "node reboot": "Node Reboot Required", "node_reboot": "Node Reboot Required",
                "drain p2p": "Drain P2P", "drain_p2p": "Drain P2P", "drain and reset": "Drain and Reset",
                "drain_and_reset": "Drain and Reset"}


@functools.lru_cache(maxsize=1)
def catalog() -> dict:
    """The shipped catalog: {"codes": {"79": {mnemonic, meaning, immediate, investigatory}}, "buckets", "status"}."""
    return json.loads(resources.files("gpudoctor").joinpath("data/xid_catalog.json").read_text(encoding="utf-8"))


@dataclass
class XidLine:
    """One parsed NVRM Xid line."""

    pci: str  # as the driver prints it: 0000:3b:00 (domain:bus:device)
    code: int
    text: str  # what follows the code (pid=, name=, the driver's message)
    t: float | None = None  # seconds since boot (kernel timestamp), when known
    pid: str | None = None
    name: str | None = None

    @property
    def message(self) -> str:
        """The driver's message without its pid=/name= prefix."""
        return _PID.sub("", self.text, count=1).strip() if self.pid else self.text.strip()

    def to_json(self) -> dict:
        return {"pci": self.pci, "code": self.code, "text": self.text, "t": self.t, "pid": self.pid, "name": self.name}


def parse_line(msg: str, t: float | None = None) -> XidLine | None:
    """An NVRM Xid line (with or without a kmsg/dmesg prefix) → XidLine; anything else → None."""
    m = _LINE.search(msg)
    if not m:
        return None
    text = m.group("text").strip()
    p = _PID.match(text)
    return XidLine(m.group("pci").lower(), int(m.group("code")), text, t,
                   p.group("pid").strip("'") if p else None, (p.group("name") if p else None))


def norm_pci(bus_id: str | None) -> str | None:
    """"00000000:3B:00.0" (NVML) or "0000:3b:00" (Xid line) → "0000:3b:00", to match the two."""
    if not bus_id:
        return None
    m = re.match(r"^(?:([0-9A-Fa-f]{4,8}):)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})", bus_id)
    if not m:
        return bus_id.lower()
    dom = (m.group(1) or "0000")[-4:]
    return f"{dom}:{m.group(2)}:{m.group(3)}".lower()


def nvml_action(text: str | None) -> str | None:
    """NVML's recovery action ("None", "GPU Reset", ...) in the Xid 154 vocabulary; None when not reported."""
    if not text or text.strip().upper() in ("N/A", "NOT SUPPORTED", "UNKNOWN"):
        return None
    return _NVML_ACTION.get(text.strip().lower(), text.strip())


def entry(code: int) -> dict | None:
    return catalog()["codes"].get(str(code))


def grade(code: int, action: str | None = None) -> Status:
    """How gpudoctor grades an Xid: by its immediate bucket; Xid 154 by the recovery action it (or NVML) names."""
    e = entry(code)
    if e is None:
        return Status.WARN
    st = catalog()["status"].get(e["immediate"], "warn")
    if st == "by_recovery_action":
        st = catalog()["recovery_actions"].get(action or "", "warn")
    return Status(st)


def critical(code: int) -> bool:
    """An Xid whose immediate action needs more than restarting the application (a reset, a reboot, the vendor)."""
    return grade(code) == Status.FAIL


def _gpu_label(pci: str, gpus: dict) -> str:
    g = gpus.get(pci)
    return f"GPU {g['index']} ({pci})" if g and g.get("index") is not None else f"GPU {pci}"


def findings_from_lines(lines: list[XidLine], gpus: dict | None = None, *, window: str = "since boot",
                        uptime: float | None = None) -> list[Finding]:
    """One finding per GPU and Xid code: the newest line as evidence, the count, NVIDIA's buckets as hint.
    `gpus` maps a normalised PCI address to {"index", "recovery_action"} (NVML), for names and Xid 154."""
    gpus = gpus or {}
    groups: dict[tuple, list[XidLine]] = {}
    for ln in lines:
        groups.setdefault((ln.pci, ln.code), []).append(ln)
    out = []
    for (pci, code), lns in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        last = max(lns, key=lambda x: x.t or 0.0)
        e = entry(code)
        where = _gpu_label(pci, gpus)
        ev = [f"kernel log: NVRM: Xid (PCI:{pci}): {code}, {last.text}"[:400]]
        if last.t is not None:
            ago = f", {uptime - last.t:.0f} s ago" if uptime is not None else ""
            ev.append(f"last at {last.t:.1f} s after boot{ago}; {len(lns)} in the window ({window})")
        action = None
        if code == 154:
            m = _RECOVERY.search(last.text)
            action = m.group("new").strip() if m else None
            now = nvml_action((gpus.get(pci) or {}).get("recovery_action"))
            if now is not None:
                ev.append(f"NVML gpu_recovery_action now: {now}")
                action = now
        status = grade(code, action)
        if e is None:
            summary = f"Xid {code} on {where}: not in the shipped Xid catalog"
            hint = "Look the code up in NVIDIA's Xid catalog; collect nvidia-bug-report.sh."
        else:
            what = e["meaning"] + (f" — recovery action: {action}" if code == 154 and action else "")
            summary = f"Xid {code} {e['mnemonic']} on {where}: {what}"
            b = catalog()["buckets"]
            hint = (f"NVIDIA's immediate action {e['immediate']}: {b.get(e['immediate'], e['immediate'])}"
                    + (f"; investigate: {e['investigatory']}" if e["investigatory"] not in ("N/A", "IGNORE") else ""))
            if code == 154:
                hint = f"recovery action {action or 'unknown'}: " + (
                    "none needed" if action == "None" else "drain the GPU and do what it names (reset or reboot)")
        if last.pid and last.pid not in ("<unknown>", "'<unknown>'"):
            ev.append(f"process: pid {last.pid}" + (f" ({last.name})" if last.name else ""))
        out.append(Finding("driver.xid", status, summary, subject=f"{pci}:xid{code}", evidence=ev, hint=hint,
                           data={"pci": pci, "xid": code, "count": len(lns), "last_t": last.t,
                                 "immediate": e and e["immediate"], "investigatory": e and e["investigatory"],
                                 "recovery_action": action}))
    return out


def findings_from_events(events: list[dict]) -> list[Finding]:
    """The daemon's NVML Xid events ({"gpu", "bus_id", "xid", "at"}): one fail finding per GPU and critical Xid."""
    latest: dict[tuple, dict] = {}
    counts: dict[tuple, int] = {}
    for ev in events:
        code = int(ev["xid"])
        if not critical(code):
            continue
        k = (ev.get("gpu"), code)
        counts[k] = counts.get(k, 0) + 1
        if k not in latest or ev["at"] >= latest[k]["at"]:
            latest[k] = ev
    out = []
    for (gpu, code), ev in sorted(latest.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ev["at"]))
        where = f"GPU {gpu}" + (f" ({ev['bus_id']})" if ev.get("bus_id") else "")
        e = entry(code) or {"mnemonic": "?", "meaning": "not in the shipped Xid catalog", "immediate": "?"}
        out.append(Finding(
            id="driver.xid", status=Status.FAIL, layer="driver", subject=f"gpu{gpu}:xid{code}",
            summary=f"Xid {code} {e['mnemonic']} on {where}: {e['meaning']}",
            evidence=[f"NVML critical Xid event {code} on {where}, last at {when}, {counts[(gpu, code)]} this boot"],
            hint=f"NVIDIA's immediate action {e['immediate']}: "
                 f"{catalog()['buckets'].get(e['immediate'], e['immediate'])}",
            data={"gpu": gpu, "xid": code, "bus_id": ev.get("bus_id"), "count": counts[(gpu, code)],
                  "immediate": e["immediate"]}))
    return out
