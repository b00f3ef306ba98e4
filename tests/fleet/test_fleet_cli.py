"""`gpudoctor check --all / --group / --parallel / --json / --prom` through the real CLI, against hosts that are
aliases of one real sshd on 127.0.0.1 (tests/sshd.py), plus one host whose port answers nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.sshd import free_port
from tests.childenv import pythonpath



def inventory(sshd, tmp_path) -> Path:
    dead = free_port()  # nothing listens here: connection refused, on loopback
    lines = ["hosts:"]
    for name, port, group in [("gpu01", sshd.port, "h200"), ("gpu02", sshd.port, "h200"),
                              ("gpu03", sshd.port, "spare"), ("gpu04", dead, "h200")]:
        lines += [f"  {name}:", f"    address: {sshd.address}", f"    port: {port}", f"    user: {sshd.user}",
                  f"    identity_file: {sshd.client_key}", f"    known_hosts: {sshd.known_hosts}",
                  "    connect_timeout: 5", f"    groups: [{group}]"]
    p = tmp_path / "inventory.yaml"
    p.write_text("\n".join(lines) + "\n")
    return p


def gpudoctor(*args, cwd):
    env = {**os.environ, "PYTHONPATH": pythonpath()}
    env.pop("GPUDOCTOR_INVENTORY", None)
    return subprocess.run([sys.executable, "-m", "gpudoctor", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=240)


def test_all_hosts_json_and_prom(sshd, tmp_path):
    inv = inventory(sshd, tmp_path)
    prom = tmp_path / "gpudoctor.prom"
    r = gpudoctor("check", "--all", "--inventory", str(inv), "--parallel", "4", "--json", "--prom", str(prom),
                  cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpudoctor.fleet/1" and doc["parallel"] == 4
    by = {h["host"]: h for h in doc["hosts"]}
    assert list(by) == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert by["gpu04"]["status"] == "unreachable" and "refused" in by["gpu04"]["error"]
    reached = [by[n] for n in ("gpu01", "gpu02", "gpu03")]
    for h in reached:  # each alias of the one machine was really checked, over SSH, to a full diagnosis
        assert h["check"]["schema"] == "gpudoctor.check/1" and h["check"]["host"] == h["host"]
        assert h["status"] == h["check"]["verdict"] and h["error"] is None
    assert len({json.dumps(h["root_cause"], sort_keys=True) for h in reached}) == 1  # same machine, same cause
    # the worst host decides, in Nagios order: fail (2) beats the unreachable host's unknown (3)
    assert r.returncode == doc["exit_code"] == (2 if any(h["status"] == "fail" for h in reached) else 3)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(prom.read_text()) for s in fam.samples}
    assert samples[("gpudoctor_host_up", (("host", "gpu04"),))] == 0
    assert samples[("gpudoctor_host_up", (("host", "gpu01"),))] == 1


def test_group_and_table(sshd, tmp_path):
    inv = inventory(sshd, tmp_path)
    r = gpudoctor("check", "--group", "spare", "--inventory", str(inv), cwd=tmp_path)
    assert "gpu03" in r.stdout and "gpu01" not in r.stdout and "summary: 1 " in r.stdout
    r = gpudoctor("check", "--group", "nope", "--inventory", str(inv), cwd=tmp_path)
    assert r.returncode == 3 and "no host is in group 'nope'" in r.stderr and r.stderr.count("\n") == 1
    r = gpudoctor("check", "--all", "--snapshot", "x.json", "--inventory", str(inv), cwd=tmp_path)
    assert r.returncode == 3 and "do not combine" in r.stderr
