"""#24 item 4: a kernel log that could not be read is never "no Xid" (no false OK from a sandbox).

Real: the kernel-log probe (gpudoctor/gather/kernel_log.py) as a subprocess on this machine, reading a regular empty
file (what systemd's ProtectKernelLogs=yes leaves at /dev/kmsg inside a unit), /dev/null (a character device that
gives 0 records, like an LXC container's /dev/kmsg bound to /dev/null) and this machine's real /dev/kmsg. Stand-in:
`dmesg`, a script first on PATH that fails, prints nothing or prints a line, so each fallback is seen. The same case
under the real systemd 252 unit is tests/systemd/test_units_under_systemd.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpudoctor.diagnose import diagnose
from gpudoctor.gather.kernel_log import read_kernel_log
from gpudoctor.host.local import LocalHost
from tests import needs


@pytest.fixture
def tmp_path(dev_tmp_path):
    """Device nodes are made here: a directory where they open as on /dev, whatever /tmp's mount (tests/devmount.py)."""
    return dev_tmp_path


XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


def _dmesg(tmp_path: Path, body: str) -> LocalHost:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    (d / "dmesg").write_text("#!/bin/sh\n" + body + "\n")
    (d / "dmesg").chmod(0o755)
    return LocalHost(path_prepend=[str(d)])


DENIED = "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1"


def _xid(kl: dict):
    d = diagnose({"host": {"dmesg_restrict": 1}, "kernel_log": kl}, only_layers={"driver"})
    fs = [f for f in d.findings if f.id == "driver.xid"]
    return fs


def test_an_empty_regular_file_at_kmsg_is_a_sandbox_never_ok(tmp_path):
    empty = tmp_path / "kmsg"
    empty.write_bytes(b"")
    kl = read_kernel_log(_dmesg(tmp_path, DENIED), None, 5.0, kmsg=str(empty), device=True)
    assert kl["source"] is None and kl["kind"] == "file" and kl["xids"] == []
    assert "an empty regular file, not the kernel's log device" in kl["errors"][0]
    assert "Operation not permitted" in kl["errors"][1]
    [f] = _xid(kl)
    assert f.status.value == "info" and f.status.value != "ok"
    assert f.summary.startswith("Could not read the kernel log") and "Xids were not checked" in f.summary
    assert "ProtectKernelLogs" in f.summary and f.data == {"read": False}


def test_a_regular_file_is_fine_where_a_dump_is_asked_for(tmp_path):
    """The same probe reads a saved kmsg dump (a regular file) when the caller says it is one."""
    dump = tmp_path / "kmsg"
    dump.write_text(f"4,1,1000000,-;{XID}\n")
    kl = read_kernel_log(LocalHost(), None, 5.0, kmsg=str(dump))
    assert kl["source"] == str(dump) and [x["code"] for x in kl["xids"]] == [79] and not kl["errors"]


def test_zero_records_from_a_character_device_is_not_a_clean_log(tmp_path):
    kl = read_kernel_log(_dmesg(tmp_path, "exit 0"), None, 5.0, kmsg="/dev/null", device=True)
    assert kl["kind"] == "char" and kl["scanned"] == 0 and kl["source"] is None
    assert kl["errors"][0] == "/dev/null → 0 records read, where this boot must have logged (a character device)"
    assert kl["errors"][1] == "dmesg → no output: the kernel log is not readable here"
    [f] = _xid(kl)
    assert f.status.value == "info" and "Xids were not checked" in f.summary


def test_when_kmsg_is_a_stand_in_dmesg_still_reads_the_log(tmp_path):
    host = _dmesg(tmp_path, f"echo '[  100.500000] {XID}'")
    kl = read_kernel_log(host, None, 5.0, kmsg="/dev/null", device=True)
    assert kl["source"] == "dmesg" and [x["code"] for x in kl["xids"]] == [79]
    fs = _xid(kl)
    assert [f.status.value for f in fs] == ["fail"]


def test_a_missing_kmsg_and_no_dmesg_is_unreadable(tmp_path):
    kl = read_kernel_log(_dmesg(tmp_path, "exit 127"), None, 5.0, kmsg=str(tmp_path / "absent"), device=True)
    assert kl["source"] is None and kl["errors"][0].endswith("→ ENOENT")
    [f] = _xid(kl)
    assert f.status.value != "ok" and "Xids were not checked" in f.summary


def test_the_real_kmsg_of_this_machine_is_a_character_device_with_records():
    needs.root()  # reading /dev/kmsg on this machine needs root (dmesg_restrict)
    kl = read_kernel_log(LocalHost(), None, 5.0)
    assert kl["kind"] is None and kl["scanned"] > 0 and kl["source"] == "/dev/kmsg" and not kl["errors"]
    [f] = _xid(kl)
    assert f.data.get("read") is True


def test_systemds_inaccessible_node_at_kmsg_is_named_a_sandbox(tmp_path):
    """ProtectKernelLogs=yes where systemd can make device nodes: /dev/kmsg is its c 0:0, mode 000 (ENXIO)."""
    needs.root()  # making a 0:0 character node needs root (CAP_MKNOD)
    node = tmp_path / "kmsg"
    os.mknod(node, 0o020000, os.makedev(0, 0))
    kl = read_kernel_log(_dmesg(tmp_path, DENIED), None, 5.0, kmsg=str(node), device=True)
    assert kl["source"] is None and kl["errors"][0].startswith(f"{node} → ENXIO: c 0:0, not the kernel's log device")
    [f] = _xid(kl)
    assert f.status.value == "info" and "ProtectKernelLogs=yes" in f.summary and "Xids were not checked" in f.summary
