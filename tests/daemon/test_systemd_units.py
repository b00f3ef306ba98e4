"""The shipped systemd units pass `systemd-analyze verify` and `systemd-analyze security` (<= 5.0), and their command
lines parse with the real CLI."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.needs import need

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "systemd"
INSTALLED = "/usr/local/bin/gpudoctor"


def read_unit(path: Path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#", ";"))
    cp.optionxform = str
    cp.read_string(path.read_text())
    return cp


@pytest.fixture
def unit_dir(tmp_path):
    """The units with ExecStart pointing at a real gpudoctor executable, plus a minimal sglang.service."""
    need("systemd-analyze")
    exe = tmp_path / "bin" / "gpudoctor"
    exe.parent.mkdir()
    exe.write_text(f"#!{sys.executable}\nfrom gpudoctor.cli import main\nmain()\n")  # the installed package
    exe.chmod(0o755)
    d = tmp_path / "units"
    (d / "sglang.service.d").mkdir(parents=True)
    for src in [*UNITS.glob("*.service"), UNITS / "examples" / "sglang.service.d" / "gpudoctor.conf"]:
        rel = src.relative_to(UNITS / "examples") if "examples" in src.parts else src.relative_to(UNITS)
        (d / rel).write_text(src.read_text().replace(INSTALLED, str(exe)))
    (d / "sglang.service").write_text("[Unit]\nDescription=SGLang server (test stand-in)\n\n[Service]\n"
                                     "ExecStart=/bin/sleep infinity\n\n[Install]\nWantedBy=multi-user.target\n")
    return d, exe


def test_systemd_analyze_verify_passes_cleanly(unit_dir):
    d, _ = unit_dir
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", "gpudoctor.service", "gpudoctor-gate.service",
                        "sglang.service"], cwd=d, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"})
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr


def test_verify_catches_a_broken_drop_in(unit_dir):
    """The verify test would notice: a drop-in pointing at a missing binary fails."""
    d, exe = unit_dir
    conf = d / "sglang.service.d" / "gpudoctor.conf"
    conf.write_text(conf.read_text().replace(str(exe), "/nonexistent/gpudoctor"))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", "sglang.service"], cwd=d, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "/nonexistent/gpudoctor" in r.stderr


def test_daemon_unit_is_notify_with_watchdog_and_keeps_what_remedies_need():
    svc = read_unit(UNITS / "gpudoctor.service")["Service"]
    assert svc["Type"] == "notify" and svc["Restart"] == "on-failure"
    assert int(svc["WatchdogSec"].rstrip("s")) >= 30
    assert svc["ExecReload"] == "/bin/kill -HUP $MAINPID"
    for forbidden in ("PrivateDevices", "ProtectKernelTunables", "DevicePolicy", "MemoryDenyWriteExecute", "UMask"):
        assert forbidden not in svc, f"{forbidden} would stop remedies"
    for unit in ("gpudoctor.service", "gpudoctor-gate.service"):  # MountAPIVFS: a fresh /proc, not the one checks judge
        s = read_unit(UNITS / unit)["Service"]
        assert "ProtectKernelTunables" not in s and "ProtectControlGroups" not in s and "MountAPIVFS" not in s, unit
    caps = set(svc["CapabilityBoundingSet"].split())
    assert {"CAP_MKNOD", "CAP_SYS_ADMIN", "CAP_FOWNER", "CAP_SYSLOG", "CAP_KILL"} <= caps
    assert "CAP_SYS_MODULE" not in caps and svc["ProtectKernelModules"] == "yes"  # PID 1 loads modules (#40)
    gate = read_unit(UNITS / "gpudoctor-gate.service")["Service"]
    assert gate["Type"] == "oneshot" and gate["RemainAfterExit"] == "yes"
    gcaps = set(gate["CapabilityBoundingSet"].split())
    assert not gcaps & {"CAP_SYS_MODULE", "CAP_MKNOD", "CAP_CHOWN", "CAP_FOWNER", "CAP_KILL"}  # it judges, never fixes
    assert {"CAP_SYSLOG", "CAP_SYS_ADMIN"} <= gcaps and gate["ProtectSystem"] == "strict"
    for name in ("gpudoctor.service", "gpudoctor-gate.service"):
        unit = read_unit(UNITS / name)["Unit"]
        assert "modprobe@nvidia_uvm.service" in unit["Wants"] and "modprobe@nvidia_uvm.service" in unit["After"]


MAX_EXPOSURE = 5.0


def exposure(d: Path, unit: str) -> float:
    r = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", unit], cwd=d,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "SYSTEMD_COLORS": "0"})
    m = re.search(rf"Overall exposure level for {re.escape(unit)}: (\d+\.\d+)", r.stdout)
    assert m, r.stdout[-2000:] + r.stderr
    return float(m.group(1))


@pytest.mark.parametrize("unit", ["gpudoctor.service", "gpudoctor-gate.service"])
def test_systemd_analyze_security_rates_each_shipped_unit_at_most_5(unit_dir, unit):
    """#40: the gate unit scored 8.6 EXPOSED and the daemon 6.1 MEDIUM; now 4.0 and 4.4, held at <= 5.0 (OK)."""
    d, _ = unit_dir
    assert exposure(d, unit) <= MAX_EXPOSURE
    # the measure can fail: the same unit without its [Service] hardening is EXPOSED
    bare = d / f"bare-{unit}"
    cp = read_unit(d / unit)
    keep = {"Type", "ExecStart", "ExecReload", "RemainAfterExit", "NotifyAccess"}
    bare.write_text("[Service]\n" + "".join(f"{k}={v}\n" for k, v in cp["Service"].items() if k in keep))
    assert exposure(d, bare.name) > 9.0


@pytest.mark.parametrize("unit, key", [("gpudoctor.service", "ExecStart"), ("gpudoctor-gate.service", "ExecStart"),
                                       ("examples/sglang.service.d/gpudoctor.conf", "ExecStartPre")])
def test_unit_command_lines_parse_with_the_real_cli(unit, key, tmp_path):
    line = read_unit(UNITS / unit)["Service"][key]
    argv = shlex.split(line.replace("${STATE_DIRECTORY}", str(tmp_path)))
    assert argv[0] == INSTALLED
    r = subprocess.run([sys.executable, "-m", "gpudoctor", *argv[1:], "--help"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
