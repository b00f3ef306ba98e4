"""Xids in `check`: real-format NVRM Xid lines read by the real kernel-log probe, graded by the shipped catalog; the
real /dev/kmsg read here; an ordinary user (dmesg_restrict) gets an explained "could not read", never ok."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from gpudoctor.checkreg import all_checks
from gpudoctor.diagnose import diagnose
from gpudoctor.gather.kernel_log import parse_dmesg, read_kernel_log
from gpudoctor.host.local import LocalHost
from gpudoctor.catalog.xid import catalog, grade, parse_line
from tests import needs

CORPUS = Path(__file__).parents[1] / "fixtures" / "kernel_log" / "xid-corpus.txt"
REQUIRED = [13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119, 154]


def _uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def _kmsg_dump(path: Path, lines: list[str], times: list[float]) -> None:
    """The corpus as /dev/kmsg records ("PRI,SEQ,USEC,FLAGS;text"), with non-Xid records and continuation lines."""
    out, seq = [], 100
    for ln, t in zip(lines, times):
        out.append(f"6,{seq},{int(t * 1e6) - 5},-;nvidia-nvlink: Nvlink Core is being initialized")
        out.append(f"4,{seq + 1},{int(t * 1e6)},-;{ln}")
        out.append(" SUBSYSTEM=pci")
        out.append(" DEVICE=+pci:0000:18:00.0")
        seq += 2
    path.write_text("\n".join(out) + "\n")


def _facts_with(kernel_log: dict, recovery_action: str = "None") -> dict:
    gpus = [{"bus_id": f"00000000:{b}:00.0", "recovery_action": recovery_action} for b in ("18", "3B", "5D", "86", "AF")]
    return {"host": {}, "driver": {"rc": 0, "gpus": gpus}, "kernel_log": kernel_log}


def test_catalog_has_every_code_of_the_corpus_with_nvidia_buckets():
    cat = catalog()
    for code in REQUIRED:
        e = cat["codes"][str(code)]
        assert e["immediate"] in cat["buckets"] and e["mnemonic"] and e["meaning"]
    assert cat["codes"]["79"]["immediate"] == "RESTART_BM" and cat["codes"]["48"]["immediate"] == "WORKFLOW_XID_48"
    assert [grade(c).value for c in (79, 48, 95, 119, 64, 74)] == ["fail"] * 6
    assert [grade(c).value for c in (13, 31, 45, 94)] == ["warn"] * 4
    assert [grade(c).value for c in (43, 63, 92)] == ["info"] * 3
    assert grade(154, "None").value == "info" and grade(154, "Node Reboot Required").value == "fail"
    assert grade(9999).value == "warn"  # not in the catalog: said so, never ignored


def test_every_corpus_line_parses_with_its_pci_address_code_and_text():
    lines = CORPUS.read_text().splitlines()
    got = [parse_line(ln) for ln in lines]
    assert all(got), [ln for ln, g in zip(lines, got) if g is None]
    assert sorted({g.code for g in got}) == REQUIRED
    assert (got[0].pci, got[0].pid, got[0].name) == ("0000:18:00", "41022", "python3")
    assert got[0].message.startswith("Graphics SM Warp Exception")
    assert got[-1].pci == "0000:d8:00"  # older drivers print no "PCI:"
    assert parse_line("6,1,2,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module") is None


def test_corpus_through_the_real_probe_is_classified_by_the_catalog(tmp_path):
    lines = CORPUS.read_text().splitlines()
    up = _uptime()
    dump = tmp_path / "kmsg"
    _kmsg_dump(dump, lines, [max(0.5, up - 30 + i) for i in range(len(lines))])
    kl = read_kernel_log(LocalHost(), None, 5.0, kmsg=str(dump))
    assert kl["source"] == str(dump) and len(kl["xids"]) == len(lines) and kl["scanned"] == 2 * len(lines)
    d = diagnose(_facts_with(kl, recovery_action="GPU Reset"), only_layers={"driver"})
    xs = {f.subject: f for f in d.findings if f.id == "driver.xid"}
    assert set(xs) == {"0000:18:00:xid13", "0000:18:00:xid31", "0000:18:00:xid43", "0000:18:00:xid45",
                       "0000:3b:00:xid48", "0000:3b:00:xid63", "0000:3b:00:xid64", "0000:5d:00:xid74",
                       "0000:5d:00:xid79", "0000:86:00:xid92", "0000:86:00:xid94", "0000:86:00:xid95",
                       "0000:af:00:xid119", "0000:af:00:xid154", "0000:d8:00:xid79"}
    x79 = xs["0000:5d:00:xid79"]
    assert x79.status.value == "fail" and "RESTART_BM" in x79.hint and "GPU 2 (0000:5d:00)" in x79.summary
    assert "fallen off the bus" in x79.summary and x79.data["immediate"] == "RESTART_BM"
    assert xs["0000:18:00:xid13"].data["count"] == 2 and xs["0000:18:00:xid13"].status.value == "warn"
    assert "process: pid 41022 (python3)" in xs["0000:18:00:xid13"].evidence
    assert xs["0000:18:00:xid43"].status.value == "info" and xs["0000:3b:00:xid63"].status.value == "info"
    # Xid 154 names its recovery action; NVML's current one (GPU Reset) wins and decides
    x154 = xs["0000:af:00:xid154"]
    assert x154.status.value == "fail" and x154.data["recovery_action"] == "GPU Reset Required"
    assert "NVML gpu_recovery_action now: GPU Reset Required" in x154.evidence
    rec = [f for f in d.findings if f.id == "driver.recovery_action"]
    assert rec and all(f.status.value == "fail" for f in rec)
    assert d.exit_code == 2 and d.root_cause.id in ("driver.xid", "driver.recovery_action")


def test_xid_154_with_nvml_now_none_is_information(tmp_path):
    line = "NVRM: Xid (PCI:0000:af:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    dump = tmp_path / "kmsg"
    _kmsg_dump(dump, [line], [max(0.5, _uptime() - 3)])
    kl = read_kernel_log(LocalHost(), None, 5.0, kmsg=str(dump))
    d = diagnose(_facts_with(kl, "None"), only_layers={"driver"})
    (x,) = [f for f in d.findings if f.id == "driver.xid"]
    assert x.status.value == "info" and x.data["recovery_action"] == "None"


def test_window_keeps_only_recent_lines(tmp_path):
    up = _uptime()
    if up < 70:  # the old line (at 1.0 s) must lie more than the 60 s window back: wait, never skip
        time.sleep(70 - up)
        up = _uptime()
    lines = CORPUS.read_text().splitlines()[:2]
    dump = tmp_path / "kmsg"
    _kmsg_dump(dump, [lines[0], lines[1].replace(": 13,", ": 31,")], [1.0, up - 5])
    kl = read_kernel_log(LocalHost(), 60.0, 5.0, kmsg=str(dump))
    assert [x["code"] for x in kl["xids"]] == [31]
    everything = read_kernel_log(LocalHost(), None, 5.0, kmsg=str(dump))
    assert [x["code"] for x in everything["xids"]] == [13, 31]
    d = diagnose(_facts_with({**kl, "window_s": 60.0}), only_layers={"driver"})
    assert any("last 60 s" in e for f in d.findings if f.id == "driver.xid" for e in f.evidence)


def test_dmesg_format_is_parsed_and_windowed():
    text = ("[    1.000000] NVRM: loading NVIDIA UNIX Open Kernel Module\n"
            "[  100.500000] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, An uncorrectable double bit error (DBE)\n"
            "[ 5000.250000] NVRM: Xid (PCI:0000:3b:00): 63, pid=1, name=x, Row Remapper: New row marked\n")
    assert [r[0] for r in parse_dmesg(text, 5010.0, None)] == [100.5, 5000.25]
    assert [parse_line(r[1]).code for r in parse_dmesg(text, 5010.0, 60.0)] == [63]


def test_the_real_kernel_log_of_this_machine_is_read():
    needs.root()  # /dev/kmsg under dmesg_restrict
    kl = read_kernel_log(LocalHost(), None, 5.0)
    assert kl["source"] == "/dev/kmsg" and kl["scanned"] > 0 and kl["uptime"] > 0 and not kl["errors"]
    d = diagnose({"host": {}, "kernel_log": kl}, only_layers={"driver"})
    (x,) = [f for f in d.findings if f.id == "driver.xid"]
    assert x.status.value in ("ok", "info", "warn", "fail") and x.evidence[0].startswith("/dev/kmsg:")


class _OrdinaryUser(LocalHost):
    """Every command runs as nobody (setpriv): the kernel decides what an ordinary user may read."""

    def run(self, argv, timeout=None, input=None, env=None):
        return super().run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv], timeout, input, env)


def test_an_unreadable_kernel_log_is_explained_never_ok():
    needs.root()  # to become another user
    if not shutil.which("setpriv") or not Path("/usr/bin/python3").exists():
        needs.unavailable("needs setpriv (util-linux) and /usr/bin/python3 to run the probe as an ordinary user")
    if Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1":
        needs.unavailable("kernel.dmesg_restrict is 0 here: an ordinary user may read the kernel log "
                          "(Debian's kernels set it to 1)")
    host = _OrdinaryUser(python=["/usr/bin/python3"])
    kl = read_kernel_log(host, None, 5.0)
    assert kl["source"] is None and kl["errors"][0] == "/dev/kmsg → EPERM"
    assert "Operation not permitted" in kl["errors"][1]
    d = diagnose({"host": {"dmesg_restrict": 1}, "kernel_log": kl}, only_layers={"driver"})
    (x,) = [f for f in d.findings if f.id == "driver.xid"]
    assert x.status.value == "info" and x.summary.startswith("Could not read the kernel log")
    assert "dmesg_restrict = 1" in x.summary and "Xids were not checked" in x.summary


def test_a_snapshot_without_the_kernel_log_probe_has_no_xid_finding():
    from gpudoctor import snapshot
    from gpudoctor.target import snapshot_facts

    from .conftest import SNAPSHOTS

    facts = snapshot_facts(snapshot.load(str(SNAPSHOTS / "h200-healthy.json")))
    assert "kernel_log" not in facts and not [f for f in diagnose(facts).findings if f.id == "driver.xid"]


def test_driver_xid_is_registered_once():
    assert [c.id for c in all_checks()].count("driver.xid") == 1
    json.dumps(catalog())  # plain data
