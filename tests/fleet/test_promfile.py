"""Prometheus textfile output: valid exposition, one series per check, written atomically."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpudoctor.errors import HostUnreachable
from gpudoctor.fleet import check_fleet
from gpudoctor.integrations.promfile import render, write_prom

from fleet_helpers import replay_check


def samples(text):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def fleet():
    def check(name):
        if name == "ct9":
            raise HostUnreachable("timed out")
        return replay_check(name)

    return check_fleet(None, ["h200-uvm-blocked", "h200-healthy", "ct9"], parallel=3, check_fn=check,
                       clock=lambda: 1700000000.0)


def test_render_has_check_status_verdict_up_and_timestamps():
    s = samples(render(fleet().prom_records()))
    key = ("gpudoctor_check_status", (("check", "devices.node.major"), ("host", "h200-uvm-blocked"),
                                      ("subject", "/dev/nvidia-uvm")))
    assert s[key] == 2
    assert s[("gpudoctor_check_status", (("check", "cuda.init"), ("host", "h200-healthy"), ("subject", "")))] == 0
    assert s[("gpudoctor_host_status", (("host", "h200-uvm-blocked"),))] == 2
    assert s[("gpudoctor_host_status", (("host", "ct9"),))] == 3
    assert s[("gpudoctor_host_up", (("host", "ct9"),))] == 0
    assert s[("gpudoctor_host_up", (("host", "h200-healthy"),))] == 1
    assert s[("gpudoctor_last_run_timestamp_seconds", (("host", "ct9"),))] == 1700000000.0
    assert not any(k[0] == "gpudoctor_check_status" and ("host", "ct9") in k[1] for k in s)


def test_write_prom_is_atomic_and_readable(tmp_path: Path):
    target = tmp_path / "gpudoctor.prom"
    target.write_text("old\n")
    os.chmod(target, 0o600)
    write_prom(target, fleet().prom_records())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpudoctor.prom"]  # no temp file left behind
    assert oct(target.stat().st_mode & 0o777) == "0o644"  # node_exporter must read it
    assert samples(target.read_text())[("gpudoctor_host_up", (("host", "ct9"),))] == 0


def test_a_lone_surrogate_in_a_replayed_host_name_is_escaped_not_a_traceback(tmp_path):
    """A snapshot's JSON may carry "\\udc80" (not UTF-8) in its host name: `check --snapshot --prom` writes the file
    with the name escaped, exit as judged, no traceback (#47)."""
    import json
    import subprocess
    import sys

    from tests.childenv import pythonpath

    doc = json.loads((Path(__file__).parents[1] / "fixtures" / "snapshots" / "h200-healthy.json").read_text())
    doc["host"] = doc["context"]["name"] = "gpu\udc80x"
    snap = tmp_path / "s.json"
    snap.write_text(json.dumps(doc))  # ensure_ascii: the file is ASCII, "\udc80" escaped in it, as a tool may write
    prom = tmp_path / "out.prom"
    env = {**os.environ, "HOME": str(tmp_path), "GPUDOCTOR_INVENTORY": ""}
    env["PYTHONPATH"] = pythonpath(env=env)
    r = subprocess.run([sys.executable, "-m", "gpudoctor", "check", "--snapshot", str(snap), "--prom", str(prom)],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert "Traceback" not in r.stderr and r.returncode == 0, r.stderr
    s = samples(prom.read_text())
    assert s[("gpudoctor_host_up", (("host", "gpu\\udc80x"),))] == 1
    assert samples(render([{"host": "a\ud800", "status": "ok", "findings": []}]))[
        ("gpudoctor_host_up", (("host", "a\\ud800"),))] == 1
