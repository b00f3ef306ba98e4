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
